package projection

import (
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/names"
)

// Ray's autoscaler reads these (seed 001; kuberay-facts.md), and where raysync mounts the certificate.
const (
	EnvClientCertPath   = "RAY_KUBERAY_CLIENT_CERT_PATH"
	EnvClientKeyPath    = "RAY_KUBERAY_CLIENT_KEY_PATH"
	EnvCACertPath       = "RAY_KUBERAY_CA_CERT_PATH"
	EnvServiceHost      = "KUBERNETES_SERVICE_HOST"
	EnvServicePortHTTPS = "KUBERNETES_SERVICE_PORT_HTTPS"
	AutoscalerContainer = "autoscaler"
	DefaultTLSMountPath = "/etc/raysync/autoscaler-tls"
)

// TemplateConfig is what a cluster's templates must carry.
type TemplateConfig struct {
	// PullSecrets are Secret names (in the cluster's namespace) every Ray pod lists in imagePullSecrets.
	PullSecrets []string
	// TLS, when set, mounts the autoscaler's client certificate (only on autoscaling clusters).
	TLS *TLSTemplate
}

// TLSTemplate describes the autoscaler client-TLS wiring.
type TLSTemplate struct {
	SecretName string // the copy in the cluster's namespace
	MountPath  string
	HasCA      bool
	APIServer  *APIServer

	entries  []envEntry // envEntries(), computed once (see prepared)
	certPath string
}

// prepared returns t with what every decision reads computed once: a template shared by many.
func (t TLSTemplate) prepared() *TLSTemplate {
	t.entries = t.envEntries()
	t.certPath = path.Join(t.MountPath, TLSCertKey)
	return &t
}

func (t *TLSTemplate) envEntries() []envEntry {
	if t.entries != nil {
		return t.entries
	}
	var out []envEntry
	for _, e := range t.env() {
		out = append(out, envEntry{e.Name, e.Value})
	}
	return out
}

// env is the autoscaler environment raysync sets, in a stable order.
func (t *TLSTemplate) env() []corev1.EnvVar {
	env := []corev1.EnvVar{
		{Name: EnvClientCertPath, Value: path.Join(t.MountPath, TLSCertKey)},
		{Name: EnvClientKeyPath, Value: path.Join(t.MountPath, TLSKeyKey)},
	}
	if t.HasCA {
		env = append(env, corev1.EnvVar{Name: EnvCACertPath, Value: path.Join(t.MountPath, TLSCAKey)})
	}
	if t.APIServer != nil {
		env = append(env,
			corev1.EnvVar{Name: EnvServiceHost, Value: t.APIServer.Host},
			corev1.EnvVar{Name: EnvServicePortHTTPS, Value: strconv.Itoa(t.APIServer.Port)})
	}
	return env
}

// Autoscaling reports spec.enableInTreeAutoscaling.
func Autoscaling(rc *unstructured.Unstructured) bool {
	v, _, _ := unstructured.NestedBool(rc.Object, "spec", "enableInTreeAutoscaling")
	return v
}

// RecreateStrategy reports spec.upgradeStrategy.type: Recreate (KubeRay v1.6+ deletes every pod when
// the spec hash changes, templates included).
func RecreateStrategy(rc *unstructured.Unstructured) bool {
	v, _, _ := unstructured.NestedString(rc.Object, "spec", "upgradeStrategy", "type")
	return v == "Recreate"
}

// drift says which of raysync's template entries are missing or wrong.
type drift struct{ pull, tls bool }

func (d drift) any() bool { return d.pull || d.tls }

// templateDrift checks rc's templates against cfg without copying or changing anything: what a
// scrape and most reconciles need. Fields of the wrong type are an error, never a panic.
func templateDrift(rc *unstructured.Unstructured, cfg TemplateConfig) (drift, error) {
	return templateEntries(rc.Object, cfg, false)
}

// desiredTemplates returns rc with raysync's entries in its templates (a copy; rc when nothing is
// missing) and whether that differs from rc. Only raysync's entries change: existing
// imagePullSecrets, volumes, mounts and env are kept, and entries are never duplicated.
func desiredTemplates(rc *unstructured.Unstructured, cfg TemplateConfig) (*unstructured.Unstructured, bool, error) {
	d, err := templateEntries(rc.Object, cfg, false)
	if err != nil || !d.any() {
		return rc, false, err
	}
	out := rc.DeepCopy()
	_, err = templateEntries(out.Object, cfg, true)
	return out, true, err
}

