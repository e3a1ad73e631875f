package projection

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Reporter says where every source and in-scope RayCluster stands, from the same plans the
// controller acts on: the metrics collector (every scrape, on standbys too) and `syncer status` read it.
type Reporter struct {
	gather *gatherer
	now    func() time.Time

	mu     sync.Mutex
	drifts map[types.UID]*driftMemo // the template checks of the last scrape (scrape is its number)
	scrape uint64
}

// driftMemo is one cluster's template check: templates only change with the cluster's
// resourceVersion, and walking 1,000 clusters' templates on every scrape is most of its cost.
type driftMemo struct {
	resourceVersion string
	cfg             podtemplate.Config
	drift           podtemplate.Missing
	err             error
	scrape          uint64 // the last scrape that used it
}

// ControlStatus is what the control ConfigMap says, as `syncer status` reports it.
type ControlStatus struct {
	Paused bool       `json:"paused"`
	Reason string     `json:"reason,omitempty"`
	Since  *time.Time `json:"pausedSince,omitempty"`
	// AdoptAll and Adopt are the namespaces adopted as a whole.
	AdoptAll bool     `json:"adoptAll,omitempty"`
	Adopt    []string `json:"adoptNamespaces,omitempty"`
	// Problems are values raysync cannot read, each with the reading it applied.
	Problems []string `json:"problems,omitempty"`
}

// Control reads the control ConfigMap.
func (r *Reporter) Control() ControlStatus {
	if !r.gather.caches.ControlReadable() {
		return controlStatus(unreadableControl(r.gather.cfg.Control.String()))
	}
	return controlStatus(readControl(r.gather.caches.Control()))
}

func controlStatus(c control) ControlStatus {
	out := ControlStatus{Paused: c.paused, Reason: c.reason, AdoptAll: c.adoptAll, Adopt: slices.Sorted(maps.Keys(c.adopt)), Problems: c.problems}
	if !c.since.IsZero() {
		since := c.since.UTC()
		out.Since = &since
	}
	return out
}

// NewReporter reports over caches without a controller (`syncer status`).
func NewReporter(caches *informer.Caches, cfg Config) *Reporter {
	return &Reporter{gather: &gatherer{caches: caches, cfg: cfg.withDefaults(), memory: newMemory()}, now: time.Now}
}

// Status computes the sources' validity and every managed cluster's state.
func (r *Reporter) Status() ([]metrics.SourceState, []ClusterStatus) {
	now := r.now()
	sources := r.gather.sources(now)
	var states []metrics.SourceState
	for _, s := range sources.all() {
		states = append(states, metrics.SourceState{Source: s.name.String(), Valid: s.valid(), NotAfter: s.cert.NotAfter})
	}
	clusters := r.gather.caches.RayClusters("")
	out := make([]ClusterStatus, 0, len(clusters))
	// One scrape at a time: the memo is updated in place rather than rebuilt (1,000 entries a scrape).
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.drifts == nil {
		r.drifts = map[types.UID]*driftMemo{}
	}
	r.scrape++
	memo := func(rc *unstructured.Unstructured, tc podtemplate.Config) (podtemplate.Missing, error) {
		m := r.drifts[rc.GetUID()]
		if m == nil || m.resourceVersion != rc.GetResourceVersion() || !sameTemplateConfig(m.cfg, tc) {
			m = &driftMemo{resourceVersion: rc.GetResourceVersion(), cfg: tc}
			m.drift, m.err = podtemplate.Drift(rc, tc)
			r.drifts[rc.GetUID()] = m
		}
		m.scrape = r.scrape
		return m.drift, m.err
	}
	for _, rc := range clusters {
		if !r.gather.cfg.managed(rc) {
			continue
		}
		in := r.gather.cluster(rc, sources, now)
		in.drift = memo
		in.reportOnly = true
		out = append(out, planCluster(in, r.gather.cfg).Status)
	}
	// Only the clusters of this scrape stay: the memo never outgrows the caches.
	maps.DeleteFunc(r.drifts, func(_ types.UID, m *driftMemo) bool { return m.scrape != r.scrape })
	return states, out
}

func sameTemplateConfig(a, b podtemplate.Config) bool {
	if !slices.Equal(a.PullSecrets, b.PullSecrets) || (a.TLS == nil) != (b.TLS == nil) {
		return false
	}
	if a.TLS == nil {
		return true
	}
	x, y := a.TLS, b.TLS
	return x.SecretName == y.SecretName && x.MountPath == y.MountPath && x.HasCA == y.HasCA &&
		(x.APIServer == nil) == (y.APIServer == nil) && (x.APIServer == nil || *x.APIServer == *y.APIServer)
}

// Snapshot is Status in the shape of the scrape-time collector.
func (r *Reporter) Snapshot() metrics.Snapshot {
	sources, clusters := r.Status()
	var targets, stale, rotations int // sized exactly: at 1,000 clusters these lists are most of a scrape's bytes
	for _, st := range clusters {
		for _, s := range [...]string{st.Token, st.PullSecret, st.AutoscalerTLS} {
			if s != "" {
				targets++
			}
		}
		stale += len(st.StalePods)
		if st.Rotation != nil {
			rotations++
		}
	}
	snap := metrics.Snapshot{Sources: sources, Targets: make([]metrics.TargetState, 0, targets),
		StalePods: make([]metrics.StalePods, 0, stale), Rotations: make([]metrics.RotationState, 0, rotations), Now: r.now(),
		Paused: r.Control().Paused}
	for _, st := range clusters {
		for _, t := range []struct {
			kind  names.Kind
			state string
		}{{names.KindAuthToken, st.Token}, {names.KindPullSecret, st.PullSecret}, {names.KindAutoscalerTLS, st.AutoscalerTLS}} {
			if t.state != "" {
				snap.Targets = append(snap.Targets, metrics.TargetState{Namespace: st.Namespace, RayCluster: st.RayCluster, Kind: string(t.kind), State: t.state})
			}
		}
		for reason, n := range st.StalePods {
			snap.StalePods = append(snap.StalePods, metrics.StalePods{Namespace: st.Namespace, RayCluster: st.RayCluster, Reason: reason, Count: n})
		}
		if st.Deferred {
			snap.Deferred = append(snap.Deferred, metrics.ClusterRef{Namespace: st.Namespace, RayCluster: st.RayCluster})
		}
		if st.Rotation == nil && len(st.Invalid) > 0 {
			snap.InvalidOther++
		}
		if st.Rotation != nil {
			owner := st.OwnerKind
			if owner == "" {
				owner = names.OwnerRayCluster
			}
			rs := metrics.RotationState{Namespace: st.Namespace, RayCluster: st.RayCluster, Kind: string(owner), State: st.Rotation.State,
				Invalid: len(st.Rotation.Invalid) > 0}
			if st.Rotation.Since != nil {
				rs.Since = *st.Rotation.Since
			}
			snap.Rotations = append(snap.Rotations, rs)
		}
	}
	return snap
}

// Display turns a state into the form `syncer status` prints (in-sync, not-owned, …; "-" for none).
func Display(state string) string {
	if state == "" {
		return "-"
	}
	return strings.ReplaceAll(state, "_", "-")
}
