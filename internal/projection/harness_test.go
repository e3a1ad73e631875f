package projection

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
)

// The harness runs a controller over client-go fakes with synced informer caches.

type harness struct {
	ctrl     *Controller
	kube     *fake.Clientset
	dyn      *dynamicfake.FakeDynamicClient
	recorder *record.FakeRecorder
	metrics  *metrics.Metrics
	// standby makes the metrics see a standby's snapshot (the allocation budget of the exposition).
	standby bool
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
	return buildHarness(t, dryRun, cfg, clusters, nil, objs...)
}

// buildHarness is newDryRunHarness with setup run on the fake clientset before the caches start
// (reactors that must see the first watches).
func buildHarness(t testing.TB, dryRun bool, cfg Config, clusters []*unstructured.Unstructured, setup func(*fake.Clientset), objs ...runtime.Object) *harness {
	t.Helper()
	kube := fake.NewClientset(objs...)
	enforceResourceVersions(kube)
	if setup != nil {
		setup(kube)
	}
	scheme := runtime.NewScheme()
	var dynObjs []runtime.Object
	for _, rc := range clusters {
		dynObjs = append(dynObjs, rc)
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		kuberay.ListKinds, dynObjs...)
	caches := informer.New(kube, dyn, nil, cfg.Watches([]string{ns}))
	rec := record.NewFakeRecorder(100)
	h := &harness{kube: kube, dyn: dyn, recorder: rec}
	h.metrics = metrics.New(func() metrics.Snapshot {
		if h.standby {
			return metrics.Snapshot{Standby: true}
		}
		return h.ctrl.Snapshot()
	})
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
