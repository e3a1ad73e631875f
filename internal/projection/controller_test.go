package projection

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// The controller end to end over client-go fakes: gather, plan and apply together.

func TestSyncClusterTokenTargets(t *testing.T) {
	tests := map[string]struct {
		clusters   []*unstructured.Unstructured
		objs       []runtime.Object
		cluster    string
		dryRun     bool
		wantWrites []string
		wantEvent  string // reason of the one Event expected ("" for none)
		wantToken  map[string]string
	}{
		"generated, absent: create in KubeRay's shape": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token)},
			cluster: "c1", wantWrites: []string{"create c1"}, wantEvent: names.ReasonTokenProjected, wantToken: map[string]string{"c1": token},
		},
		"generated, 52 characters: CheckName": {
			clusters: []*unstructured.Unstructured{rayCluster("ab1" + strings.Repeat("y", 49))},
			objs:     []runtime.Object{sourceSecret(token)}, cluster: "ab1" + strings.Repeat("y", 49),
			wantWrites: []string{"create r" + strings.Repeat("y", 49)}, wantEvent: names.ReasonTokenProjected,
		},
		"name KubeRay rejects (54 characters): not a target": {
			clusters: []*unstructured.Unstructured{rayCluster(strings.Repeat("n", 54))},
			objs:     []runtime.Object{sourceSecret(token)}, cluster: strings.Repeat("n", 54),
		},
		"generated, KubeRay's random token: update": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))},
			cluster:  "c1", wantWrites: []string{"update c1"}, wantEvent: names.ReasonTokenProjected, wantToken: map[string]string{"c1": token},
		},
		"generated, raysync's old token: update counts as rotation": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs: []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"),
				withSecretAnnotation(names.TokenSHA256Annotation, "0123456789abcdef"))},
			cluster: "c1", wantWrites: []string{"update c1"}, wantEvent: names.ReasonTokenRotated, wantToken: map[string]string{"c1": token},
		},
		"generated, already equal: no write": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"))},
			cluster:  "c1",
		},
		"generated, controlled by another cluster UID: refused": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs: []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"),
				func(s *corev1.Secret) { s.OwnerReferences[0].UID = "someone-else" })},
			cluster: "c1", wantEvent: names.ReasonTargetNotOwned, wantToken: map[string]string{"c1": oldToken},
		},
		"generated, foreign unlabelled Secret: refused, no create tried": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken})},
			cluster:  "c1", wantEvent: names.ReasonTargetNotOwned, wantToken: map[string]string{"c1": oldToken},
		},
		"source missing: nothing written": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))},
			cluster:  "c1", wantToken: map[string]string{"c1": oldToken},
		},
		"source with trailing newline: nothing written": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{sourceSecret(token + "\n"), secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))},
			cluster:  "c1", wantToken: map[string]string{"c1": oldToken},
		},
		"source empty: nothing created": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret("")}, cluster: "c1",
		},
		"skip annotation": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAnnotation(names.SkipAnnotation, "true"))},
			objs:     []runtime.Object{sourceSecret(token)}, cluster: "c1",
		},
		"auth disabled": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "disabled"}))},
			objs:     []runtime.Object{sourceSecret(token)}, cluster: "c1",
		},
		"no authOptions": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(nil))}, objs: []runtime.Object{sourceSecret(token)}, cluster: "c1",
		},
		"k8s token auth": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "enableK8sTokenAuth": true}))},
			objs:     []runtime.Object{sourceSecret(token)}, cluster: "c1",
		},
		"malformed authOptions: Warning, no panic": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth("token"))}, objs: []runtime.Object{sourceSecret(token)},
			cluster: "c1", wantEvent: names.ReasonInvalidSpec,
		},
		"cluster being deleted: nothing created": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", deleting)}, objs: []runtime.Object{sourceSecret(token)}, cluster: "c1",
		},
		"cluster gone": {objs: []runtime.Object{sourceSecret(token)}, cluster: "c1"},
		"dry-run writes nothing (its Events go to the log recorder)": {
			clusters: []*unstructured.Unstructured{rayCluster("c1"), rayCluster("c2")},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "c2", map[string]string{"auth_token": oldToken}, ownedBy("c2"))},
			cluster:  "c2", dryRun: true, wantEvent: names.ReasonTokenProjected, wantToken: map[string]string{"c2": oldToken},
		},
		"referenced, absent: create managed copy": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs:     []runtime.Object{sourceSecret(token)}, cluster: "c1",
			wantWrites: []string{"create shared"}, wantEvent: names.ReasonTokenProjected, wantToken: map[string]string{"shared": token},
		},
		"referenced, managed copy stale: update": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed)},
			cluster:  "c1", wantWrites: []string{"update shared"}, wantEvent: names.ReasonTokenProjected, wantToken: map[string]string{"shared": token},
		},
		"referenced, foreign Secret: refused, no create tried": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken})},
			cluster:  "c1", wantEvent: names.ReasonTargetNotOwned, wantToken: map[string]string{"shared": oldToken},
		},
		"referenced, managed copy of an earlier source: follows the current one": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs: []runtime.Object{sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed,
				withSecretAnnotation(names.SourceAnnotation, "other/source"))},
			cluster: "c1", wantWrites: []string{"update shared"}, wantEvent: names.ReasonTokenProjected, wantToken: map[string]string{"shared": token},
		},
		"referenced, managed copy of a pull secret under that name: refused": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs: []runtime.Object{sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed,
				withSecretAnnotation(names.KindAnnotation, string(names.KindPullSecret)))},
			cluster: "c1", wantEvent: names.ReasonTargetNotOwned, wantToken: map[string]string{"shared": oldToken},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, tc.dryRun, tc.clusters, tc.objs...)
			h.sync(t, tc.cluster)
			if got := strings.Join(h.writes(), ","); got != strings.Join(tc.wantWrites, ",") {
				t.Errorf("writes = [%s], want [%s]; actions %v", got, strings.Join(tc.wantWrites, ","), h.kube.Actions())
			}
			events := h.events()
			switch {
			case tc.wantEvent == "" && len(events) > 0:
				t.Errorf("unexpected events %v", events)
			case tc.wantEvent != "" && (len(events) != 1 || !strings.Contains(events[0], " "+tc.wantEvent+" ")):
				t.Errorf("events = %v, want one %s", events, tc.wantEvent)
			}
			for _, e := range events {
				if strings.Contains(e, token) || strings.Contains(e, oldToken) {
					t.Errorf("event leaks a token: %q", e)
				}
			}
			for secretName, want := range tc.wantToken {
				if got := string(h.secret(t, secretName).Data["auth_token"]); got != want {
					t.Errorf("Secret %s holds %d bytes that differ from the expected token", secretName, len(got))
				}
			}
		})
	}
}

