package podtemplate

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/raysync/raysync/internal/names"
)

// Ray pods: the admission webhook's patch for a pod being created, and whether a pod carries the
// autoscaler's certificate (a pod is immutable: one that lacks it is recycled or reported).

// PatchOp is one RFC 6902 JSON Patch operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// PodPatch adds tc's entries to a pod (its spec and its autoscaler container), and returns them as
// operations that replace only the lists raysync changed, with every entry they held kept.
func PodPatch(pod map[string]any, tc Config, autoscaling bool) ([]PatchOp, error) {
	spec, err := objectAt(pod, false, "spec")
	if err != nil || spec == nil {
		return nil, fmt.Errorf("pod spec unreadable")
	}
	containers, err := namedList(spec, "containers")
	if err != nil {
		return nil, err
	}
	// The entries are edited in place: compare with deep copies, or a corrected entry compares equal.
	before := map[string]any{}
	for _, f := range []string{"imagePullSecrets", "volumes"} {
		before[f] = runtime.DeepCopyJSONValue(spec[f])
	}
	if _, err := pullEntries(spec, tc.PullSecrets, true); err != nil {
		return nil, err
	}
	var ops []PatchOp
	auto := slices.IndexFunc(containers, func(c any) bool { return c.(map[string]any)["name"] == AutoscalerContainer })
	if tc.TLS != nil && autoscaling && auto >= 0 {
		c := containers[auto].(map[string]any)
		mounts, env := runtime.DeepCopyJSONValue(c["volumeMounts"]), runtime.DeepCopyJSONValue(c["env"])
		if _, err := tlsEntries(spec, c, tc.TLS, true); err != nil {
			return nil, err
		}
		for f, old := range map[string]any{"volumeMounts": mounts, "env": env} {
			if !reflect.DeepEqual(old, c[f]) {
				ops = append(ops, PatchOp{Op: "add", Path: fmt.Sprintf("/spec/containers/%d/%s", auto, f), Value: c[f]})
			}
		}
	}
	for _, f := range []string{"imagePullSecrets", "volumes"} {
		if !reflect.DeepEqual(before[f], spec[f]) {
			ops = append(ops, PatchOp{Op: "add", Path: "/spec/" + f, Value: spec[f]})
		}
	}
	slices.SortFunc(ops, func(a, b PatchOp) int { return strings.Compare(a.Path, b.Path) })
	return ops, nil
}

func isAutoscaler(c corev1.Container) bool { return c.Name == AutoscalerContainer }

// PodHasTLS reports whether a pod carries every entry raysync owns for the autoscaler's certificate:
// the volume of the right Secret, the autoscaler's read-only mount at the mount path (no subPath),
// and each of its env entries with exactly raysync's value.
func PodHasTLS(p *corev1.Pod, t *TLS) bool {
	vol := slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == names.TLSVolumeName && v.Secret != nil && v.Secret.SecretName == t.SecretName
	})
	i := slices.IndexFunc(p.Spec.Containers, isAutoscaler)
	if !vol || i < 0 {
		return false
	}
	c := p.Spec.Containers[i]
	mount := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == names.TLSVolumeName && m.MountPath == t.MountPath && m.ReadOnly && m.SubPath == "" && m.SubPathExpr == ""
	})
	return mount && !slices.ContainsFunc(t.envEntries(), func(want envEntry) bool {
		i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == want.name })
		return i < 0 || c.Env[i].Value != want.value || c.Env[i].ValueFrom != nil
	})
}
