package projection

import (
	"fmt"
	"path"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// What raysync adds to RayCluster pod templates.
const (
	TLSVolumeName           = "raysync-autoscaler-tls"
	EnvClientCertPath       = "RAY_KUBERAY_CLIENT_CERT_PATH"
	EnvClientKeyPath        = "RAY_KUBERAY_CLIENT_KEY_PATH"
	EnvCACertPath           = "RAY_KUBERAY_CA_CERT_PATH"
	EnvServiceHost          = "KUBERNETES_SERVICE_HOST"
	EnvServicePortHTTPS     = "KUBERNETES_SERVICE_PORT_HTTPS"
	AutoscalerContainer     = "autoscaler"
	DefaultTLSMountPath     = "/etc/raysync/autoscaler-tls"
	upgradeStrategyRecreate = "Recreate"
)

// TemplateConfig is what every in-scope cluster's templates must carry.
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
	return v == upgradeStrategyRecreate
}

// desiredTemplates returns a copy of rc whose templates carry raysync's entries, and whether that
// differs from rc. Only raysync's entries change: existing imagePullSecrets, volumes, mounts and env
// are kept, entries are never duplicated. Fields of the wrong type are an error, never a panic.
func desiredTemplates(rc *unstructured.Unstructured, cfg TemplateConfig) (*unstructured.Unstructured, bool, error) {
	out := rc.DeepCopy()
	changed := false
	var podSpecs []map[string]any
	head, err := objectAt(out.Object, "spec", "headGroupSpec", "template", "spec")
	if err != nil {
		return nil, false, err
	}
	podSpecs = append(podSpecs, head)
	workers, found, err := unstructured.NestedFieldNoCopy(out.Object, "spec", "workerGroupSpecs")
	if err != nil {
		return nil, false, fmt.Errorf("spec.workerGroupSpecs: %w", err)
	}
	if found && workers != nil {
		list, ok := workers.([]any)
		if !ok {
			return nil, false, fmt.Errorf("spec.workerGroupSpecs is not a list")
		}
		for i, w := range list {
			wm, ok := w.(map[string]any)
			if !ok {
				return nil, false, fmt.Errorf("spec.workerGroupSpecs[%d] is not an object", i)
			}
			ps, err := objectAt(wm, "template", "spec")
			if err != nil {
				return nil, false, fmt.Errorf("spec.workerGroupSpecs[%d].%w", i, err)
			}
			podSpecs = append(podSpecs, ps)
		}
	}
	for _, ps := range podSpecs {
		for _, name := range cfg.PullSecrets {
			c, err := ensureNamedEntry(ps, "imagePullSecrets", name, map[string]any{"name": name}, nil)
			if err != nil {
				return nil, false, err
			}
			changed = changed || c
		}
	}
	if cfg.TLS != nil && Autoscaling(out) {
		vol := map[string]any{"name": TLSVolumeName, "secret": map[string]any{"secretName": cfg.TLS.SecretName}}
		c, err := ensureNamedEntry(head, "volumes", TLSVolumeName, vol, func(cur map[string]any) bool {
			s, _, _ := unstructured.NestedString(cur, "secret", "secretName")
			return s == cfg.TLS.SecretName
		})
		if err != nil {
			return nil, false, err
		}
		changed = changed || c
		opts, err := objectAt(out.Object, "spec", "autoscalerOptions")
		if err != nil {
			return nil, false, err
		}
		mount := map[string]any{"name": TLSVolumeName, "mountPath": cfg.TLS.MountPath, "readOnly": true}
		c, err = ensureNamedEntry(opts, "volumeMounts", TLSVolumeName, mount, func(cur map[string]any) bool {
			p, _, _ := unstructured.NestedString(cur, "mountPath")
			ro, _, _ := unstructured.NestedBool(cur, "readOnly")
			_, sub := cur["subPath"]
			return p == cfg.TLS.MountPath && ro && !sub
		})
		if err != nil {
			return nil, false, err
		}
		changed = changed || c
		for _, e := range cfg.TLS.env() {
			want := map[string]any{"name": e.Name, "value": e.Value}
			c, err := ensureNamedEntry(opts, "env", e.Name, want, func(cur map[string]any) bool {
				v, ok := cur["value"].(string)
				_, from := cur["valueFrom"]
				return ok && v == e.Value && !from
			})
			if err != nil {
				return nil, false, err
			}
			changed = changed || c
		}
	}
	return out, changed, nil
}

