// Package projection computes what each RayCluster's targets should hold (pure functions over cached
// objects) and applies the smallest write that gets them there.
package projection

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
)

// Annotations raysync writes.
const (
	SkipAnnotation        = "raysync.dev/skip"
	SourceAnnotation      = "raysync.dev/source"
	TokenSHA256Annotation = "raysync.dev/token-sha256"
	SyncedAtAnnotation    = "raysync.dev/synced-at"
	// KindAnnotation tells raysync's managed copies apart (auth-token, and later pull secrets, TLS).
	KindAnnotation = "raysync.dev/kind"
	KindAuthToken  = "auth-token"
)

// Mode is how KubeRay finds a cluster's token Secret.
type Mode string

const (
	// Generated: KubeRay generates (or adopts) a Secret named CheckName(<cluster>), owned by the cluster.
	Generated Mode = "generated"
	// Referenced: KubeRay v1.6+ reads spec.authOptions.secretName and creates nothing.
	Referenced Mode = "referenced"
)

// TokenTarget is the Secret a RayCluster's pods read RAY_AUTH_TOKEN from.
type TokenTarget struct {
	Mode      Mode
	Namespace string
	Name      string
	// IsSource: referenced mode naming the canonical source itself; nothing to write.
	IsSource bool
}

// Secret returns the target's namespaced name.
func (t TokenTarget) Secret() types.NamespacedName {
	return types.NamespacedName{Namespace: t.Namespace, Name: t.Name}
}

// TokenTargetFor decides whether raysync manages rc's token and where it lives. ok is false for
// clusters without token auth, with Kubernetes token auth, or annotated raysync.dev/skip=true.
// err reports a malformed spec.authOptions.
func TokenTargetFor(rc *unstructured.Unstructured, source types.NamespacedName) (t TokenTarget, ok bool, err error) {
	if rc.GetAnnotations()[SkipAnnotation] == "true" || !kuberay.ValidClusterName(rc.GetName()) {
		return t, false, nil
	}
	auth := kuberay.ReadAuthOptions(rc)
	if auth.Err != nil {
		return t, false, auth.Err
	}
	if !auth.TokenAuth() {
		return t, false, nil
	}
	if auth.SecretName != "" {
		return TokenTarget{
			Mode: Referenced, Namespace: rc.GetNamespace(), Name: auth.SecretName,
			IsSource: rc.GetNamespace() == source.Namespace && auth.SecretName == source.Name,
		}, true, nil
	}
	return TokenTarget{Mode: Generated, Namespace: rc.GetNamespace(), Name: kuberay.CheckName(rc.GetName())}, true, nil
}

// ownsTokenTarget reports whether raysync may write secret as rc's token target:
// generated mode needs the RayCluster as controller (KubeRay's shape, whoever created it);
// referenced mode needs a raysync-managed copy of this source.
func ownsTokenTarget(t TokenTarget, rc *unstructured.Unstructured, secret *corev1.Secret, source types.NamespacedName) bool {
	if t.Mode == Generated {
		owner := metav1.GetControllerOf(secret)
		return owner != nil && owner.UID == rc.GetUID()
	}
	return isManagedCopyOf(secret, source, KindAuthToken)
}

// desiredGeneratedSecret is the Secret KubeRay would create for rc, holding the canonical token, so
// that KubeRay adopts it and the head pod starts with the right token.
func desiredGeneratedSecret(rc *unstructured.Unstructured, name string, token []byte, source types.NamespacedName, now time.Time) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: rc.GetNamespace(),
			Labels:    map[string]string{kuberay.ClusterLabel: rc.GetName()},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(rc, kuberay.RayClusterGVK),
			},
		},
		Type: corev1.SecretTypeOpaque,
	}
	return withToken(s, token, source, now)
}

// desiredManagedCopy is a raysync-owned copy of the source for referenced mode. It has no owner:
// blue-green clusters share it, and raysync prunes it when no cluster references it.
func desiredManagedCopy(ns, name string, token []byte, source types.NamespacedName, now time.Time) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   ns,
			Labels:      map[string]string{informer.ManagedByLabel: informer.ManagedByValue},
			Annotations: map[string]string{KindAnnotation: KindAuthToken},
		},
		Type: corev1.SecretTypeOpaque,
	}
	return withToken(s, token, source, now)
}

// withToken sets the token and raysync's annotations on a copy of s, leaving everything else as is.
func withToken(s *corev1.Secret, token []byte, source types.NamespacedName, now time.Time) *corev1.Secret {
	s = s.DeepCopy()
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[kuberay.AuthTokenKey] = bytes.Clone(token)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[SourceAnnotation] = source.String()
	s.Annotations[TokenSHA256Annotation] = tokenDigest(token)
	s.Annotations[SyncedAtAnnotation] = now.UTC().Format(time.RFC3339Nano)
	return s
}

// tokenDigest is the short digest stored on the target Secret itself (which holds the token anyway),
// so a person can compare targets without reading them. Never log it or put it in an Event or metric.
func tokenDigest(token []byte) string {
	sum := sha256.Sum256(token)
	return hex.EncodeToString(sum[:8])
}

// holdsToken reports whether the target Secret's auth_token equals the canonical token (content, not resourceVersion).
func holdsToken(s *corev1.Secret, token []byte) bool {
	v, ok := s.Data[kuberay.AuthTokenKey]
	return ok && bytes.Equal(v, token)
}

// tokenState is a cluster's state as raysync_targets reports it. secret is the target as cached
// (nil if not cached); refused means the last reconcile met a foreign Secret raysync does not cache.
func tokenState(t TokenTarget, rc *unstructured.Unstructured, secret *corev1.Secret, token []byte, sourceErr error, source types.NamespacedName, refused bool) string {
	switch {
	case sourceErr != nil:
		return metrics.StateSourceInvalid
	case t.IsSource:
		// Pods read the source itself: in sync exactly when it carries the key KubeRay reads.
		if secret != nil && holdsToken(secret, token) {
			return metrics.StateInSync
		}
		return metrics.StateOutOfSync
	case secret == nil:
		if refused {
			return metrics.StateNotOwned
		}
		return metrics.StateOutOfSync
	case !ownsTokenTarget(t, rc, secret, source):
		return metrics.StateNotOwned
	case holdsToken(secret, token):
		return metrics.StateInSync
	}
	return metrics.StateOutOfSync
}

// stalePods counts pods with a container that started before the target received its current token
// (the kubelet resolves secretKeyRef only when it creates a container). Pods whose containers have
// not started are not stale. Pod start times have one-second resolution, so a container that started
// in the same second as the write counts as fresh.
func stalePods(pods []*corev1.Pod, tokenSince time.Time) []*corev1.Pod {
	if tokenSince.IsZero() {
		return nil
	}
	cutoff := tokenSince.Truncate(time.Second)
	var stale []*corev1.Pod
	for _, p := range pods {
		for _, cs := range p.Status.ContainerStatuses {
			if started := containerStartedAt(cs); !started.IsZero() && started.Before(cutoff) {
				stale = append(stale, p)
				break
			}
		}
	}
	return stale
}

func containerStartedAt(cs corev1.ContainerStatus) time.Time {
	switch {
	case cs.State.Running != nil:
		return cs.State.Running.StartedAt.Time
	case cs.State.Terminated != nil:
		return cs.State.Terminated.StartedAt.Time
	}
	return time.Time{}
}

// syncedAt reads when raysync last wrote the token into s (zero if never or unparsable).
func syncedAt(s *corev1.Secret) time.Time {
	if s == nil {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s.Annotations[SyncedAtAnnotation])
	if err != nil {
		return time.Time{}
	}
	return t
}