// templatePatch is the JSON merge patch from rc to desired, with rc's resourceVersion as precondition.
func templatePatch(rc, desired *unstructured.Unstructured) ([]byte, error) {
	before, err := json.Marshal(rc.Object)
	if err != nil {
		return nil, err
	}
	after, err := json.Marshal(desired.Object)
	if err != nil {
		return nil, err
	}
	patch, err := jsonpatch.CreateMergePatch(before, after)
	if err != nil {
		return nil, err
	}
	var p map[string]any
	if err := json.Unmarshal(patch, &p); err != nil {
		return nil, err
	}
	p["metadata"] = map[string]any{"resourceVersion": rc.GetResourceVersion()}
	return json.Marshal(p)
}

// templateEntries walks obj's pod templates and reports what of cfg is missing; with mutate it also
// puts the entries in place (only ever on a copy).
func templateEntries(obj map[string]any, cfg TemplateConfig, mutate bool) (drift, error) {
	var d drift
	specs, err := podSpecs(obj, mutate)
	if err != nil {
		return d, err
	}
	for _, ps := range specs {
		for _, name := range cfg.PullSecrets {
			c, err := ensureNamedEntry(ps, "imagePullSecrets", name, func() map[string]any { return map[string]any{"name": name} }, nil, mutate)
			if err != nil {
				return d, err
			}
			d.pull = d.pull || c
		}
	}
	autoscaling, _, _ := unstructured.NestedBool(obj, "spec", "enableInTreeAutoscaling")
	if cfg.TLS == nil || !autoscaling {
		return d, nil
	}
	t := cfg.TLS
	vol := func() map[string]any {
		return map[string]any{"name": names.TLSVolumeName, "secret": map[string]any{"secretName": t.SecretName}}
	}
	c, err := ensureNamedEntry(specs[0], "volumes", names.TLSVolumeName, vol, func(cur map[string]any) bool {
		s, _, _ := unstructured.NestedString(cur, "secret", "secretName")
		return s == t.SecretName
	}, mutate)
	if err != nil {
		return d, err
	}
	d.tls = c
	opts, err := objectAt(obj, mutate, "spec", "autoscalerOptions")
	if err != nil {
		return d, err
	}
	mount := func() map[string]any {
		return map[string]any{"name": names.TLSVolumeName, "mountPath": t.MountPath, "readOnly": true}
	}
	c, err = ensureNamedEntry(opts, "volumeMounts", names.TLSVolumeName, mount, func(cur map[string]any) bool {
		p, _, _ := unstructured.NestedString(cur, "mountPath")
		ro, _, _ := unstructured.NestedBool(cur, "readOnly")
		_, sub := cur["subPath"] // a subPath mount never sees a renewed certificate
		return p == t.MountPath && ro && !sub
	}, mutate)
	if err != nil {
		return d, err
	}
	d.tls = d.tls || c
	c, err = ensureEntries(opts, "env", t.envEntries(), mutate)
	d.tls = d.tls || c
	return d, err
}

// envEntry is one environment variable raysync wants in a named list.
type envEntry struct{ name, value string }

// ensureEntries reports whether env list field of obj lacks any of wants with exactly their value
// (a valueFrom does not count), in one pass over the list: autoscaler env lists can be long. With
// mutate it appends what is missing and replaces what is wrong.
func ensureEntries(obj map[string]any, field string, wants []envEntry, mutate bool) (bool, error) {
	list, err := namedList(obj, field)
	if err != nil {
		return false, err
	}
	const ok, wrong = 1, 2
	var buf [8]uint8
	state := buf[:0]
	if len(wants) > len(buf) {
		state = make([]uint8, 0, len(wants))
	}
	state = state[:len(wants)]
	for i, e := range list {
		m := e.(map[string]any) // namedList checked
		name, _ := m["name"].(string)
		for j, w := range wants {
			if w.name != name || state[j] != 0 {
				continue
			}
			v, isString := m["value"].(string)
			_, from := m["valueFrom"]
			if isString && v == w.value && !from {
				state[j] = ok
			} else {
				state[j] = wrong
				if mutate {
					list[i] = map[string]any{"name": w.name, "value": w.value}
				}
			}
			break
		}
	}
	changed := false
	for j, w := range wants {
		if state[j] == ok {
			continue
		}
		changed = true
		if state[j] == 0 && mutate {
			list = append(list, map[string]any{"name": w.name, "value": w.value})
		}
	}
	if mutate && changed {
		obj[field] = list
	}
	return changed, nil
}

