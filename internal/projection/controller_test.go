package projection

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
)

const (
	ns       = "ray"
	token    = "canonical-token-value"
	oldToken = "kuberay-random-token"
)

var tokenSrc = types.NamespacedName{Namespace: "raysync-system", Name: "ray-token"}

// ---- fixture builders ----

func rayCluster(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	rc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": "uid-" + name, "generation": int64(1)},
		"spec":     map[string]any{"authOptions": map[string]any{"mode": "token"}},
	}}
	for _, o := range opts {
		o(rc)
	}
	return rc
}

func withAuth(auth any) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { rc.Object["spec"].(map[string]any)["authOptions"] = auth }
}

func withAnnotation(k, v string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { rc.SetAnnotations(map[string]string{k: v}) }
}

func deleting(rc *unstructured.Unstructured) {
	now := metav1.Now()
	rc.SetDeletionTimestamp(&now)
	rc.SetFinalizers([]string{"example.com/hold"})
}

func secret(namespace, name string, data map[string]string, opts ...func(*corev1.Secret)) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, ResourceVersion: "1", UID: types.UID("s-" + name)},
		Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func sourceSecret(value string) *corev1.Secret {
	return secret(tokenSrc.Namespace, tokenSrc.Name, map[string]string{"auth_token": value})
}

// ownedBy gives a Secret KubeRay's shape: label ray.io/cluster and the cluster as controller.
func ownedBy(cluster string) func(*corev1.Secret) {
	return func(s *corev1.Secret) {
		yes := true
		s.Labels = map[string]string{kuberay.ClusterLabel: cluster}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: cluster,
			UID: types.UID("uid-" + cluster), Controller: &yes, BlockOwnerDeletion: &yes}}
	}
}

func managed(s *corev1.Secret) {
	s.Labels = map[string]string{names.ManagedByLabel: names.ManagedByValue}
	s.Annotations = map[string]string{names.SourceAnnotation: tokenSrc.String(), names.KindAnnotation: string(names.KindAuthToken)}
}

func withSecretAnnotation(k, v string) func(*corev1.Secret) {
	return func(s *corev1.Secret) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

type harness struct {
	ctrl     *Controller
	kube     *fake.Clientset
	dyn      *dynamicfake.FakeDynamicClient
	recorder *record.FakeRecorder
	metrics  *metrics.Metrics
}

func newHarness(t *testing.T, dryRun bool, clusters []*unstructured.Unstructured, objs ...runtime.Object) *harness {
	t.Helper()
	return newDryRunHarness(t, dryRun, Config{Source: tokenSrc, Prune: true}, clusters, objs...)
}

// newPodHarness is a harness with pod-level sources configured (and rc, if not nil).
func newPodHarness(t *testing.T, rc *unstructured.Unstructured, pods PodOptions, objs ...runtime.Object) *harness {
	t.Helper()
	var clusters []*unstructured.Unstructured
	if rc != nil {
		clusters = append(clusters, rc)
	}
	return newHarnessWith(t, Config{Source: tokenSrc, Prune: true, Pods: pods}, clusters, objs...)
}

func newHarnessWith(t testing.TB, cfg Config, clusters []*unstructured.Unstructured, objs ...runtime.Object) *harness {
	t.Helper()
	return newDryRunHarness(t, false, cfg, clusters, objs...)
}

// newDryRunHarness runs a controller (with dryRun as given) over fake clients holding clusters and
// objs, with synced caches and no recorded actions yet.
func newDryRunHarness(t testing.TB, dryRun bool, cfg Config, clusters []*unstructured.Unstructured, objs ...runtime.Object) *harness {
	t.Helper()
	kube := fake.NewClientset(objs...)
	enforceResourceVersions(kube)
	scheme := runtime.NewScheme()
	var dynObjs []runtime.Object
	for _, rc := range clusters {
		dynObjs = append(dynObjs, rc)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{kuberay.RayClusterGVR: "RayClusterList"}, dynObjs...)
	caches := informer.New(kube, dyn, informer.Config{Namespaces: []string{ns}, Sources: cfg.Sources()})
	rec := record.NewFakeRecorder(100)
	h := &harness{kube: kube, dyn: dyn, recorder: rec}
	h.metrics = metrics.New(func() metrics.Snapshot { return h.ctrl.Snapshot() })
	ctrl, err := New(kube, dyn, caches, rec, h.metrics, zap.NewNop(), cfg, dryRun)
	if err != nil {
		t.Fatal(err)
	}
	h.ctrl = ctrl
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	caches.Start(ctx.Done())
	if !caches.WaitForSync(ctx.Done()) {
		t.Fatal("caches did not sync")
	}
	kube.ClearActions()
	dyn.ClearActions()
	return h
}

// enforceResourceVersions gives the fake clientset the API server's optimistic concurrency for
// Secrets: an update must carry the current resourceVersion, and every write bumps it.
func enforceResourceVersions(kube *fake.Clientset) {
	gvr := corev1.SchemeGroupVersion.WithResource("secrets")
	kube.PrependReactor("update", "secrets", func(a clienttesting.Action) (bool, runtime.Object, error) {
		upd := a.(clienttesting.UpdateAction).GetObject().(*corev1.Secret)
		obj, err := kube.Tracker().Get(gvr, upd.Namespace, upd.Name)
		if err != nil {
			return false, nil, nil // the default reactor answers NotFound
		}
		cur := obj.(*corev1.Secret)
		if upd.ResourceVersion != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(corev1.Resource("secrets"), upd.Name, errors.New("the object has been modified"))
		}
		next := upd.DeepCopy()
		rv, _ := strconv.Atoi(cur.ResourceVersion)
		next.ResourceVersion = strconv.Itoa(rv + 1)
		return true, next, kube.Tracker().Update(gvr, next, next.Namespace)
	})
	kube.PrependReactor("create", "secrets", func(a clienttesting.Action) (bool, runtime.Object, error) {
		s := a.(clienttesting.CreateAction).GetObject().(*corev1.Secret)
		if s.ResourceVersion == "" {
			s.ResourceVersion = "1"
		}
		return false, nil, nil
	})
}

