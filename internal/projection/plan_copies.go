package projection

import (
	"bytes"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
	"github.com/raysync/raysync/internal/validate"
)

// Managed copies: a pod source (pull secret, client certificate) in another namespace than the
// cluster is copied, under its own name, into the cluster's namespace; a referenced-mode token target
// is a copy of the token. A copy is raysync's when it carries ManagedByLabel, whatever source it was
// copied from: it follows the current source, and is pruned when nothing references it.

// managedCopyOf reports whether s is a raysync-managed copy of the given kind.
func managedCopyOf(s *corev1.Secret, kind names.Kind) bool {
	k, ok := names.ParseKind(s.Annotations[names.KindAnnotation])
	return s.Labels[names.ManagedByLabel] == names.ManagedByValue && ok && k == kind
}

// copyMetaCurrent reports whether a copy's annotations name the current source and kind (as written today).
func copyMetaCurrent(s *corev1.Secret, source types.NamespacedName, kind names.Kind) bool {
	return s.Annotations[names.SourceAnnotation] == source.String() && s.Annotations[names.KindAnnotation] == string(kind)
}

// withCopyMeta returns a copy of s whose annotations name the current source and kind.
func withCopyMeta(s *corev1.Secret, source types.NamespacedName, kind names.Kind) *corev1.Secret {
	out := s.DeepCopy()
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[names.SourceAnnotation] = source.String()
	out.Annotations[names.KindAnnotation] = string(kind)
	return out
}

// copied reports whether a copy carries key: everything for a pull secret, only the TLS keys for a
// client certificate (never anything else its source holds).
func copied(kind names.Kind, key string) bool {
	return kind != names.KindAutoscalerTLS || slices.Contains([]string{validate.TLSCertKey, validate.TLSKeyKey, validate.TLSCAKey}, key)
}

// copyData is what a managed copy of src holds.
func copyData(src *corev1.Secret, kind names.Kind) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range src.Data {
		if copied(kind, k) {
			out[k] = bytes.Clone(v)
		}
	}
	return out
}

// copyDataCurrent reports whether cur's data equals copyData(src, kind), without building it.
func copyDataCurrent(cur, src *corev1.Secret, kind names.Kind) bool {
	n := 0
	for k, v := range src.Data {
		if !copied(kind, k) {
			continue
		}
		if w, ok := cur.Data[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
		n++
	}
	return n == len(cur.Data)
}

func desiredPodSourceCopy(ns string, src source) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: src.name.Name, Namespace: ns,
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.SourceAnnotation: src.name.String(), names.KindAnnotation: string(src.kind)}},
		Type: src.secret.Type, Data: copyData(src.secret, src.kind),
	}
}

// planCopy decides the copy of one valid pod source in the cluster's namespace. usable means the
// templates may reference it (it exists or is created by this plan, and raysync owns it).
func planCopy(in *ClusterInput, src source, p *ClusterPlan) (state string, usable bool) {
	ns := in.Cluster.GetNamespace()
	if ns == src.name.Namespace {
		return names.StateInSync, true // the source itself is in the cluster's namespace: no copy
	}
	cur := in.copyNamed(src.name.Name)
	switch {
	case cur == nil && !in.Foreign[src.name.Name]:
		p.Actions = append(p.Actions, CreateSecret{Secret: desiredPodSourceCopy(ns, src)})
		return names.StateOutOfSync, true
	case cur == nil || !managedCopyOf(cur, src.kind):
		p.Refused++
		p.warnOnce(in, names.ReasonTargetNotOwned, fmt.Sprintf(
			"Secret %s already exists and is not managed by raysync; not copying %s into it and not using it", src.name.Name, src.name))
		return names.StateNotOwned, false
	case cur.Type != src.secret.Type:
		p.Actions = append(p.Actions, ReplaceSecret{Old: cur, New: desiredPodSourceCopy(ns, src)})
		return names.StateOutOfSync, true
	case !copyDataCurrent(cur, src.secret, src.kind) || !copyMetaCurrent(cur, src.name, src.kind):
		upd := withCopyMeta(cur, src.name, src.kind)
		upd.Data = copyData(src.secret, src.kind)
		p.Actions = append(p.Actions, UpdateSecret{Secret: upd})
		return names.StateOutOfSync, true
	}
	return names.StateInSync, true
}

// planPrune deletes the managed copies in one namespace that no RayCluster there references:
// clusters outside the selector, skipped ones and ones being deleted count too. A copy is referenced
// by name from spec.authOptions.secretName, a template's imagePullSecrets or a head volume, or will be
// by a managed cluster's templates. When any cluster's spec cannot be read, nothing is deleted.
func planPrune(clusters []*unstructured.Unstructured, copies []*corev1.Secret, cfg Config) []Action {
	referenced := map[string]bool{}
	for _, rc := range clusters {
		a := kuberay.ReadAuthOptions(rc)
		if a.Err != nil {
			return nil
		}
		if a.SecretName != "" {
			referenced[a.SecretName] = true
		}
		for _, n := range podtemplate.SecretRefs(rc) {
			referenced[n] = true
		}
		if cfg.managed(rc) { // its templates may not be patched yet
			for _, src := range cfg.Pods.PullSecrets {
				referenced[src.Name] = true
			}
			if src := cfg.Pods.AutoscalerTLS; src != nil && podtemplate.Autoscaling(rc) {
				referenced[src.Name] = true
			}
		}
	}
	var actions []Action
	for _, s := range copies {
		_, isCopy := names.ParseKind(s.Annotations[names.KindAnnotation]) // not the rotation ledger
		if s.Labels[names.ManagedByLabel] == names.ManagedByValue && isCopy && !referenced[s.Name] {
			actions = append(actions, DeleteSecret{Secret: s})
		}
	}
	return actions
}
