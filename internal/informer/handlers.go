package informer

import (
	"bytes"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// AddEventHandlers turns watch events into keys. Handlers never read the API server and never
// change objects; they only record when something was first seen and enqueue.
func (c *Caches) AddEventHandlers(enqueue func(Key)) error {
	h := c.handlers(enqueue)
	for _, s := range c.scopes {
		for inf, handler := range map[cache.SharedIndexInformer]cache.ResourceEventHandler{
			s.clusters: h.cluster, s.clusterSecrets: h.byClusterLabel, s.pods: h.byClusterLabel, s.managedSecrets: h.managedSecret,
			s.services: h.owner, s.jobs: h.owner, s.secretNames: h.secretName,
		} {
			if _, err := inf.AddEventHandler(handler); err != nil {
				return err
			}
		}
		if s.addresses != nil {
			if _, err := s.addresses.AddEventHandler(h.address); err != nil {
				return err
			}
		}
	}
	for src, inf := range c.sources {
		handler := h.source(src, src == c.cfg.Ledger)
		if src == c.cfg.Table {
			handler = h.table // the flags give it a Secret of its own
		}
		if _, err := inf.AddEventHandler(handler); err != nil {
			return err
		}
	}
	if c.control != nil {
		// A pause or an adoption concerns the wave; the clusters' Events (NotAdopted) follow theirs.
		if _, err := c.control.AddEventHandler(onChange(func(any) {
			for _, rc := range c.RayClusters("") {
				enqueue(Key{Kind: ClusterKey, Namespace: rc.GetNamespace(), Name: rc.GetName()})
			}
			enqueue(waveKey)
		})); err != nil {
			return err
		}
	}
	return nil
}

type handlers struct {
	cluster        cache.ResourceEventHandler
	byClusterLabel cache.ResourceEventHandler
	managedSecret  cache.ResourceEventHandler
	owner          cache.ResourceEventHandler
	secretName     cache.ResourceEventHandler
	address        cache.ResourceEventHandler
	// source handles a Secret watched by name; marksMatter: its labels and annotations are decided on
	// too (the ledger: the revocation of the previous token, whether it is raysync's).
	source func(src types.NamespacedName, marksMatter bool) cache.ResourceEventHandler
	table  cache.ResourceEventHandler
}

// waveKey: the fleet's rotation decision. Every change a rotation can depend on enqueues it; the
// queue holds it once however many changes arrive.
var waveKey = Key{Kind: WaveKey}

func (c *Caches) handlers(enqueue func(Key)) handlers {
	clusterKey := func(m metav1.Object) Key {
		return Key{Kind: ClusterKey, Namespace: m.GetNamespace(), Name: m.GetName()}
	}
	return handlers{
		cluster: cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				if m, ok := metaOf(obj); ok {
					c.firstSeen.LoadOrStore(m.GetUID(), time.Now())
					enqueue(clusterKey(m))
					enqueue(waveKey)
				}
			},
			UpdateFunc: func(old, cur any) {
				if m, ok := metaOf(cur); ok && !unchanged(old, cur) {
					enqueue(clusterKey(m))
					enqueue(waveKey)
				}
			},
			DeleteFunc: func(obj any) {
				if m, ok := metaOf(obj); ok {
					c.firstSeen.Delete(m.GetUID())
					enqueue(clusterKey(m))
					enqueue(Key{Kind: NamespaceKey, Namespace: m.GetNamespace()})
					enqueue(waveKey)
				}
			},
		},
		// KubeRay's Secret or a Ray pod changed: reconcile the cluster it belongs to.
		byClusterLabel: onChange(func(obj any) {
			if m, ok := metaOf(obj); ok {
				if name := m.GetLabels()[kuberay.ClusterLabel]; name != "" {
					enqueue(Key{Kind: ClusterKey, Namespace: m.GetNamespace(), Name: name})
					enqueue(waveKey)
				}
			}
		}),
		// A RayService or RayJob changed: whether its clusters may rotate, or have, may have changed
		// (the wave). A change of its annotations or spec (a rotation policy, an adoption, a replacement
		// given up, an upgrade strategy) also changes where each of its clusters stands, which a
		// cluster's own plan reports (status, Events): its clusters too. Status-only changes, which
		// KubeRay writes often, concern the wave alone.
		owner: cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) { c.ownedClusters(obj, enqueue); enqueue(waveKey) },
			UpdateFunc: func(old, cur any) {
				if unchanged(old, cur) {
					return
				}
				if o, ok1 := metaOf(old); !ok1 || !sameOwnerIntent(o, cur) {
					c.ownedClusters(cur, enqueue)
				}
				enqueue(waveKey)
			},
			DeleteFunc: func(obj any) { c.ownedClusters(obj, enqueue); enqueue(waveKey) },
		},
		// A Service named like a gateway address appeared, changed or went: the clusters of its namespace.
		address: onChange(func(obj any) {
			if m, ok := metaOf(obj); ok && strings.HasSuffix(m.GetName(), "-gw") {
				for _, rc := range c.RayClusters(m.GetNamespace()) {
					enqueue(clusterKey(rc))
				}
			}
		}),
		// A Secret appeared, went or changed hands: the clusters reading a Secret of that name, and for a
		// pod source's name every cluster in the namespace, may now create, use or refuse it.
		secretName: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.secretNameChanged(obj, enqueue) },
			DeleteFunc: func(obj any) { c.secretNameChanged(obj, enqueue) },
			UpdateFunc: func(old, cur any) {
				o, ok1 := metaOf(old)
				n, ok2 := metaOf(cur)
				if ok1 && ok2 && (o.GetLabels()[names.ManagedByLabel] != n.GetLabels()[names.ManagedByLabel] ||
					o.GetLabels()[kuberay.ClusterLabel] != n.GetLabels()[kuberay.ClusterLabel]) {
					c.secretNameChanged(cur, enqueue)
				}
			},
		},
		// A managed copy changed: any cluster in its namespace may reference it, and prune may apply.
		managedSecret: onChange(func(obj any) {
			m, ok := metaOf(obj)
			if !ok {
				return
			}
			for _, rc := range c.RayClusters(m.GetNamespace()) {
				enqueue(clusterKey(rc))
			}
			enqueue(Key{Kind: NamespaceKey, Namespace: m.GetNamespace()})
			enqueue(waveKey) // a copy can be a token target: the gateway's table reads it
		}),
		// The gateway's table changed (raysync's own write, or someone deleting or editing it): the wave
		// plans it again and puts it back when it is not what it should be.
		table: onChange(func(any) { enqueue(waveKey) }),
		source: func(src types.NamespacedName, marksMatter bool) cache.ResourceEventHandler {
			srcKey := Key{Kind: SourceKey, Namespace: src.Namespace, Name: src.Name}
			everything := func() {
				c.sourceChangedAt.Store(src, time.Now())
				enqueue(srcKey)
				for _, rc := range c.RayClusters("") {
					enqueue(clusterKey(rc))
				}
				enqueue(waveKey)
			}
			return cache.ResourceEventHandlerFuncs{
				AddFunc: func(any) { everything() },
				UpdateFunc: func(old, cur any) {
					o, ok1 := old.(*corev1.Secret)
					n, ok2 := cur.(*corev1.Secret)
					if ok1 && ok2 && sameContent(o, n) {
						// Labels, annotations, resyncs: no target depends on a source's. Re-validate it
						// (cheap) so its metrics follow the object, but fan out to no cluster. The
						// ledger's marks say what the gateway accepts and whether raysync may write it.
						if o.ResourceVersion != n.ResourceVersion {
							enqueue(srcKey)
							if marksMatter {
								enqueue(waveKey)
							}
						}
						return
					}
					everything()
				},
				DeleteFunc: func(any) { everything() },
			}
		},
	}
}

