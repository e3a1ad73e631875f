package projection

import (
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
)

// gatherer reads what a decision needs from the informer caches and raysync's memory. It makes no
// API call, except through lookup, which only `syncer status` sets: a one-shot report reads the
// Secrets the caches do not hold (foreign ones) to tell "not owned" from "missing".
type gatherer struct {
	caches *informer.Caches
	cfg    Config
	memory *memory
	lookup func(ns, name string) *corev1.Secret
	// watchingSince (Unix nanoseconds) is when the controller began acting on the caches; 0 for a
	// one-shot report, which writes nothing.
	watchingSince atomic.Int64
}

// views gathers and plans every cluster in scope, those being deleted included (a replacement is
// done only once the old cluster is gone): what the wave decides on.
func (g *gatherer) views(now time.Time) []clusterView {
	sources := g.sources(now)
	var out []clusterView
	for _, rc := range g.caches.RayClusters("") {
		if !g.cfg.InScope(rc) {
			continue
		}
		in := g.cluster(rc, sources, now)
		out = append(out, clusterView{in: in, plan: planCluster(in, g.cfg)})
	}
	return out
}

// sources reads and validates every configured source.
func (g *gatherer) sources(now time.Time) *sourceView {
	return readSources(g.cfg, func(n types.NamespacedName) *corev1.Secret {
		// the sources and the ledger are all watched by name
		s, _ := g.caches.Source(n)
		return s
	}, now)
}

// cluster reads everything the decision about rc needs.
func (g *gatherer) cluster(rc *unstructured.Unstructured, sources *sourceView, now time.Time) *ClusterInput {
	ns, name := rc.GetNamespace(), rc.GetName()
	in := &ClusterInput{Cluster: rc, Sources: sources, Pods: g.caches.Pods(ns, name), Now: now,
		Memory: g.memory.of(clusterKey(ns, name), rc.GetUID())}
	if since := g.watchingSince.Load(); since != 0 {
		in.WatchingSince = time.Unix(0, since)
	}
	switch owner := metaString(rc, "labels", kuberay.OriginatedFromNameLabel); ownerKind(rc) {
	case "RayService":
		in.Owner, _ = g.caches.RayService(ns, owner)
	case "RayJob":
		in.Owner, _ = g.caches.RayJob(ns, owner)
	}
	if t, ok, err := TokenTargetFor(rc, g.cfg.Source); err == nil && ok && !t.IsSource {
		in.targetName = t.Name
		if t.Mode == Generated {
			in.Target, _ = g.caches.ClusterSecret(ns, t.Name)
		} else {
			in.Target, _ = g.caches.ManagedSecret(ns, t.Name)
		}
		if in.Target == nil {
			in.Target = g.live(ns, t.Name)
		}
	}
	if !g.cfg.Pods.enabled() {
		return in
	}
	for _, src := range sources.pull {
		g.readCopy(in, src)
	}
	if sources.tls != nil {
		g.readCopy(in, *sources.tls)
	}
	return in
}

func (g *gatherer) readCopy(in *ClusterInput, src source) {
	ns := in.Cluster.GetNamespace()
	if src.name.Namespace == ns {
		return
	}
	c, _ := g.caches.ManagedSecret(ns, src.name.Name)
	if c == nil {
		c = g.live(ns, src.name.Name)
	}
	if c == nil {
		return
	}
	if in.Copies == nil {
		in.Copies = map[string]*corev1.Secret{}
	}
	in.Copies[src.name.Name] = c
}

func (g *gatherer) live(ns, name string) *corev1.Secret {
	if g.lookup == nil {
		return nil
	}
	return g.lookup(ns, name)
}

// see puts a Secret read from the API (a create found its name taken) in place of what the caches
// lacked: as the token target, as a copy of a pod source, or both.
func (in *ClusterInput) see(s *corev1.Secret) {
	if s.Name == in.targetName && in.Target == nil {
		in.Target = s
	}
	podSources := slices.Clip(in.Sources.pull)
	if in.Sources.tls != nil {
		podSources = append(podSources, *in.Sources.tls)
	}
	for _, src := range podSources {
		if src.name.Name == s.Name && src.name.Namespace != s.Namespace {
			if in.Copies == nil {
				in.Copies = map[string]*corev1.Secret{}
			}
			in.Copies[s.Name] = s
		}
	}
}

func clusterKey(ns, name string) informer.Key {
	return informer.Key{Kind: informer.ClusterKey, Namespace: ns, Name: name}
}
