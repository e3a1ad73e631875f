// Package metrics defines every Prometheus metric raysync exports. Per-object state is computed at
// scrape time from the informer caches (through a Snapshot function), so a deleted RayCluster or
// namespace leaves no stale series behind.
package metrics

import (
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/raysync/raysync/internal/names"
)

// TargetState is one RayCluster's state for one kind of target at scrape time.
type TargetState struct {
	Namespace, RayCluster string
	Kind                  string
	State                 string
}

// StalePods counts one cluster's pods that run with an outdated token or lack a pod-level entry.
type StalePods struct {
	Namespace, RayCluster string
	Reason                string // token, pull_secret, autoscaler_tls
	Count                 int
}

// SourceState is one source's validity at scrape time; NotAfter is set for a valid client certificate.
type SourceState struct {
	Source   string // NAMESPACE/NAME
	Valid    bool
	NotAfter time.Time
}

// ClusterRef names a RayCluster.
type ClusterRef struct{ Namespace, RayCluster string }

// Snapshot is what the scrape-time collector reports.
type Snapshot struct {
	Sources   []SourceState
	Targets   []TargetState
	StalePods []StalePods
	// Deferred are clusters whose template patch waits (upgradeStrategy Recreate with running pods).
	Deferred []ClusterRef
}

// SourcesConfigured gives every per-source counter a series at 0 for each configured source, so
// dashboards and increase() see no gap after a restart (Prometheus' instrumentation practice).
func (m *Metrics) SourcesConfigured(sources ...string) {
	for _, s := range sources {
		m.Rotations.WithLabelValues(s)
	}
}

// Metrics holds raysync's registry and the instruments the controller updates.
type Metrics struct {
	Registry     *prometheus.Registry
	Rotations    *prometheus.CounterVec
	LastRotation *prometheus.GaugeVec
	Syncs        *prometheus.CounterVec
	Propagation  prometheus.Histogram
	// TemplateReapplied counts template patches that put back entries raysync had already applied.
	TemplateReapplied prometheus.Counter
	PodsRecycled      *prometheus.CounterVec
	// Leader is 1 while this replica holds the lease and writes (always 1 without leader election).
	Leader prometheus.Gauge

	own []prometheus.Collector // raysync's own collectors (for Names)
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
		TemplateReapplied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "raysync_template_reapplied_total",
			Help: "RayCluster template patches that restored raysync's entries after someone (usually KubeRay) removed them.",
		}),
		Leader: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "raysync_leader",
			Help: "1 while this replica is the leader (the only one that writes), else 0.",
		}),
		PodsRecycled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_pods_recycled_total",
			Help: "Pending Ray pods deleted so KubeRay recreates them from the fixed template, by missing entry.",
		}, []string{"reason"}),
	}
	for _, r := range []string{names.StalePullSecret, names.StaleAutoscalerTLS} {
		m.PodsRecycled.WithLabelValues(r)
	}
	for _, r := range names.Results {
		m.Syncs.WithLabelValues(r)
	}
	m.own = []prometheus.Collector{m.Rotations, m.LastRotation, m.Syncs, m.Propagation, m.TemplateReapplied, m.PodsRecycled, m.Leader,
		&stateCollector{snapshot: snapshot}}
	m.own = append(m.own, clientGoCollectors...)
	m.Registry.MustRegister(m.Rotations, m.LastRotation, m.Syncs, m.Propagation, m.TemplateReapplied, m.PodsRecycled, m.Leader,
		&stateCollector{snapshot: snapshot},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	registerClientGo(m.Registry)
	return m
}

// Names lists every raysync_* metric name the registry can export (histograms as their base name),
// whether or not it has a series yet. Dashboards and alerts are checked against it.
func (m *Metrics) Names() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range m.own {
			c.Describe(ch)
		}
		close(ch)
	}()
	var names []string
	for d := range ch {
		if match := fqName.FindStringSubmatch(d.String()); match != nil {
			names = append(names, match[1])
		}
	}
	return names
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

var (
	sourceValidDesc = prometheus.NewDesc("raysync_source_valid",
		"1 if the canonical source Secret exists and holds a valid value, else 0 (targets are then left untouched).",
		[]string{"source"}, nil)
	targetInSyncDesc = prometheus.NewDesc("raysync_target_in_sync",
		"1 if the RayCluster's target of this kind is as raysync wants it (token projected, pull secret or autoscaler TLS in place), else 0.",
		[]string{"namespace", "raycluster", "kind"}, nil)
	targetsDesc = prometheus.NewDesc("raysync_targets",
		"In-scope RayClusters by target kind and state.", []string{"kind", "state"}, nil)
	stalePodsDesc = prometheus.NewDesc("raysync_stale_pods",
		"Running Ray pods with an outdated token (started before their Secret got it) or lacking a pull secret or the autoscaler TLS.",
		[]string{"namespace", "raycluster", "reason"}, nil)
	certExpiryDesc = prometheus.NewDesc("raysync_autoscaler_client_cert_expiry_timestamp_seconds",
		"Unix time at which the autoscaler client certificate in the source expires.", []string{"source"}, nil)
	deferredDesc = prometheus.NewDesc("raysync_template_deferred",
		"1 while a template patch waits because upgradeStrategy Recreate would restart running pods.",
		[]string{"namespace", "raycluster"}, nil)
)

type stateCollector struct{ snapshot func() Snapshot }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sourceValidDesc
	ch <- targetInSyncDesc
	ch <- targetsDesc
	ch <- stalePodsDesc
	ch <- certExpiryDesc
	ch <- deferredDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	for _, src := range s.Sources {
		ch <- prometheus.MustNewConstMetric(sourceValidDesc, prometheus.GaugeValue, boolFloat(src.Valid), src.Source)
		if !src.NotAfter.IsZero() {
			ch <- prometheus.MustNewConstMetric(certExpiryDesc, prometheus.GaugeValue, float64(src.NotAfter.Unix()), src.Source)
		}
	}
	counts := map[[2]string]int{}
	kinds := map[string]bool{string(names.KindAuthToken): true}
	for _, t := range s.Targets {
		counts[[2]string{t.Kind, t.State}]++
		kinds[t.Kind] = true
		ch <- prometheus.MustNewConstMetric(targetInSyncDesc, prometheus.GaugeValue, boolFloat(t.State == names.StateInSync), t.Namespace, t.RayCluster, t.Kind)
	}
	for kind := range kinds {
		for _, st := range names.States {
			ch <- prometheus.MustNewConstMetric(targetsDesc, prometheus.GaugeValue, float64(counts[[2]string{kind, st}]), kind, st)
		}
	}
	for _, p := range s.StalePods {
		ch <- prometheus.MustNewConstMetric(stalePodsDesc, prometheus.GaugeValue, float64(p.Count), p.Namespace, p.RayCluster, p.Reason)
	}
	for _, d := range s.Deferred {
		ch <- prometheus.MustNewConstMetric(deferredDesc, prometheus.GaugeValue, 1, d.Namespace, d.RayCluster)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