func (c *Caches) secretNameChanged(obj any, enqueue func(Key)) {
	m, ok := metaOf(obj)
	if !ok {
		return
	}
	ns, name := m.GetNamespace(), m.GetName()
	for _, rc := range c.ClustersReading(ns, name) {
		enqueue(Key{Kind: ClusterKey, Namespace: ns, Name: rc.GetName()})
	}
	if c.sourceNames[name] {
		for _, rc := range c.RayClusters(ns) {
			enqueue(Key{Kind: ClusterKey, Namespace: ns, Name: rc.GetName()})
		}
	}
}

// onChange calls f on add, delete and every update that changed the object.
func onChange(f func(any)) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: f,
		UpdateFunc: func(old, cur any) {
			if !unchanged(old, cur) {
				f(cur)
			}
		},
		DeleteFunc: f,
	}
}

// ownedClusters enqueues the clusters a RayService or RayJob generated (KubeRay's originated-from
// labels, as the planner finds a cluster's owner).
func (c *Caches) ownedClusters(obj any, enqueue func(Key)) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	kind := m.GetKind()
	for _, rc := range c.RayClusters(m.GetNamespace()) {
		l := rc.GetLabels()
		if l[kuberay.OriginatedFromNameLabel] == m.GetName() && (kind == "" || l[kuberay.OriginatedFromCRDLabel] == kind) {
			enqueue(Key{Kind: ClusterKey, Namespace: rc.GetNamespace(), Name: rc.GetName()})
		}
	}
}

// sameOwnerIntent: old and cur (a RayService or RayJob) differ at most in status: same annotations,
// same generation (the spec).
func sameOwnerIntent(old metav1.Object, cur any) bool {
	n, ok := metaOf(cur)
	return ok && old.GetGeneration() == n.GetGeneration() && maps.Equal(old.GetAnnotations(), n.GetAnnotations())
}

// unchanged is true for periodic resyncs, which redeliver an object with the same resourceVersion.
func unchanged(old, cur any) bool {
	o, ok1 := metaOf(old)
	n, ok2 := metaOf(cur)
	return ok1 && ok2 && o.GetResourceVersion() == n.GetResourceVersion()
}

// metaOf unwraps delete tombstones.
func metaOf(obj any) (metav1.Object, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	m, ok := obj.(metav1.Object)
	return m, ok
}

func sameContent(a, b *corev1.Secret) bool {
	if a.Type != b.Type || len(a.Data) != len(b.Data) {
		return false
	}
	for k, v := range a.Data {
		w, ok := b.Data[k]
		if !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}
