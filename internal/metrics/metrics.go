// Package metrics defines every Prometheus metric raysync exports. Per-object state is computed at
// scrape time from the informer caches (through a Snapshot function), so a deleted RayCluster or
// namespace leaves no stale series behind.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Target states, as in raysync_targets{state}.
const (
	StateInSync        = "in_sync"
	StateOutOfSync     = "out_of_sync"
	StateNotOwned      = "not_owned"
	StateSourceInvalid = "source_invalid"
)

// States lists every target state, so raysync_targets reports zeros instead of missing series.
var States = []string{StateInSync, StateOutOfSync, StateNotOwned, StateSourceInvalid}

// Sync results, as in raysync_sync_total{result}.
const (
	ResultCreated   = "created"
	ResultUpdated   = "updated"
	ResultUnchanged = "unchanged"
	ResultRefused   = "refused"
	ResultError     = "error"
)

// TargetState is one RayCluster's projection state at scrape time.
type TargetState struct {
	Namespace, RayCluster string
	State                 string
	StalePods             int
}

// SourceState is one canonical source's validity at scrape time.
type SourceState struct {
	Source string // NAMESPACE/NAME
	Valid  bool
}

// Snapshot is what the scrape-time collector reports.
type Snapshot struct {
	Sources []SourceState
	Targets []TargetState
}

// Metrics holds raysync's registry and the instruments the controller updates.
type Metrics struct {
	Registry     *prometheus.Registry
	Rotations    *prometheus.CounterVec
	LastRotation *prometheus.GaugeVec
	Syncs        *prometheus.CounterVec
	Propagation  prometheus.Histogram
}

// New registers every raysync metric, the Go and process collectors, and a collector that calls
// snapshot on each scrape.
func New(snapshot func() Snapshot) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Rotations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_source_rotations_total",
			Help: "Content changes of a canonical source observed by raysync (each propagates to every target).",
		}, []string{"source"}),
		LastRotation: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "raysync_source_last_rotation_timestamp_seconds",
			Help: "Unix time at which raysync last observed a content change of the source.",
		}, []string{"source"}),
		Syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_sync_total",
			Help: "Target reconciliations by result: created, updated, unchanged, refused (target not owned), error.",
		}, []string{"result"}),
		Propagation: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "raysync_propagation_seconds",
			Help:    "Time from raysync seeing a source change or a new RayCluster to the successful target write.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 17), // 1 ms … 65 s
		}),
	}
	for _, r := range []string{ResultCreated, ResultUpdated, ResultUnchanged, ResultRefused, ResultError} {
		m.Syncs.WithLabelValues(r)
	}
	m.Registry.MustRegister(m.Rotations, m.LastRotation, m.Syncs, m.Propagation,
		&stateCollector{snapshot: snapshot},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	registerClientGo(m.Registry)
	return m
}

var (
	sourceValidDesc = prometheus.NewDesc("raysync_source_valid",
		"1 if the canonical source Secret exists and holds a valid value, else 0 (targets are then left untouched).",
		[]string{"source"}, nil)
	targetInSyncDesc = prometheus.NewDesc("raysync_target_in_sync",
		"1 if the RayCluster's token target holds the canonical token, else 0.",
		[]string{"namespace", "raycluster"}, nil)
	targetsDesc = prometheus.NewDesc("raysync_targets",
		"In-scope RayClusters by target state.", []string{"state"}, nil)
	stalePodsDesc = prometheus.NewDesc("raysync_stale_pods",
		"Ray pods whose containers started before their target received the token it now holds.",
		[]string{"namespace", "raycluster"}, nil)
)

type stateCollector struct{ snapshot func() Snapshot }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sourceValidDesc
	ch <- targetInSyncDesc
	ch <- targetsDesc
	ch <- stalePodsDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	for _, src := range s.Sources {
		ch <- prometheus.MustNewConstMetric(sourceValidDesc, prometheus.GaugeValue, boolFloat(src.Valid), src.Source)
	}
	counts := map[string]int{}
	for _, t := range s.Targets {
		counts[t.State]++
		ch <- prometheus.MustNewConstMetric(targetInSyncDesc, prometheus.GaugeValue, boolFloat(t.State == StateInSync), t.Namespace, t.RayCluster)
		ch <- prometheus.MustNewConstMetric(stalePodsDesc, prometheus.GaugeValue, float64(t.StalePods), t.Namespace, t.RayCluster)
	}
	for _, st := range States {
		ch <- prometheus.MustNewConstMetric(targetsDesc, prometheus.GaugeValue, float64(counts[st]), st)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