func TestCreatedSecretHasKubeRayShape(t *testing.T) {
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")}, sourceSecret(token))
	h.ctrl.now = func() time.Time { return time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC) }
	h.sync(t, "c1")
	s := h.secret(t, "c1")
	owner := metav1.GetControllerOf(s)
	if owner == nil || owner.UID != "uid-c1" || owner.Kind != "RayCluster" || owner.APIVersion != "ray.io/v1" || !*owner.BlockOwnerDeletion {
		t.Errorf("owner = %+v", s.OwnerReferences)
	}
	if s.Labels[kuberay.ClusterLabel] != "c1" || s.Labels[names.ManagedByLabel] != "" {
		t.Errorf("labels = %v: want KubeRay's ray.io/cluster only", s.Labels)
	}
	if len(s.Data) != 1 || string(s.Data["auth_token"]) != token || s.Type != corev1.SecretTypeOpaque {
		t.Errorf("data keys %d, type %q", len(s.Data), s.Type)
	}
	// synced-at of a Secret raysync created: the second before its creation (bornAt).
	want := map[string]string{names.SourceAnnotation: tokenSrc.String(), names.TokenSHA256Annotation: tokenDigest([]byte(token)),
		names.SyncedAtAnnotation: "2026-11-29T11:59:59Z"}
	for k, v := range want {
		if s.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, s.Annotations[k], v)
		}
	}
	if len(s.Annotations[names.TokenSHA256Annotation]) != 16 {
		t.Errorf("digest annotation must be 16 hex characters")
	}
}

func TestUpdateChangesOnlyTokenAndAnnotations(t *testing.T) {
	existing := secret(ns, "c1", map[string]string{"auth_token": oldToken, "other": "kept"}, ownedBy("c1"),
		withSecretAnnotation("team", "ml"))
	existing.Labels["extra"] = "kept"
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")}, sourceSecret(token), existing)
	h.sync(t, "c1")
	s := h.secret(t, "c1")
	if string(s.Data["other"]) != "kept" || s.Labels["extra"] != "kept" || s.Annotations["team"] != "ml" || len(s.OwnerReferences) != 1 {
		t.Errorf("update dropped fields raysync does not own: %+v", s.ObjectMeta)
	}
	for _, a := range h.kube.Actions() {
		if u, ok := a.(clienttesting.UpdateAction); ok && u.GetObject().(*corev1.Secret).ResourceVersion != "1" {
			t.Errorf("update without resourceVersion precondition")
		}
	}
}

