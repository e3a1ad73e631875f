package projection

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Managed copies and the pods that read them: pruning, adoption across sources, type changes, and
// what raysync keeps (and forgets) about clusters.

// A copy is pruned only when no RayCluster in the namespace references it, selected or not.
func TestPruneKeepsCopiesUnselectedClustersReference(t *testing.T) {
	pullCopy := pullCopy(withRV("1"))
	tests := map[string]struct {
		clusters []*unstructured.Unstructured
		objs     []runtime.Object
	}{
		"token copy named by an unselected cluster": {
			clusters: []*unstructured.Unstructured{rayCluster("unselected", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs:     []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token}, managed)},
		},
		"pull secret copy listed by a cluster that lost the selector label": {
			clusters: []*unstructured.Unstructured{templatedCluster("unlabelled", setPath([]any{map[string]any{"name": "regcred"}},
				"spec", "headGroupSpec", "template", "spec", "imagePullSecrets"))},
			objs: []runtime.Object{pullCopy},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarnessWith(t, Config{Source: tokenSrc, Prune: true, ClusterSelector: mustSelector(t, "team=ml"),
				Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}}}, tc.clusters, append(tc.objs, sourceSecret(token), pullSecretSource())...)
			if err := h.ctrl.syncNamespace(context.Background(), ns); err != nil {
				t.Fatal(err)
			}
			if w := h.allWrites(); len(w) > 0 {
				t.Errorf("writes = %v, want none: a cluster outside the selector still references the copy", w)
			}
		})
	}
}

// A pod whose init containers run has started; pods raysync does not see controlled by the
// cluster are never deleted.
func TestPodsThatMustNotBeRecycled(t *testing.T) {
	fixed, _, _ := podtemplate.Desired(templatedCluster("c1"), podtemplate.Config{PullSecrets: []string{"regcred"}})
	copyOfPull := pullCopy(unstored)
	initRunning := func(p *corev1.Pod) {
		p.Spec.InitContainers = []corev1.Container{{Name: "wait-gcs-ready"}}
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "wait-gcs-ready",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now().Add(-time.Hour))}}}}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker",
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}}}}
	}
	sidecarStarted := func(p *corev1.Pod) {
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = []corev1.Container{{Name: "log-shipper", RestartPolicy: &always}}
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "log-shipper", Started: ptrTo(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now().Add(-time.Hour))}}}}
	}
	initDone := func(p *corev1.Pod) {
		p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "wait-gcs-ready",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}}
	}
	notControlled := func(p *corev1.Pod) { p.OwnerReferences = nil }
	otherController := func(p *corev1.Pod) { p.OwnerReferences[0].UID = "uid-of-an-older-c1" }
	tests := map[string]func(*corev1.Pod){
		"init container running for an hour": initRunning,
		"native sidecar started":             sidecarStarted,
		"init container terminated":          initDone,
		"labelled but not controlled":        notControlled,
		"controlled by another cluster UID":  otherController,
	}
	for name, opt := range tests {
		t.Run(name, func(t *testing.T) {
			h := newPodHarness(t, fixed, PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: true},
				pullSecretSource(), copyOfPull, rayPod("p1", "c1", podOwnedBy("c1"), opt))
			h.sync(t, "c1")
			if w := h.allWrites(); len(w) > 0 {
				t.Errorf("writes = %v, want none", w)
			}
		})
	}
	t.Run("controlled and never started: recycled", func(t *testing.T) {
		h := newPodHarness(t, fixed, PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: true},
			pullSecretSource(), copyOfPull, rayPod("p1", "c1", podOwnedBy("c1")))
		h.sync(t, "c1")
		if got := strings.Join(h.allWrites(), ","); got != "delete pods p1" {
			t.Errorf("writes = [%s], want [delete pods p1]", got)
		}
	})
}

