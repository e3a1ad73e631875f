package projection

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Pull secrets and autoscaler TLS through the controller, over client-go fakes.

func TestSyncPodConfig(t *testing.T) {
	fixed, _, _ := podtemplate.Desired(templatedCluster("c1"), podtemplate.Config{PullSecrets: []string{"regcred"}})
	recreate := func(rc *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(rc.Object, "Recreate", "spec", "upgradeStrategy", "type")
	}
	managedCopy := pullCopy(unstored)
	tests := map[string]struct {
		rc            *unstructured.Unstructured
		objs          []runtime.Object
		allowRecreate bool
		noRecycle     bool
		wantActions   []string
		wantEvent     string
	}{
		"copy created and templates patched": {
			rc: templatedCluster("c1"), objs: []runtime.Object{pullSecretSource()},
			wantActions: []string{"create secrets regcred", "patch rayclusters c1"}, wantEvent: names.ReasonTemplatePatched,
		},
		"template fixed: pending pod without the entry is recycled": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1")},
			wantActions: []string{"delete pods p1"}, wantEvent: names.ReasonPodRecycled,
		},
		"pending pod too young (KubeRay may not have seen it yet): not yet": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", func(p *corev1.Pod) { p.CreationTimestamp = metav1.Now() })},
		},
		"recycling off": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1")}, noRecycle: true,
		},
		"running pod is never deleted, only reported": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", running)},
			wantEvent: names.ReasonStalePodConfig,
		},
		"pod already carrying the entry is left alone": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", withPullSecret)},
		},
		"foreign Secret with the copy's name: untouched, not referenced, no create tried": {
			rc: templatedCluster("c1"),
			objs: []runtime.Object{pullSecretSource(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns},
				Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{}}`)}}},
			wantEvent: names.ReasonTargetNotOwned,
		},
		"invalid source: nothing written": {
			rc: templatedCluster("c1"),
			objs: []runtime.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: tokenSrc.Namespace},
				Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte(`{`)}}},
		},
		"Recreate with a running pod: deferred": {
			rc: templatedCluster("c1", recreate), objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", running)},
			wantEvent: names.ReasonTemplatePatchDeferred,
		},
		"Recreate without running pods: patched at once": {
			rc: templatedCluster("c1", recreate), objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1")},
			wantActions: []string{"patch rayclusters c1"}, wantEvent: names.ReasonTemplatePatched,
		},
		"Recreate with --allow-recreate: patched": {
			rc: templatedCluster("c1", recreate), objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", running)},
			allowRecreate: true, wantActions: []string{"patch rayclusters c1"}, wantEvent: names.ReasonTemplatePatched,
		},
		"skip annotation": {
			rc:   templatedCluster("c1", func(u *unstructured.Unstructured) { u.SetAnnotations(map[string]string{names.SkipAnnotation: "true"}) }),
			objs: []runtime.Object{pullSecretSource()},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newPodHarness(t, tc.rc, PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: !tc.noRecycle,
				AllowRecreate: tc.allowRecreate}, tc.objs...)
			h.sync(t, "c1")
			if got := strings.Join(h.allWrites(), ","); got != strings.Join(tc.wantActions, ",") {
				t.Errorf("writes = [%s], want [%s]", got, strings.Join(tc.wantActions, ","))
			}
			events := h.events()
			if tc.wantEvent == "" && len(events) > 0 || tc.wantEvent != "" && (len(events) == 0 || !strings.Contains(strings.Join(events, "|"), " "+tc.wantEvent+" ")) {
				t.Errorf("events = %v, want %q", events, tc.wantEvent)
			}
			for _, a := range h.allActions() {
				if p, ok := a.(clienttesting.PatchAction); ok && !strings.Contains(string(p.GetPatch()), `"resourceVersion"`) {
					t.Errorf("patch without resourceVersion precondition: %s", p.GetPatch())
				}
			}
		})
	}
}

func TestTemplateReappliedAfterWipe(t *testing.T) {
	orig := templatedCluster("c1")
	h := newPodHarness(t, orig, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, pullSecretSource())
	h.sync(t, "c1")
	waitFor(t, func() bool {
		rc, _ := h.ctrl.caches.RayCluster(ns, "c1")
		_, ch, _ := podtemplate.Desired(rc, podtemplate.Config{PullSecrets: []string{"regcred"}})
		return !ch
	})
	if v := testutilValue(h.metrics.TemplateReapplied); v != 0 {
		t.Fatalf("first patch counted as re-applied")
	}
	// KubeRay wipes the spec (operator upgrade, worker group appended): raysync puts its entries back.
	cur, _ := h.ctrl.caches.RayCluster(ns, "c1")
	wiped := cur.DeepCopy()
	wiped.Object["spec"] = orig.DeepCopy().Object["spec"]
	if _, err := h.dyn.Resource(kuberay.RayClusterGVR).Namespace(ns).Update(context.Background(), wiped, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		rc, _ := h.ctrl.caches.RayCluster(ns, "c1")
		_, ch, _ := podtemplate.Desired(rc, podtemplate.Config{PullSecrets: []string{"regcred"}})
		return ch
	})
	h.sync(t, "c1")
	if v := testutilValue(h.metrics.TemplateReapplied); v != 1 {
		t.Fatalf("raysync_template_reapplied_total = %v, want 1", v)
	}
}

func TestPruneManagedPodCopies(t *testing.T) {
	managed := func(name, kind string, src types.NamespacedName) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("u-" + name), ResourceVersion: "1",
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.SourceAnnotation: src.String(), names.KindAnnotation: kind}}}
	}
	t.Run("last cluster gone: copy pruned", func(t *testing.T) {
		h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, managed("regcred", string(names.KindPullSecret), pullSource))
		if err := h.ctrl.syncNamespace(context.Background(), ns); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(h.allWrites(), ","); got != "delete secrets regcred" {
			t.Errorf("writes = %s", got)
		}
	})
	t.Run("cluster in namespace: kept", func(t *testing.T) {
		h := newPodHarness(t, templatedCluster("c1"), PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, managed("regcred", string(names.KindPullSecret), pullSource))
		_ = h.ctrl.syncNamespace(context.Background(), ns)
		if w := h.allWrites(); len(w) > 0 {
			t.Errorf("writes = %v", w)
		}
	})
	t.Run("unreferenced copy of a source raysync is no longer configured with: pruned", func(t *testing.T) {
		h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}},
			managed("other", string(names.KindPullSecret), types.NamespacedName{Namespace: "x", Name: "other"}))
		_ = h.ctrl.syncNamespace(context.Background(), ns)
		if got := strings.Join(h.allWrites(), ","); got != "delete secrets other" {
			t.Errorf("writes = [%s], want [delete secrets other]", got)
		}
	})
	t.Run("--prune=false", func(t *testing.T) {
		h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, managed("regcred", string(names.KindPullSecret), pullSource))
		h.ctrl.cfg.Prune = false
		_ = h.ctrl.syncNamespace(context.Background(), ns)
		if w := h.allWrites(); len(w) > 0 {
			t.Errorf("writes = %v", w)
		}
	})
}

// A running pod lacking raysync's entries is counted once in raysync_pods_started_without_config_total,
// however often the cluster is reconciled.
func TestPodsStartedWithoutConfigCountedOnce(t *testing.T) {
	fixed, _, _ := podtemplate.Desired(templatedCluster("c1"), podtemplate.Config{PullSecrets: []string{"regcred"}})
	managedCopy := pullCopy(unstored)
	h := newPodHarness(t, fixed, PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: true},
		pullSecretSource(), managedCopy, rayPod("p1", "c1", running), rayPod("p2", "c1", withPullSecret, running))
	for range 3 {
		h.sync(t, "c1")
	}
	if got := testutil.ToFloat64(h.metrics.PodsStartedWithout.WithLabelValues(names.StalePullSecret)); got != 1 {
		t.Errorf("raysync_pods_started_without_config_total{reason=pull_secret} = %v, want 1", got)
	}
}