// namedList returns list field of obj, checking that it is a list of objects.
func namedList(obj map[string]any, field string) ([]any, error) {
	raw := obj[field]
	if raw == nil {
		return nil, nil
	}
	list, isList := raw.([]any)
	if !isList {
		return nil, fmt.Errorf("%s is not a list", field)
	}
	for i, e := range list {
		if _, isMap := e.(map[string]any); !isMap {
			return nil, fmt.Errorf("%s[%d] is not an object", field, i)
		}
	}
	return list, nil
}

// podSpecs returns the head's pod spec, then each worker group's (nil maps where absent and !mutate).
func podSpecs(obj map[string]any, mutate bool) ([]map[string]any, error) {
	head, err := objectAt(obj, mutate, "spec", "headGroupSpec", "template", "spec")
	if err != nil {
		return nil, err
	}
	workers, found, err := unstructured.NestedFieldNoCopy(obj, "spec", "workerGroupSpecs")
	if err != nil {
		return nil, fmt.Errorf("spec.workerGroupSpecs: %w", err)
	}
	if !found || workers == nil {
		return []map[string]any{head}, nil
	}
	list, ok := workers.([]any)
	if !ok {
		return nil, fmt.Errorf("spec.workerGroupSpecs is not a list")
	}
	specs := append(make([]map[string]any, 0, 1+len(list)), head)
	for i, w := range list {
		wm, ok := w.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("spec.workerGroupSpecs[%d] is not an object", i)
		}
		ps, err := objectAt(wm, mutate, "template", "spec")
		if err != nil {
			return nil, fmt.Errorf("spec.workerGroupSpecs[%d].%w", i, err)
		}
		specs = append(specs, ps)
	}
	return specs, nil
}

// podSpecsOf is podSpecs for reading only, skipping whatever is malformed.
func podSpecsOf(obj map[string]any) []map[string]any {
	specs, err := podSpecs(obj, false)
	if err != nil {
		return nil
	}
	return specs
}

// listOf returns the objects in a list field, skipping entries that are not objects.
func listOf(obj map[string]any, field string) []map[string]any {
	list, _ := obj[field].([]any)
	out := make([]map[string]any, 0, len(list))
	for _, e := range list {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// ensureNamedEntry reports whether list field of obj lacks an entry named name that ok accepts
// (nil: any entry with that name is fine). With mutate it appends want(), or replaces the rejected entry.
func ensureNamedEntry(obj map[string]any, field, name string, want func() map[string]any, ok func(map[string]any) bool, mutate bool) (bool, error) {
	list, err := namedList(obj, field)
	if err != nil {
		return false, err
	}
	for i, e := range list {
		m := e.(map[string]any) // namedList checked
		if m["name"] != name {
			continue
		}
		if ok == nil || ok(m) {
			return false, nil
		}
		if mutate {
			list[i] = want()
		}
		return true, nil
	}
	if mutate {
		obj[field] = append(list, want())
	}
	return true, nil
}

// objectAt returns the object at path; with mutate it creates empty objects along the way, without
// it a missing object is nil (reads of a nil map are empty).
func objectAt(obj map[string]any, mutate bool, fields ...string) (map[string]any, error) {
	cur := obj
	for i, f := range fields {
		next, ok := cur[f]
		if !ok || next == nil {
			if !mutate {
				return nil, nil
			}
			m := map[string]any{}
			cur[f] = m
			cur = m
			continue
		}
		m, isMap := next.(map[string]any)
		if !isMap {
			return nil, fmt.Errorf("%s is not an object", strings.Join(fields[:i+1], "."))
		}
		cur = m
	}
	return cur, nil
}