// updateSource replaces the token source's data, as its owner would.
func (h *harness) updateSource(s *corev1.Secret) error {
	cur, err := h.kube.CoreV1().Secrets(s.Namespace).Get(context.Background(), s.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	s.ResourceVersion = cur.ResourceVersion
	_, err = h.kube.CoreV1().Secrets(s.Namespace).Update(context.Background(), s, metav1.UpdateOptions{})
	return err
}

func mustSelector(t testing.TB, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

var rayClusterGVR = kuberay.RayClusterGVR

// restart is a new raysync process (fresh caches, no memory) over the same API state.
func (h *harness) restart(t *testing.T) *harness {
	t.Helper()
	var objs []runtime.Object
	for _, r := range []string{"secrets", "pods"} {
		l, err := h.kube.Tracker().List(corev1.SchemeGroupVersion.WithResource(r), corev1.SchemeGroupVersion.WithKind(""), "")
		if err != nil {
			t.Fatal(err)
		}
		items, _ := meta.ExtractList(l)
		objs = append(objs, items...)
	}
	ul, err := h.dyn.Resource(rayClusterGVR).Namespace(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var clusters []*unstructured.Unstructured
	for i := range ul.Items {
		clusters = append(clusters, &ul.Items[i])
	}
	return newDryRunHarness(t, h.ctrl.apply.dryRun, h.ctrl.cfg, clusters, objs...)
}

// syncUntilQuiet reconciles a cluster until a pass writes nothing (at most 5 passes), waiting for the
// caches to catch up between passes as the queue would.
func (h *harness) syncUntilQuiet(t *testing.T, name string) {
	t.Helper()
	for i := 0; i < 5; i++ {
		before := len(h.allActions())
		_ = h.ctrl.syncCluster(context.Background(), informer.Key{Kind: informer.ClusterKey, Namespace: ns, Name: name})
		if len(h.allActions()) == before {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (h *harness) allActions() []clienttesting.Action {
	return append(h.kube.Actions(), h.dyn.Actions()...)
}

// allWrites lists every write to the API as "verb resource name".
func (h *harness) allWrites() []string {
	var out []string
	for _, a := range h.allActions() {
		var name string
		switch a.GetVerb() {
		case "create", "update":
			name = a.(clienttesting.CreateAction).GetObject().(metav1.Object).GetName()
		case "delete", "patch":
			name = a.(interface{ GetName() string }).GetName()
		default:
			continue
		}
		out = append(out, a.GetVerb()+" "+a.GetResource().Resource+" "+name)
	}
	return out
}

func testutilValue(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

func (h *harness) sync(t *testing.T, name string) {
	t.Helper()
	if err := h.ctrl.syncCluster(context.Background(), informer.Key{Kind: informer.ClusterKey, Namespace: ns, Name: name}); err != nil {
		t.Fatalf("syncCluster: %v", err)
	}
}

// writes returns the verbs and names of every Secret write the controller made.
func (h *harness) writes() []string {
	var out []string
	for _, a := range h.kube.Actions() {
		switch a.GetVerb() {
		case "create", "update":
			out = append(out, a.GetVerb()+" "+a.(clienttesting.CreateAction).GetObject().(metav1.Object).GetName())
		case "delete", "patch":
			out = append(out, a.GetVerb()+" "+a.(interface{ GetName() string }).GetName())
		}
	}
	return out
}

func (h *harness) events() []string {
	var out []string
	for {
		select {
		case e := <-h.recorder.Events:
			out = append(out, e)
		default:
			return out
		}
	}
}

func (h *harness) secret(t *testing.T, name string) *corev1.Secret {
	t.Helper()
	s, err := h.kube.CoreV1().Secrets(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return s
}

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
		"generated, foreign unlabelled Secret: refused after AlreadyExists": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken})},
			cluster:  "c1", wantWrites: []string{"create c1"}, wantEvent: names.ReasonTargetNotOwned, wantToken: map[string]string{"c1": oldToken},
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
		"referenced, foreign Secret: refused": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}))},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": oldToken})},
			cluster:  "c1", wantWrites: []string{"create shared"}, wantEvent: names.ReasonTargetNotOwned, wantToken: map[string]string{"shared": oldToken},
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
	want := map[string]string{names.SourceAnnotation: tokenSrc.String(), names.TokenSHA256Annotation: tokenDigest([]byte(token)),
		names.SyncedAtAnnotation: "2026-11-29T12:00:00Z"}
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
	h.ctrl.syncSource(tokenSrc)
	h.ctrl.syncSource(tokenSrc)
	if rotations() != 0 {
		t.Fatalf("first observation counted as rotation")
	}
	// A new token value is one rotation; an invalid value in between is not.
	if err := h.updateSource(sourceSecret(" bad")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { s, _ := h.ctrl.caches.Source(tokenSrc); return string(s.Data["auth_token"]) == " bad" })
	h.ctrl.syncSource(tokenSrc)
	if ev := h.events(); len(ev) != 1 || !strings.Contains(ev[0], names.ReasonSourceInvalid) || strings.Contains(ev[0], " bad") {
		t.Fatalf("want one SourceInvalid event without the value, got %v", ev)
	}
	h.ctrl.syncSource(tokenSrc)
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
	h.ctrl.syncSource(tokenSrc)
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
	syncedAt := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	pod := func(name, cluster string, opts ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Labels: map[string]string{kuberay.ClusterLabel: cluster, kuberay.NodeTypeLabel: "head"}}}
		for _, o := range opts {
			o(p)
		}
		return p
	}
	h := newHarness(t, false,
		[]*unstructured.Unstructured{rayCluster("in"), rayCluster("out"), rayCluster("foreign"), rayCluster("absent"), rayCluster("plain", withAuth(nil))},
		sourceSecret(token),
		secret(ns, "in", map[string]string{"auth_token": token}, ownedBy("in"), withSecretAnnotation(names.SyncedAtAnnotation, syncedAt.Format(time.RFC3339Nano))),
		secret(ns, "out", map[string]string{"auth_token": oldToken}, ownedBy("out")),
		secret(ns, "foreign", map[string]string{"auth_token": oldToken}, ownedBy("foreign"), func(s *corev1.Secret) { s.OwnerReferences[0].UID = "x" }),
		pod("in-head", "in", started(syncedAt.Add(-time.Minute))),
		pod("in-worker", "in", started(syncedAt.Add(time.Minute))),
		pod("in-pending", "in"),
	)
	snap := h.ctrl.Snapshot()
	got := map[string]string{}
	for _, s := range snap.Targets {
		got[s.RayCluster] = s.Kind + "/" + s.State
	}
	want := map[string]string{
		"in": "auth_token/in_sync", "out": "auth_token/out_of_sync", "foreign": "auth_token/not_owned", "absent": "auth_token/out_of_sync",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("targets = %v, want %v", got, want)
	}
	stale := map[string]int{}
	for _, s := range snap.StalePods {
		stale[s.RayCluster+"/"+s.Reason] = s.Count
	}
	if stale["in/token"] != 1 || stale["out/token"] != 0 || len(stale) != 4 {
		t.Errorf("stale pods = %v, want in/token=1 and zeros for the other token targets", stale)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(5 * time.Millisecond)
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
		err := apierrors.NewForbidden(corev1.Resource("secrets"), "c1", fmt.Errorf("unable to create new content in namespace %s because it is being terminated", ns))
		err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}
		return true, nil, err
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