func TestPruneNamespace(t *testing.T) {
	ref := func(name string) func(*unstructured.Unstructured) {
		return withAuth(map[string]any{"mode": "token", "secretName": name})
	}
	tests := map[string]struct {
		clusters   []*unstructured.Unstructured
		objs       []runtime.Object
		wantWrites []string
	}{
		"unreferenced managed copy is deleted": {
			objs:       []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token}, managed)},
			wantWrites: []string{"delete shared"},
		},
		"referenced copy is kept": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", ref("shared"))},
			objs:     []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token}, managed)},
		},
		"copy referenced only by a cluster being deleted is kept": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", ref("shared"), deleting)},
			objs:     []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token}, managed)},
		},
		"copy referenced by a skipped cluster is kept": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", ref("shared"), withAnnotation(names.SkipAnnotation, "true"))},
			objs:     []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token}, managed)},
		},
		"foreign Secret is never deleted": {
			objs: []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token})},
		},
		"unreferenced managed copy of an earlier source is deleted": {
			objs: []runtime.Object{secret(ns, "shared", map[string]string{"auth_token": token}, managed,
				withSecretAnnotation(names.SourceAnnotation, "other/src"))},
			wantWrites: []string{"delete shared"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, false, tc.clusters, tc.objs...)
			if err := h.ctrl.syncNamespace(context.Background(), ns); err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(h.writes(), ","); got != strings.Join(tc.wantWrites, ",") {
				t.Errorf("writes = [%s], want [%s]", got, strings.Join(tc.wantWrites, ","))
			}
		})
	}
}

func TestSyncSourceCountsRotations(t *testing.T) {
	h := newHarness(t, false, nil, sourceSecret(token))
	rotations := func() float64 { return testutil.ToFloat64(h.metrics.Rotations.WithLabelValues(tokenSrc.String())) }
	_ = h.ctrl.syncSource(context.Background(), tokenSrc)
	_ = h.ctrl.syncSource(context.Background(), tokenSrc)
	if rotations() != 0 {
		t.Fatalf("first observation counted as rotation")
	}
	// A new token value is one rotation; an invalid value in between is not.
	if err := h.updateSource(sourceSecret(" bad")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { s, _ := h.ctrl.caches.Source(tokenSrc); return string(s.Data["auth_token"]) == " bad" })
	_ = h.ctrl.syncSource(context.Background(), tokenSrc)
	if ev := h.events(); len(ev) != 1 || !strings.Contains(ev[0], names.ReasonSourceInvalid) || strings.Contains(ev[0], " bad") {
		t.Fatalf("want one SourceInvalid event without the value, got %v", ev)
	}
	_ = h.ctrl.syncSource(context.Background(), tokenSrc)
	if ev := h.events(); len(ev) != 0 {
		t.Fatalf("SourceInvalid repeated for the same reason: %v", ev)
	}
	if err := h.updateSource(sourceSecret("new-token")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		s, _ := h.ctrl.caches.Source(tokenSrc)
		return string(s.Data["auth_token"]) == "new-token"
	})
	_ = h.ctrl.syncSource(context.Background(), tokenSrc)
	if rotations() != 1 {
		t.Fatalf("rotations = %v, want 1", rotations())
	}
}

func TestSnapshotStates(t *testing.T) {
	started := func(at time.Time) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-head",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at)}}}}
		}
	}
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	pod := func(name, cluster string, opts ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{kuberay.ClusterLabel: cluster, kuberay.NodeTypeLabel: "head"}}}
		for _, o := range opts {
			o(p)
		}
		return p
	}
	h := newHarness(t, false,
		[]*unstructured.Unstructured{rayCluster("in"), rayCluster("out"), rayCluster("behind"), rayCluster("foreign"), rayCluster("absent"), rayCluster("plain", withAuth(nil))},
		sourceSecret(token),
		secret(ns, "in", map[string]string{"auth_token": token}, ownedBy("in")),
		secret(ns, "out", map[string]string{"auth_token": oldToken}, ownedBy("out")),
		secret(ns, "behind", map[string]string{"auth_token": oldToken}, ownedBy("behind")),
		secret(ns, "foreign", map[string]string{"auth_token": oldToken}, ownedBy("foreign"), func(s *corev1.Secret) { s.OwnerReferences[0].UID = "x" }),
		pod("in-head", "in", started(at)),
		pod("behind-head", "behind", started(at)),
		pod("out-pending", "out"),
	)
	snap := h.ctrl.Snapshot()
	got := map[string]string{}
	for _, s := range snap.Targets {
		got[s.RayCluster] = s.Kind + "/" + s.State
	}
	// A running cluster's target holding the token its containers started with is frozen on it.
	want := map[string]string{"in": "auth_token/in_sync", "out": "auth_token/out_of_sync", "behind": "auth_token/frozen",
		"foreign": "auth_token/not_owned", "absent": "auth_token/out_of_sync"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("targets = %v, want %v", got, want)
	}
	rotations := map[string]string{}
	for _, r := range snap.Rotations {
		rotations[r.RayCluster] = r.Kind + "/" + r.State
	}
	// "behind" runs on KubeRay's token, which raysync did not write, and nobody adopted it.
	wantRot := map[string]string{"in": "RayCluster/current", "out": "RayCluster/current", "behind": "RayCluster/not_adopted", "absent": "RayCluster/current"}
	if fmt.Sprint(rotations) != fmt.Sprint(wantRot) {
		t.Errorf("rotations = %v, want %v", rotations, wantRot)
	}
	if len(snap.StalePods) != 0 {
		t.Errorf("stale pods %v: without pod sources there is nothing to be stale about", snap.StalePods)
	}
}

