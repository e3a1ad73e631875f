package informer

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/raysync/raysync/internal/kuberay"
)

type recorder struct {
	mu   sync.Mutex
	keys []Key
}

func (r *recorder) add(k Key) { r.mu.Lock(); r.keys = append(r.keys, k); r.mu.Unlock() }
func (r *recorder) take() []Key {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := r.keys
	r.keys = nil
	return k
}

func rc(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": "uid-" + name}}}
}

// ofService labels a cluster as KubeRay does one a RayService generated.
func ofService(u *unstructured.Unstructured, svc string) *unstructured.Unstructured {
	u.SetLabels(map[string]string{kuberay.OriginatedFromNameLabel: svc, kuberay.OriginatedFromCRDLabel: "RayService"})
	return u
}

// TestEventsBecomeKeys calls each handler as an informer would and checks the keys it enqueues.
func TestEventsBecomeKeys(t *testing.T) {
	src := types.NamespacedName{Namespace: "sys", Name: "token"}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		kuberay.ListKinds, rc("ray", "c1"), ofService(rc("ray", "c2"), "svc"), rc("other", "c3"))
	c := New(fake.NewClientset(), dyn, nil, Config{Sources: []types.NamespacedName{src}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx.Done())
	if !c.WaitForSync(ctx.Done()) {
		t.Fatal("no sync")
	}
	r := &recorder{}
	h := c.handlers(r.add)
	c1, c2 := Key{Kind: ClusterKey, Namespace: "ray", Name: "c1"}, Key{Kind: ClusterKey, Namespace: "ray", Name: "c2"}
	c3 := Key{Kind: ClusterKey, Namespace: "other", Name: "c3"}
	srcKey := Key{Kind: SourceKey, Namespace: "sys", Name: "token"}
	wave := Key{Kind: WaveKey}
	secret := func(rv, value string, labels map[string]string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ray", ResourceVersion: rv, Labels: labels},
			Data: map[string][]byte{"auth_token": []byte(value)}}
	}
	cluster := func(rv string) *unstructured.Unstructured {
		u := rc("ray", "c1")
		u.SetResourceVersion(rv)
		return u
	}
	owned := map[string]string{kuberay.ClusterLabel: "c1"}
	service := func(rv string, annotations map[string]string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayService",
			"metadata": map[string]any{"name": "svc", "namespace": "ray", "uid": "uid-svc", "generation": int64(1)}}}
		u.SetResourceVersion(rv)
		u.SetAnnotations(annotations)
		return u
	}

	tests := []struct {
		name string
		do   func()
		want []Key
	}{
		{"cluster added: the cluster and the wave", func() { h.cluster.OnAdd(cluster("1"), false) }, []Key{c1, wave}},
		{"cluster resync ignored", func() { h.cluster.OnUpdate(cluster("1"), cluster("1")) }, nil},
		{"cluster changed", func() { h.cluster.OnUpdate(cluster("1"), cluster("2")) }, []Key{c1, wave}},
		{"cluster deleted (tombstone): cluster, namespace and wave", func() {
			h.cluster.OnDelete(cache.DeletedFinalStateUnknown{Key: "ray/c1", Obj: cluster("2")})
		}, []Key{c1, {Kind: NamespaceKey, Namespace: "ray"}, wave}},
		{"KubeRay Secret maps to its cluster", func() { h.byClusterLabel.OnAdd(secret("1", "x", owned), false) }, []Key{c1, wave}},
		{"RayService or RayJob status changed: the wave", func() { h.owner.OnUpdate(service("1", nil), service("2", nil)) }, []Key{wave}},
		{"RayService resync: nothing", func() { h.owner.OnUpdate(service("1", nil), service("1", nil)) }, nil},
		// Where its clusters stand changes with its annotations (raysync.dev/rotation, adopt, a
		// replacement given up) and its spec: their plans report it (RotationHeld, NotAdopted).
		{"RayService annotated: its clusters and the wave", func() {
			h.owner.OnUpdate(service("1", nil), service("2", map[string]string{"raysync.dev/rotation-abandoned": "2"}))
		}, []Key{c2, wave}},
		{"RayService spec changed: its clusters and the wave", func() {
			b := service("2", nil)
			b.SetGeneration(2)
			h.owner.OnUpdate(service("1", nil), b)
		}, []Key{c2, wave}},
		{"RayService added: its clusters and the wave", func() { h.owner.OnAdd(service("1", nil), false) }, []Key{c2, wave}},
		{"RayService deleted (tombstone): its clusters and the wave", func() {
			h.owner.OnDelete(cache.DeletedFinalStateUnknown{Key: "ray/svc", Obj: service("2", nil)})
		}, []Key{c2, wave}},
		{"a RayJob of the RayService's name: not its clusters", func() {
			j := service("1", nil)
			j.SetKind("RayJob")
			h.owner.OnAdd(j, false)
		}, []Key{wave}},
		{"KubeRay Secret resync ignored", func() { h.byClusterLabel.OnUpdate(secret("1", "x", owned), secret("1", "x", owned)) }, nil},
		{"unlabelled object ignored", func() { h.byClusterLabel.OnAdd(secret("1", "x", nil), false) }, nil},
		{"managed copy: every cluster in its namespace, then prune, and the fleet (a copy can be a token target the gateway's table reads)",
			func() { h.managedSecret.OnDelete(secret("1", "x", nil)) },
			[]Key{c1, c2, {Kind: NamespaceKey, Namespace: "ray"}, {Kind: WaveKey}}},
		{"source annotation-only change: source only", func() {
			a, b := secret("1", "x", nil), secret("2", "x", nil)
			b.Annotations = map[string]string{"touched": "yes"}
			h.source(src, false).OnUpdate(a, b)
		}, []Key{srcKey}},
		{"source resync: nothing", func() { h.source(src, false).OnUpdate(secret("1", "x", nil), secret("1", "x", nil)) }, nil},
		{"source rotation: source, every cluster, the wave", func() { h.source(src, false).OnUpdate(secret("1", "x", nil), secret("2", "y", nil)) },
			[]Key{srcKey, c1, c2, c3, wave}},
		{"source deleted: source, every cluster, the wave", func() { h.source(src, false).OnDelete(secret("2", "y", nil)) }, []Key{srcKey, c1, c2, c3, wave}},
		// The ledger's marks are decided on: `syncer revoke-previous` is an annotation, and the gateway
		// must refuse the previous token at once; its labels say whether raysync may write it.
		{"ledger annotation-only change (revoke-previous): the ledger's key and the wave", func() {
			a, b := secret("1", "x", nil), secret("2", "x", nil)
			b.Annotations = map[string]string{"raysync.dev/previous-revoked": "7"}
			h.source(src, true).OnUpdate(a, b)
		}, []Key{srcKey, wave}},
		{"ledger label-only change: the ledger's key and the wave", func() {
			h.source(src, true).OnUpdate(secret("1", "x", nil), secret("2", "x", map[string]string{"raysync.dev/managed-by": "raysync"}))
		}, []Key{srcKey, wave}},
		{"ledger resync: nothing", func() { h.source(src, true).OnUpdate(secret("1", "x", nil), secret("1", "x", nil)) }, nil},
		{"ledger content change: as a source's", func() { h.source(src, true).OnUpdate(secret("1", "x", nil), secret("2", "y", nil)) },
			[]Key{srcKey, c1, c2, c3, wave}},
		// The gateway's table: deleted, edited or only relabelled, the wave decides it again.
		{"table deleted: the wave", func() { h.table.OnDelete(secret("2", "y", nil)) }, []Key{wave}},
		{"table annotation-only change: the wave", func() {
			b := secret("2", "y", nil)
			b.Annotations = map[string]string{"raysync.dev/kind": "something-else"}
			h.table.OnUpdate(secret("1", "y", nil), b)
		}, []Key{wave}},
		{"table resync: nothing", func() { h.table.OnUpdate(secret("1", "y", nil), secret("1", "y", nil)) }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r.take()
			tc.do()
			got := r.take()
			sort.Slice(got, func(i, j int) bool { return got[i].String() < got[j].String() })
			want := append([]Key(nil), tc.want...)
			sort.Slice(want, func(i, j int) bool { return want[i].String() < want[j].String() })
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("keys = %v, want %v", got, want)
			}
		})
	}
	if !c.FirstSeen("uid-c1").IsZero() {
		t.Error("first-seen time kept after delete")
	}
	if c.SourceChangedAt(src).IsZero() {
		t.Error("source change time not recorded")
	}
}