// ensureNamedEntry makes list field of obj contain an entry named name: appended when absent,
// replaced when ok (nil: any entry with that name is fine) rejects it. Reports whether it changed.
func ensureNamedEntry(obj map[string]any, field, name string, want map[string]any, ok func(map[string]any) bool) (bool, error) {
	raw, present := obj[field]
	var list []any
	if present && raw != nil {
		l, isList := raw.([]any)
		if !isList {
			return false, fmt.Errorf("%s is not a list", field)
		}
		list = l
	}
	for i, e := range list {
		m, isMap := e.(map[string]any)
		if !isMap {
			return false, fmt.Errorf("%s[%d] is not an object", field, i)
		}
		if m["name"] != name {
			continue
		}
		if ok == nil || ok(m) {
			return false, nil
		}
		list[i] = want
		obj[field] = list
		return true, nil
	}
	obj[field] = append(list, want)
	return true, nil
}

// objectAt returns the object at path, creating empty objects along the way.
func objectAt(obj map[string]any, fields ...string) (map[string]any, error) {
	cur := obj
	for i, f := range fields {
		next, ok := cur[f]
		if !ok || next == nil {
			m := map[string]any{}
			cur[f] = m
			cur = m
			continue
		}
		m, isMap := next.(map[string]any)
		if !isMap {
			return nil, fmt.Errorf("%s is not an object", joinPath(fields[:i+1]))
		}
		cur = m
	}
	return cur, nil
}

func joinPath(p []string) string {
	s := ""
	for i, f := range p {
		if i > 0 {
			s += "."
		}
		s += f
	}
	return s
}

// podMissing lists what a Ray pod lacks of raysync's entries: "pull_secret" and/or "autoscaler_tls".
func podMissing(p *corev1.Pod, cfg TemplateConfig, autoscaling bool) []string {
	var missing []string
	have := map[string]bool{}
	for _, r := range p.Spec.ImagePullSecrets {
		have[r.Name] = true
	}
	for _, n := range cfg.PullSecrets {
		if !have[n] {
			missing = append(missing, ReasonPullSecret)
			break
		}
	}
	if cfg.TLS != nil && autoscaling && hasContainer(p, AutoscalerContainer) && !podHasTLS(p, cfg.TLS) {
		missing = append(missing, ReasonAutoscalerTLS)
	}
	return missing
}

func hasContainer(p *corev1.Pod, name string) bool {
	for _, c := range p.Spec.Containers {
		if c.Name == name {
			return true
		}
	}
	return false
}

func podHasTLS(p *corev1.Pod, t *TLSTemplate) bool {
	vol := false
	for _, v := range p.Spec.Volumes {
		if v.Name == TLSVolumeName && v.Secret != nil && v.Secret.SecretName == t.SecretName {
			vol = true
		}
	}
	if !vol {
		return false
	}
	for _, c := range p.Spec.Containers {
		if c.Name != AutoscalerContainer {
			continue
		}
		for _, e := range c.Env {
			if e.Name == EnvClientCertPath && e.Value == path.Join(t.MountPath, TLSCertKey) {
				return true
			}
		}
	}
	return false
}

// Stale reasons, as in raysync_stale_pods{reason} and raysync_pods_recycled_total{reason}.
const (
	ReasonToken         = "token"
	ReasonPullSecret    = "pull_secret"
	ReasonAutoscalerTLS = "autoscaler_tls"
)

// podStarted reports whether any container of the pod has started (running or terminated).
func podStarted(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if !containerStartedAt(cs).IsZero() || cs.State.Running != nil || cs.State.Terminated != nil {
			return true
		}
	}
	return false
}

// recyclable: a Pending pod whose containers never started (unscheduled, ContainerCreating,
// ErrImagePull, ImagePullBackOff) can be deleted safely so KubeRay recreates it from the fixed template.
func recyclable(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && (p.Status.Phase == corev1.PodPending || p.Status.Phase == "") && !podStarted(p)
}
