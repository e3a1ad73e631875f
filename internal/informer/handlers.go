package informer

import (
	"bytes"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/raysync/raysync/internal/kuberay"
)

// AddEventHandlers turns watch events into keys. Handlers never read the API server and never
// change objects; they only record when something was first seen and enqueue.
func (c *Caches) AddEventHandlers(enqueue func(Key)) error {
	clusterKey := func(obj any) (Key, bool) {
		m, ok := metaOf(obj)
		if !ok {
			return Key{}, false
		}
		return Key{Kind: ClusterKey, Namespace: m.GetNamespace(), Name: m.GetName()}, true
	}
	for _, s := range c.scopes {
		if _, err := s.clusters.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				if m, ok := metaOf(obj); ok {
					c.firstSeen.LoadOrStore(m.GetUID(), time.Now())
				}
				if k, ok := clusterKey(obj); ok {
					enqueue(k)
				}
			},
			UpdateFunc: func(old, cur any) {
				if unchanged(old, cur) {
					return
				}
				if k, ok := clusterKey(cur); ok {
					enqueue(k)
				}
			},
			DeleteFunc: func(obj any) {
				m, ok := metaOf(obj)
				if !ok {
					return
				}
				c.firstSeen.Delete(m.GetUID())
				enqueue(Key{Kind: ClusterKey, Namespace: m.GetNamespace(), Name: m.GetName()})
				enqueue(Key{Kind: NamespaceKey, Namespace: m.GetNamespace()})
			},
		}); err != nil {
			return err
		}
		// KubeRay's Secret or a Ray pod changed: reconcile the cluster it belongs to.
		byClusterLabel := func(obj any) {
			if m, ok := metaOf(obj); ok {
				if name := m.GetLabels()[kuberay.ClusterLabel]; name != "" {
					enqueue(Key{Kind: ClusterKey, Namespace: m.GetNamespace(), Name: name})
				}
			}
		}
		for _, inf := range []cache.SharedIndexInformer{s.clusterSecrets, s.pods} {
			if _, err := inf.AddEventHandler(onChange(byClusterLabel)); err != nil {
				return err
			}
		}
		// A managed copy changed: every cluster in its namespace may reference it; prune may apply.
		byNamespace := func(obj any) {
			m, ok := metaOf(obj)
			if !ok {
				return
			}
			for _, rc := range c.RayClusters(m.GetNamespace()) {
				enqueue(Key{Kind: ClusterKey, Namespace: rc.GetNamespace(), Name: rc.GetName()})
			}
			enqueue(Key{Kind: NamespaceKey, Namespace: m.GetNamespace()})
		}
		if _, err := s.managedSecrets.AddEventHandler(onChange(byNamespace)); err != nil {
			return err
		}
	}
	for src, inf := range c.sources {
		srcKey := Key{Kind: SourceKey, Namespace: src.Namespace, Name: src.Name}
		everything := func() {
			enqueue(srcKey)
			for _, rc := range c.RayClusters("") {
				enqueue(Key{Kind: ClusterKey, Namespace: rc.GetNamespace(), Name: rc.GetName()})
			}
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { c.sourceChanged(src); everything() },
			UpdateFunc: func(old, cur any) {
				o, ok1 := old.(*corev1.Secret)
				n, ok2 := cur.(*corev1.Secret)
				if ok1 && ok2 && sameContent(o, n) {
					// Labels, annotations, resyncs: nothing any target depends on. Still re-validate
					// cheaply so metrics reflect the object, but fan out to no cluster.
					if o.ResourceVersion != n.ResourceVersion {
						enqueue(srcKey)
					}
					return
				}
				c.sourceChanged(src)
				everything()
			},
			DeleteFunc: func(any) { c.sourceChanged(src); everything() },
		}); err != nil {
			return err
		}
	}
	return nil
}

func (c *Caches) sourceChanged(src types.NamespacedName) {
	c.sourceChangedAt.Store(src, time.Now())
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
