package projection

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
)

// gatherer reads what a decision needs from the informer caches and raysync's memory. It makes no
// API call, except through lookup, which only `syncer status` sets: a one-shot report reads the
// Secrets the caches do not hold (foreign ones) to tell "not owned" from "missing".
type gatherer struct {
	caches *informer.Caches
	cfg    Config
	memory *memory
	lookup func(ns, name string) *corev1.Secret
}

// sources reads and validates every configured source.
func (g *gatherer) sources(now time.Time) *sourceView {
	return readSources(g.cfg, func(n types.NamespacedName) *corev1.Secret {
		s, _ := g.caches.Source(n)
		return s
	}, now)
}

// cluster reads everything the decision about rc needs.
func (g *gatherer) cluster(rc *unstructured.Unstructured, sources *sourceView, now time.Time) *ClusterInput {
	ns, name := rc.GetNamespace(), rc.GetName()
	in := &ClusterInput{Cluster: rc, Sources: sources, Pods: g.caches.Pods(ns, name), Now: now,
		Memory: g.memory.of(clusterKey(ns, name), rc.GetUID())}
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
