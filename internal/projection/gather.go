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
	"github.com/raysync/raysync/internal/names"
)

// gatherer reads what a decision needs from the informer caches and raysync's memory. It makes no
// API call.
type gatherer struct {
	caches *informer.Caches
	cfg    Config
	memory *memory
	parsed sourceParses
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

// released gathers the clusters raysync does not manage (out of scope or skipped) that still carry a
// restart raysync started: the wave resumes them, so none stays suspended once raysync lets it go.
func (g *gatherer) released(now time.Time) []clusterView {
	var out []clusterView
	var sources *sourceView
	for _, rc := range g.caches.RayClusters("") {
		if g.cfg.InScope(rc) || startedAt(rc).IsZero() {
			continue
		}
		if sources == nil {
			sources = g.sources(now)
		}
		in := &ClusterInput{Cluster: rc, Sources: sources, Pods: g.caches.Pods(rc.GetNamespace(), rc.GetName()), Now: now}
		out = append(out, clusterView{in: in, released: true})
	}
	return out
}

// sources reads and validates every configured source.
func (g *gatherer) sources(now time.Time) *sourceView {
	v := readSourcesWith(g.cfg, func(n types.NamespacedName) *corev1.Secret {
		// the sources and the ledger are all watched by name
		s, _ := g.caches.Source(n)
		return s
	}, now, &g.parsed)
	v.control = readControl(g.caches.Control())
	if !g.caches.ControlReadable() {
		v.control = unreadableControl(g.cfg.Control.String())
	}
	return v
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
	case names.OwnerRayService:
		in.Owner, _ = g.caches.RayService(ns, owner)
	case names.OwnerRayJob:
		in.Owner, _ = g.caches.RayJob(ns, owner)
	}
	if obj := gatewayAddressOwner(in); g.cfg.Gateway.Service != "" && obj != nil {
		in.GatewayAddress, _ = g.caches.Service(ns, gatewayAddressName(obj))
	}
	if t, ok, err := TokenTargetFor(rc, g.cfg.Source); err == nil && ok && !t.IsSource {
		in.targetName = t.Name
		if t.Mode == Generated {
			in.Target, _ = g.caches.ClusterSecret(ns, t.Name)
		} else {
			in.Target, _ = g.caches.ManagedSecret(ns, t.Name)
		}
		if in.Target == nil {
			g.markForeign(in, t.Name, t.Mode == Generated)
		}
		in.Readers, in.SharedWith, in.sharedRecords = g.readers(ns, t.Name, name)
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
		g.markForeign(in, src.name.Name, false)
		return
	}
	in.setCopy(c)
}

// markForeign records that the Secret named name in the cluster's namespace, which the data caches
// do not hold, exists and is not raysync's: the metadata cache of every Secret says so alike on every
// replica. A generated target labelled ray.io/cluster is KubeRay's, merely not cached yet.
func (g *gatherer) markForeign(in *ClusterInput, name string, generated bool) {
	m, ok := g.caches.SecretMeta(in.Cluster.GetNamespace(), name)
	if !ok || m.Labels[names.ManagedByLabel] == names.ManagedByValue || (generated && m.Labels[kuberay.ClusterLabel] != "") {
		return
	}
	if in.Foreign == nil {
		in.Foreign = map[string]bool{}
	}
	in.Foreign[name] = true
}

// readers are the pods of the other RayClusters in ns whose pods read their token from secret
// (selected or not), and those clusters' names: whether it may have been read is decided over all of them.
func (g *gatherer) readers(ns, secret, self string) (pods []*corev1.Pod, clusters []string, records map[string]tokenRecord) {
	for _, rc := range g.caches.ClustersReading(ns, secret) {
		if rc.GetName() != self {
			pods = append(pods, g.caches.Pods(ns, rc.GetName())...)
			clusters = append(clusters, rc.GetName())
			if records == nil {
				records = map[string]tokenRecord{}
			}
			records[rc.GetName()] = recordOf(rc)
		}
	}
	slices.Sort(clusters)
	return pods, clusters, records
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
			in.setCopy(s)
		}
	}
}

func clusterKey(ns, name string) informer.Key {
	return informer.Key{Kind: informer.ClusterKey, Namespace: ns, Name: name}
}
