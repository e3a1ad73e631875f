package standin

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// AnnotationSecretCache on a namespace makes the stand-in read that namespace's Secrets for env and
// pull credentials as the real kubelet's default Watch-based secret manager does, instead of live:
// "watch" for the watch as fast as the API server delivers it, or a Go duration ("800ms") by which
// every watch event reaches the store late (a slow watch).
const AnnotationSecretCache = "standin.raysync.dev/secret-cache"

// watchedSecrets is the kubelet's Watch-based secret manager (kubernetes v1.37
// pkg/kubelet/util/manager/watch_based_manager.go) for the namespaces that ask for it: the first
// reference to a Secret starts one reflector for it (a fresh list); Get waits up to 1 s for that
// first sync, then returns whatever the reflector's store holds, with no freshness check against a
// write that just happened. Reflectors run for the stand-in's lifetime. Other namespaces, and every
// ConfigMap, are read live.
type watchedSecrets struct {
	live liveObjects
	nsl  corelisters.NamespaceLister
	stop <-chan struct{}

	mu   sync.Mutex
	refs map[string]*secretReflector
}

type secretReflector struct {
	synced chan struct{}

	mu      sync.Mutex
	obj     *corev1.Secret // nil: no such Secret
	seq     uint64         // events received
	applied uint64         // the newest event in obj
}

func newWatchedSecrets(kube kubernetes.Interface, nsl corelisters.NamespaceLister, stop <-chan struct{}) *watchedSecrets {
	return &watchedSecrets{live: liveObjects{kube}, nsl: nsl, stop: stop, refs: map[string]*secretReflector{}}
}

// cacheLag says whether the namespace's Secrets go through the watch, and each event's extra delay.
func (w *watchedSecrets) cacheLag(namespace string) (bool, time.Duration) {
	ns, err := w.nsl.Get(namespace)
	if err != nil {
		return false, 0
	}
	v, ok := ns.Annotations[AnnotationSecretCache]
	switch {
	case !ok:
		return false, 0
	case v == "watch":
		return true, 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return false, 0
	}
	return true, d
}

func (w *watchedSecrets) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return w.live.ConfigMap(ctx, ns, name)
}

func (w *watchedSecrets) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	watched, lag := w.cacheLag(ns)
	if !watched {
		return w.live.Secret(ctx, ns, name)
	}
	key := ns + "/" + name
	w.mu.Lock()
	r := w.refs[key]
	if r == nil {
		r = w.reflect(ns, name, lag)
		w.refs[key] = r
	}
	w.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-r.synced:
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.obj == nil {
		return nil, apierrors.NewNotFound(corev1.Resource("secrets"), name)
	}
	return r.obj.DeepCopy(), nil
}

// reflect starts the reflector of one Secret. Events before its first sync (the list) land at once;
// later ones lag late, in the order they came.
func (w *watchedSecrets) reflect(ns, name string, lag time.Duration) *secretReflector {
	r := &secretReflector{synced: make(chan struct{})}
	byName := fields.OneTermEqualSelector("metadata.name", name).String()
	factory := informers.NewSharedInformerFactoryWithOptions(w.live.kube, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = byName }))
	informer := factory.Core().V1().Secrets().Informer()
	set := func(obj any) {
		s, _ := obj.(*corev1.Secret)
		if s != nil && s.Name != name {
			return
		}
		r.mu.Lock()
		r.seq++
		seq := r.seq
		r.mu.Unlock()
		apply := func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if seq > r.applied {
				r.obj, r.applied = s, seq
			}
		}
		select {
		case <-r.synced:
			if lag > 0 {
				time.AfterFunc(lag, apply)
				return
			}
		default:
		}
		apply()
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { set(obj) },
		UpdateFunc: func(_, obj any) { set(obj) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*corev1.Secret); ok && s.Name == name {
				set(nil)
			}
		},
	})
	factory.Start(w.stop)
	go func() {
		if cache.WaitForCacheSync(w.stop, informer.HasSynced) {
			close(r.synced)
		}
	}()
	return r
}