// Nothing is remembered about a cluster once it has left the cache.
func TestNothingRememberedAboutGoneClusters(t *testing.T) {
	h := newPodHarness(t, templatedCluster("c1"), PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, pullSecretSource(), sourceSecret(token))
	h.sync(t, "c1")
	if h.ctrl.memory.size() == 0 {
		t.Fatal("fixture: nothing remembered after a reconcile")
	}
	if err := h.dyn.Resource(rayClusterGVR).Namespace(ns).Delete(context.Background(), "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := h.ctrl.caches.RayCluster(ns, "c1"); return !ok })
	h.sync(t, "c1")
	if n := h.ctrl.memory.size(); n != 0 {
		t.Errorf("%d entries remembered about a deleted cluster", n)
	}
}

// A copy labelled managed-by raysync is raysync's whatever source it came from.
func TestCopiesOfAnEarlierSourceFollowTheCurrentOne(t *testing.T) {
	movedFrom := func(src string) func(*corev1.Secret) { return withSecretAnnotation(names.SourceAnnotation, src) }
	t.Run("token copy follows the new source", func(t *testing.T) {
		h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed, movedFrom("old/ray-token")))
		h.sync(t, "c1")
		if got := strings.Join(h.writes(), ","); got != "update shared" {
			t.Errorf("writes = [%s], want [update shared]", got)
		}
		s := h.secret(t, "shared")
		if string(s.Data["auth_token"]) != token || s.Annotations[names.SourceAnnotation] != tokenSrc.String() {
			t.Errorf("copy not moved to the current source (annotation %q)", s.Annotations[names.SourceAnnotation])
		}
	})
	t.Run("pull secret copy follows the new source", func(t *testing.T) {
		stale := pullCopy(unstored, withRV("1"), withSecretAnnotation(names.SourceAnnotation, "old/regcred"), func(s *corev1.Secret) {
			s.Data = map[string][]byte{".dockerconfigjson": []byte(`{"auths":{}}`)}
		})
		h := newPodHarness(t, templatedCluster("c1"), PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, pullSecretSource(), stale)
		h.sync(t, "c1")
		s := h.secret(t, "regcred")
		if string(s.Data[".dockerconfigjson"]) != string(pullSecretSource().Data[".dockerconfigjson"]) || s.Annotations[names.SourceAnnotation] != pullSource.String() {
			t.Errorf("copy not moved to the current source; writes %v, events %v", h.allWrites(), h.events())
		}
	})
	t.Run("unreferenced copy of an earlier source is pruned", func(t *testing.T) {
		h := newHarness(t, false, nil, sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed, movedFrom("old/ray-token")))
		if err := h.ctrl.syncNamespace(context.Background(), ns); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(h.writes(), ","); got != "delete shared" {
			t.Errorf("writes = [%s], want [delete shared]", got)
		}
	})
}

// A pull-secret source that changes type gets its copies replaced (a Secret's type is immutable).
func TestPullSecretTypeChangeReplacesCopy(t *testing.T) {
	fixed, _, _ := podtemplate.Desired(templatedCluster("c1"), podtemplate.Config{PullSecrets: []string{"regcred"}})
	oldCopy := pullCopy(withRV("7"), func(s *corev1.Secret) {
		s.Type, s.Data = corev1.SecretTypeDockercfg, map[string][]byte{".dockercfg": []byte(`{"registry.example":{"auth":"dTpw"}}`)}
	})
	h := newPodHarness(t, fixed, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, pullSecretSource(), oldCopy)
	h.syncUntilQuiet(t, "c1")
	if got := strings.Join(h.allWrites(), ","); got != "delete secrets regcred,create secrets regcred" {
		t.Errorf("writes = [%s], want [delete secrets regcred,create secrets regcred]", got)
	}
	s := h.secret(t, "regcred")
	if s.Type != corev1.SecretTypeDockerConfigJson || string(s.Data[".dockerconfigjson"]) != string(pullSecretSource().Data[".dockerconfigjson"]) {
		t.Errorf("copy has type %q", s.Type)
	}
	for _, a := range h.kube.Actions() {
		if d, ok := a.(interface{ GetDeleteOptions() metav1.DeleteOptions }); ok {
			p := d.GetDeleteOptions().Preconditions
			if p == nil || p.UID == nil || *p.UID != "u-regcred" || p.ResourceVersion == nil || *p.ResourceVersion != "7" {
				t.Errorf("delete without UID and resourceVersion preconditions: %+v", p)
			}
		}
	}
	if v := testutil.ToFloat64(h.metrics.Syncs.WithLabelValues("updated")); v != 1 {
		t.Errorf("raysync_sync_total{result=updated} = %v, want 1", v)
	}
}

// Counters whose label values are known at start have a series from the start.
func TestRotationCounterStartsAtZero(t *testing.T) {
	h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}})
	if n := testutil.CollectAndCount(h.metrics.Rotations); n != 2 {
		t.Errorf("raysync_source_rotations_total has %d series before any rotation, want 2 (one per configured tokenSrc)", n)
	}
}