func TestWarningsAreNotRepeatedEveryReconcile(t *testing.T) {
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")},
		sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken}))
	h.sync(t, "c1")
	h.sync(t, "c1")
	h.sync(t, "c1")
	if ev := h.events(); len(ev) != 1 || !strings.Contains(ev[0], names.ReasonTargetNotOwned) {
		t.Fatalf("events = %v, want one TargetNotOwned", ev)
	}
	// Gone and back: reported again.
	h.ctrl.memory.forget(clusterKey(ns, "c1"))
	h.sync(t, "c1")
	if ev := h.events(); len(ev) != 1 {
		t.Fatalf("after forget: events = %v", ev)
	}
}

func TestTerminatingNamespaceIsNotAnError(t *testing.T) {
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")}, sourceSecret(token))
	h.kube.PrependReactor("create", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, namespaceTerminating()
	})
	h.sync(t, "c1") // fails the test if syncCluster returns an error (which would requeue with backoff)
	if v := testutil.ToFloat64(h.metrics.Syncs.WithLabelValues(names.ResultError)); v != 0 {
		t.Errorf("counted as error: %v", v)
	}
}

func TestTargetVanishingMidReconcileIsNotAnError(t *testing.T) {
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")},
		sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1")))
	h.kube.PrependReactor("update", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(corev1.Resource("secrets"), "c1")
	})
	h.sync(t, "c1") // fails the test if syncCluster returns an error
	if v := testutil.ToFloat64(h.metrics.Syncs.WithLabelValues(names.ResultError)); v != 0 {
		t.Errorf("counted as error: %v", v)
	}
}

// A raysync (re)started after KubeRay created a cluster's Secret did not see it arrive: however young
// the Secret, once a pod is on a node a kubelet may have started a container on it, so raysync leaves
// it alone (the cluster is behind). A Secret created after raysync began watching is written at once.
func TestSecretCreatedBeforeRaysyncWatchedIsLeftAlone(t *testing.T) {
	young := func(name string) *corev1.Secret {
		return secret(ns, name, map[string]string{"auth_token": oldToken}, ownedBy(name),
			func(s *corev1.Secret) { s.CreationTimestamp = metav1.NewTime(time.Now()) })
	}
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")},
		sourceSecret(token), young("c1"), rayPod("c1-head", "c1", onNode))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = h.ctrl.Run(ctx, 1) }()
	for i := 0; h.ctrl.gather.watchingSince.Load() == 0 && i < 1000; i++ {
		time.Sleep(time.Millisecond) // until Run has synced and started its workers
	}
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has whole seconds
	if _, err := h.kube.CoreV1().Secrets(ns).Create(ctx, young("c2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.kube.CoreV1().Pods(ns).Create(ctx, rayPod("c2-head", "c2", onNode), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.dyn.Resource(rayClusterGVR).Namespace(ns).Create(ctx, rayCluster("c2"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.ctrl.syncCluster(ctx, informer.Key{Kind: informer.ClusterKey, Namespace: ns, Name: "c1"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for string(h.secret(t, "c2").Data["auth_token"]) != token && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the worker writes it
	}
	if got := string(h.secret(t, "c1").Data["auth_token"]); got != oldToken {
		t.Error("overwrote the Secret of a cluster whose pods were on a node before raysync was watching")
	}
	if got := string(h.secret(t, "c2").Data["auth_token"]); got != token {
		t.Error("left KubeRay's token in a Secret raysync saw arrive")
	}
}
