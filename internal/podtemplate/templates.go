// Package podtemplate puts raysync's entries (pull secrets, the autoscaler's client certificate) into a
// RayCluster's pod templates and into Ray pods being created, and says which are missing. It reads and
// edits the objects as unstructured data, never mutating what it was given.
package podtemplate

import (
	"encoding/json"
	"path"
	"strconv"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/validate"
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

// Config is what a cluster's templates must carry.
type Config struct {
	// PullSecrets are Secret names (in the cluster's namespace) every Ray pod lists in imagePullSecrets.
	PullSecrets []string
	// TLS, when set, mounts the autoscaler's client certificate (only on autoscaling clusters).
	TLS *TLS
}

// TLS describes the autoscaler client-TLS wiring.
type TLS struct {
	SecretName string // the copy in the cluster's namespace
	MountPath  string
	HasCA      bool
	APIServer  *validate.APIServer

	entries []envEntry // envEntries(), computed once (see Prepared)
}

// Prepared returns t with what every decision reads computed once: a template shared by many.
func (t TLS) Prepared() *TLS {
	t.entries = t.envEntries()
	return &t
}

func (t *TLS) envEntries() []envEntry {
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
func (t *TLS) env() []corev1.EnvVar {
	env := []corev1.EnvVar{
		{Name: EnvClientCertPath, Value: path.Join(t.MountPath, validate.TLSCertKey)},
		{Name: EnvClientKeyPath, Value: path.Join(t.MountPath, validate.TLSKeyKey)},
	}
	if t.HasCA {
		env = append(env, corev1.EnvVar{Name: EnvCACertPath, Value: path.Join(t.MountPath, validate.TLSCAKey)})
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

// Missing says which of raysync's template entries are missing or wrong.
type Missing struct{ Pull, TLS bool }

// Any reports whether anything is missing.
func (d Missing) Any() bool { return d.Pull || d.TLS }

// Drift checks rc's templates against cfg without copying or changing anything: what a
// scrape and most reconciles need. Fields of the wrong type are an error, never a panic.
func Drift(rc *unstructured.Unstructured, cfg Config) (Missing, error) {
	return templateEntries(rc.Object, cfg, false)
}

// Desired returns rc with raysync's entries in its templates (a copy; rc when nothing is
// missing) and whether that differs from rc. Only raysync's entries change: existing
// imagePullSecrets, volumes, mounts and env are kept, and entries are never duplicated.
func Desired(rc *unstructured.Unstructured, cfg Config) (*unstructured.Unstructured, bool, error) {
	d, err := templateEntries(rc.Object, cfg, false)
	if err != nil || !d.Any() {
		return rc, false, err
	}
	out := rc.DeepCopy()
	_, err = templateEntries(out.Object, cfg, true)
	return out, true, err
}

// MergePatch is the JSON merge patch from rc to desired, with rc's resourceVersion as precondition.
func MergePatch(rc, desired *unstructured.Unstructured) ([]byte, error) {
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
func templateEntries(obj map[string]any, cfg Config, mutate bool) (Missing, error) {
	var d Missing
	specs, err := podSpecs(obj, mutate)
	if err != nil {
		return d, err
	}
	for _, ps := range specs {
		c, err := pullEntries(ps, cfg.PullSecrets, mutate)
		if err != nil {
			return d, err
		}
		d.Pull = d.Pull || c
	}
	autoscaling, _, _ := unstructured.NestedBool(obj, "spec", "enableInTreeAutoscaling")
	if cfg.TLS == nil || !autoscaling {
		return d, nil
	}
	opts, err := objectAt(obj, mutate, "spec", "autoscalerOptions")
	if err != nil {
		return d, err
	}
	d.TLS, err = tlsEntries(specs[0], opts, cfg.TLS, mutate)
	return d, err
}

// pullEntries: the pod spec lists every pull secret in imagePullSecrets.
func pullEntries(spec map[string]any, pullSecrets []string, mutate bool) (bool, error) {
	changed := false
	for _, name := range pullSecrets {
		c, err := ensureNamedEntry(spec, "imagePullSecrets", name, func() map[string]any { return map[string]any{"name": name} }, nil, mutate)
		if err != nil {
			return changed, err
		}
		changed = changed || c
	}
	return changed, nil
}

// tlsEntries: the pod spec has the certificate volume, and the autoscaler (its container, or
// spec.autoscalerOptions in a template) mounts it read-only and has the env that points Ray at it.
func tlsEntries(spec, autoscaler map[string]any, t *TLS, mutate bool) (bool, error) {
	vol := func() map[string]any {
		return map[string]any{"name": names.TLSVolumeName, "secret": map[string]any{"secretName": t.SecretName}}
	}
	changed, err := ensureNamedEntry(spec, "volumes", names.TLSVolumeName, vol, func(cur map[string]any) bool {
		s, _, _ := unstructured.NestedString(cur, "secret", "secretName")
		return s == t.SecretName
	}, mutate)
	if err != nil {
		return changed, err
	}
	mount := func() map[string]any {
		return map[string]any{"name": names.TLSVolumeName, "mountPath": t.MountPath, "readOnly": true}
	}
	c, err := ensureNamedEntry(autoscaler, "volumeMounts", names.TLSVolumeName, mount, func(cur map[string]any) bool {
		p, _, _ := unstructured.NestedString(cur, "mountPath")
		ro, _, _ := unstructured.NestedBool(cur, "readOnly")
		_, sub := cur["subPath"] // a subPath mount never sees a renewed certificate
		return p == t.MountPath && ro && !sub
	}, mutate)
	if err != nil {
		return changed, err
	}
	changed = changed || c
	c, err = ensureEntries(autoscaler, "env", t.envEntries(), mutate)
	return changed || c, err
}

// SecretRefs lists the Secret names a cluster's templates reference in imagePullSecrets (head
// and workers) or head volumes, tolerating malformed fields.
func SecretRefs(rc *unstructured.Unstructured) []string {
	var refs []string
	for i, ps := range podSpecsOf(rc.Object) {
		for _, e := range listOf(ps, "imagePullSecrets") {
			if n, ok := e["name"].(string); ok {
				refs = append(refs, n)
			}
		}
		if i > 0 {
			continue // volumes: raysync mounts the certificate in the head only
		}
		for _, e := range listOf(ps, "volumes") {
			if sec, ok := e["secret"].(map[string]any); ok {
				if n, ok := sec["secretName"].(string); ok {
					refs = append(refs, n)
				}
			}
		}
	}
	return refs
}