func TestHandlerHelpers(t *testing.T) {
	a := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "a", ResourceVersion: "1"}, Data: map[string][]byte{"k": []byte("v")}}
	b := a.DeepCopy()
	if !unchanged(a, b) {
		t.Error("same resourceVersion must be a resync")
	}
	b.ResourceVersion = "2"
	if unchanged(a, b) || !sameContent(a, b) {
		t.Error("new resourceVersion with same data")
	}
	b.Data["k"] = []byte("w")
	if sameContent(a, b) {
		t.Error("different data")
	}
	b.Data = map[string][]byte{"k": []byte("v"), "l": nil}
	if sameContent(a, b) {
		t.Error("extra key")
	}
	if m, ok := metaOf(cache.DeletedFinalStateUnknown{Key: "x/a", Obj: a}); !ok || m.GetName() != "a" {
		t.Error("tombstone not unwrapped")
	}
	if _, ok := metaOf("garbage"); ok {
		t.Error("non-object accepted")
	}
	withMF := a.DeepCopy()
	withMF.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}}
	out, _ := stripManagedFields(withMF)
	if len(out.(*corev1.Secret).ManagedFields) != 0 {
		t.Error("managedFields kept")
	}
}

// TestRaysyncsOwnSecretsAreWatched: the ledger and the gateway's table are watched by name and wired
// to their handlers: a revocation (an annotation) of the ledger and a deleted table reach the wave.
func TestRaysyncsOwnSecretsAreWatched(t *testing.T) {
	src := types.NamespacedName{Namespace: "sys", Name: "token"}
	ledger := types.NamespacedName{Namespace: "sys", Name: "raysync-rotations"}
	table := types.NamespacedName{Namespace: "sys", Name: "raysync-gateway"}
	mk := func(n types.NamespacedName) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: n.Namespace, ResourceVersion: "1"}, Data: map[string][]byte{"k": []byte("v")}}
	}
	kube := fake.NewClientset(mk(src), mk(ledger), mk(table))
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kuberay.ListKinds)
	c := New(kube, dyn, nil, Config{Namespaces: []string{"ray"}, Sources: []types.NamespacedName{src}, Ledger: ledger, Table: table})
	r := &recorder{}
	if err := c.AddEventHandlers(r.add); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.Start(ctx.Done())
	if !c.WaitForSync(ctx.Done()) {
		t.Fatal("no sync")
	}
	for _, n := range []types.NamespacedName{src, ledger, table} {
		if _, ok := c.Source(n); !ok {
			t.Errorf("%s is not cached", n)
		}
	}
	wave := Key{Kind: WaveKey}
	waitKey := func(what string, want Key) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if slices.Contains(r.take(), want) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Errorf("%s: no %s key", what, want)
	}
	r.take()
	revoked := mk(ledger)
	revoked.Annotations = map[string]string{"raysync.dev/previous-revoked": "2"}
	revoked.ResourceVersion = "2" // the fake tracker keeps what it is given
	if _, err := kube.CoreV1().Secrets("sys").Update(ctx, revoked, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKey("the ledger annotated", wave)
	if err := kube.CoreV1().Secrets("sys").Delete(ctx, table.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitKey("the table deleted", wave)
}
