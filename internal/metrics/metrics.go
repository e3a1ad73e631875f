// Package metrics defines every Prometheus metric raysync exports. Per-object state is computed at
// scrape time from the informer caches (through a Snapshot function), so a deleted RayCluster or
// namespace leaves no stale series behind.
package metrics

import (
	"maps"
	"regexp"
	"sync"
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

// RotationState is one cluster's token rotation state at scrape time.
type RotationState struct {
	Namespace, RayCluster string
	Kind                  string // RayService, RayJob or RayCluster (standalone)
	State                 string // names.Token*
	Since                 time.Time
	// Invalid: a raysync annotation on the cluster (or its owner) has a value raysync cannot read.
	Invalid bool
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
	// Rotations are the clusters whose token raysync manages, by rotation state.
	Rotations []RotationState
	// Paused: the control ConfigMap stops the wave (no replacement or restart starts).
	Paused bool
	// InvalidOther counts the clusters with an unreadable raysync annotation that have no rotation
	// state (no token auth); those with one say it in Rotations.
	InvalidOther int
	// Now is when the snapshot was taken (ages are measured from it).
	Now time.Time
	// Standby: this replica does not lead, so it exports no cluster or source state (the leader does):
	// with several replicas every sum() and per-cluster alert counts each cluster once.
	Standby bool
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
	// PodsStartedWithout counts running Ray pods first seen lacking raysync's entries, by what they lack.
	PodsStartedWithout *prometheus.CounterVec
	// Leader is 1 while this replica holds the lease and writes (always 1 without leader election).
	Leader prometheus.Gauge
	// RotationsStarted counts replacements and restarts raysync performed, by action.
	RotationsStarted *prometheus.CounterVec
	// RotationDuration is how long a replacement or restart took, from start to completion.
	RotationDuration prometheus.Histogram
	// RotationsAbandoned counts restarts raysync gave up (resuming the cluster on the token it had), by reason.
	RotationsAbandoned *prometheus.CounterVec
	// Admission counts the webhook's answers by resource and result; AdmissionDuration times them.
	Admission         *prometheus.CounterVec
	AdmissionDuration *prometheus.HistogramVec
	// WebhookCertExpiry is when the webhook's serving certificate expires (0 while it has none).
	WebhookCertExpiry prometheus.Gauge

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
		RotationsStarted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_rotations_performed_total",
			Help: "Replacements (a RayService's cluster) and restarts (a whole RayCluster) raysync started to move running clusters to a new token.",
		}, []string{"action"}),
		RotationsAbandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_rotations_abandoned_total",
			Help: "Restarts and replacements raysync gave up, by reason: cannot_move (every pod of a restart gone, but its Secret cannot take the new token), timeout (a restart still suspended after --rotation-timeout), unmanaged (raysync no longer manages the cluster), no_new_cluster (a replacement whose RayService showed no new cluster within 2 minutes). A restart given up resumes the cluster on the token it had.",
		}, []string{"reason"}),
		RotationDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "raysync_rotation_duration_seconds",
			Help:    "Time from starting a replacement or restart to the cluster serving on the new token (old cluster gone, or restarted cluster ready).",
			Buckets: prometheus.ExponentialBuckets(5, 2, 12), // 5 s … ~2.8 h
		}),
		Admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_admission_requests_total",
			Help: "Admission requests the webhook answered (always allowed, never with a token), by resource and result: mutated (a pod), created (raysync created the cluster's auth Secret itself), unchanged, skipped, invalid (unreadable, or over the webhook's limits), busy (no room in its memory budget: answered 503).",
		}, []string{"resource", "result"}),
		AdmissionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "raysync_admission_duration_seconds",
			Help:    "Time the webhook took to answer an admission request, by resource.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 1.5, 24), // 0.1 ms … 1.1 s
		}, []string{"resource"}),
		WebhookCertExpiry: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "raysync_webhook_cert_expiry_timestamp_seconds",
			Help: "Unix time at which the webhook's serving certificate expires (raysync renews its own a third of its life ahead).",
		}),
		PodsRecycled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_pods_recycled_total",
			Help: "Ray pods deleted so KubeRay recreates them: never-started ones from the fixed template, by missing entry (pull_secret, autoscaler_tls), and ones whose containers started around raysync's write of their auth Secret and may hold its earlier token (auth_token).",
		}, []string{"reason"}),
		PodsStartedWithout: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_pods_started_without_config_total",
			Help: "Running Ray pods raysync found lacking its pull secret or autoscaler TLS (created before the template was fixed, and not through the webhook), each counted once, by missing entry.",
		}, []string{"reason"}),
	}
	for _, r := range []string{names.StalePullSecret, names.StaleAutoscalerTLS} {
		m.PodsRecycled.WithLabelValues(r)
		m.PodsStartedWithout.WithLabelValues(r)
	}
	m.PodsRecycled.WithLabelValues(names.RecycledAuthToken)
	for _, r := range names.Results {
		m.Syncs.WithLabelValues(r)
	}
	for _, a := range []string{names.PolicyReplace, names.PolicyRestart} {
		m.RotationsStarted.WithLabelValues(a)
	}
	for _, r := range names.AbandonReasons {
		m.RotationsAbandoned.WithLabelValues(r)
	}
	for _, r := range []string{"pods", "secrets"} {
		for _, res := range names.AdmitResults {
			m.Admission.WithLabelValues(r, res)
		}
	}
	m.own = []prometheus.Collector{m.Rotations, m.LastRotation, m.Syncs, m.Propagation, m.TemplateReapplied, m.PodsRecycled, m.PodsStartedWithout, m.Leader,
		m.RotationsStarted, m.RotationsAbandoned, m.RotationDuration, m.Admission, m.AdmissionDuration, m.WebhookCertExpiry, &stateCollector{snapshot: snapshot}}
	m.own = append(m.own, clientGoCollectors...)
	m.Registry.MustRegister(m.Rotations, m.LastRotation, m.Syncs, m.Propagation, m.TemplateReapplied, m.PodsRecycled, m.PodsStartedWithout, m.Leader,
		m.RotationsStarted, m.RotationsAbandoned, m.RotationDuration, m.Admission, m.AdmissionDuration, m.WebhookCertExpiry, &stateCollector{snapshot: snapshot},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	registerClientGo(m.Registry)
	return m
}

// Names lists every raysync_* metric name the registry can export (histograms as their base name),
// whether or not it has a series yet. Dashboards and alerts are checked against it.
func (m *Metrics) Names() []string { return describe(m.own) }

func describe(own []prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range own {
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
		"Running Ray pods lacking a pull secret or the autoscaler TLS (they pick it up when restarted).",
		[]string{"namespace", "raycluster", "reason"}, nil)
	rotationClustersDesc = prometheus.NewDesc("raysync_rotation_clusters",
		"RayClusters by owner kind and token rotation state: current, behind (running on an older token), not_adopted (running on a token raysync did not write, and not adopted: raysync moves nothing of it), rotating (being replaced or restarted), blocked (rotating longer than --rotation-timeout).",
		[]string{"kind", "state"}, nil)
	pausedDesc = prometheus.NewDesc("raysync_rotation_paused",
		"1 while the control ConfigMap stops the wave: no replacement or restart starts (those in flight finish); projection, pull secrets and TLS go on.", nil, nil)
	invalidDesc = prometheus.NewDesc("raysync_invalid_annotations",
		"In-scope RayClusters with a raysync annotation (on them or their RayService or RayJob) whose value raysync cannot read; it applies the safest reading (Event InvalidAnnotation).", nil, nil)
	oldestBehindDesc = prometheus.NewDesc("raysync_rotation_oldest_behind_seconds",
		"How long the cluster longest behind the current canonical token has been behind (0 when none is).", nil, nil)
	certExpiryDesc = prometheus.NewDesc("raysync_autoscaler_client_cert_expiry_timestamp_seconds",
		"Unix time at which the autoscaler client certificate in the source expires.", []string{"source"}, nil)
	deferredDesc = prometheus.NewDesc("raysync_template_deferred",
		"1 while a template patch waits because upgradeStrategy Recreate would restart running pods.",
		[]string{"namespace", "raycluster"}, nil)
)

type stateCollector struct {
	snapshot func() Snapshot

	// One scrape at a time: series keeps the metrics built for the last one, so that a series whose
	// labels and value did not change is not built again (building one is most of a scrape's
	// allocations: 1,000 clusters have ~6,000 series, nearly all unchanged between scrapes).
	mu     sync.Mutex
	series map[seriesKey]*builtSeries
	scrape uint64
}

// seriesKey is a series: its descriptor and label values (at most three, unused ones "").
type seriesKey struct {
	desc   *prometheus.Desc
	labels [3]string
}

type builtSeries struct {
	value  float64
	metric prometheus.Metric
	scrape uint64 // the last scrape that exported it
}

// gauge is prometheus.MustNewConstMetric(desc, GaugeValue, v, labels[:n]...), reused from the last
// scrape when it had the same series with the same value.
func (c *stateCollector) gauge(desc *prometheus.Desc, v float64, n int, labels [3]string) prometheus.Metric {
	k := seriesKey{desc: desc, labels: labels}
	b := c.series[k]
	if b == nil || b.value != v {
		b = &builtSeries{value: v, metric: prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels[:n]...)}
		c.series[k] = b
	}
	b.scrape = c.scrape
	return b.metric
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- sourceValidDesc
	ch <- targetInSyncDesc
	ch <- targetsDesc
	ch <- stalePodsDesc
	ch <- certExpiryDesc
	ch <- deferredDesc
	ch <- rotationClustersDesc
	ch <- oldestBehindDesc
	ch <- pausedDesc
	ch <- invalidDesc
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	if s.Standby {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.series == nil {
		c.series = map[seriesKey]*builtSeries{}
	}
	c.scrape++
	for _, src := range s.Sources {
		ch <- c.gauge(sourceValidDesc, boolFloat(src.Valid), 1, [3]string{src.Source})
		if !src.NotAfter.IsZero() {
			ch <- c.gauge(certExpiryDesc, float64(src.NotAfter.Unix()), 1, [3]string{src.Source})
		}
	}
	counts := map[[2]string]int{}
	kinds := map[string]bool{string(names.KindAuthToken): true}
	for _, t := range s.Targets {
		counts[[2]string{t.Kind, t.State}]++
		kinds[t.Kind] = true
		ch <- c.gauge(targetInSyncDesc, boolFloat(names.AsWanted(t.State)), 3, [3]string{t.Namespace, t.RayCluster, t.Kind})
	}
	for kind := range kinds {
		for _, st := range names.States {
			ch <- c.gauge(targetsDesc, float64(counts[[2]string{kind, st}]), 2, [3]string{kind, st})
		}
	}
	for _, p := range s.StalePods {
		ch <- c.gauge(stalePodsDesc, float64(p.Count), 3, [3]string{p.Namespace, p.RayCluster, p.Reason})
	}
	for _, d := range s.Deferred {
		ch <- c.gauge(deferredDesc, 1, 2, [3]string{d.Namespace, d.RayCluster})
	}
	rotations := map[[2]string]int{}
	var oldest time.Time
	invalid := s.InvalidOther
	for _, r := range s.Rotations {
		rotations[[2]string{r.Kind, r.State}]++
		if r.Invalid {
			invalid++
		}
		if (r.State == names.TokenBehind || r.State == names.TokenBlocked) && !r.Since.IsZero() && (oldest.IsZero() || r.Since.Before(oldest)) {
			oldest = r.Since
		}
	}
	for _, kind := range names.OwnerKinds {
		for _, st := range names.TokenStates {
			k := string(kind)
			ch <- c.gauge(rotationClustersDesc, float64(rotations[[2]string{k, st}]), 2, [3]string{k, st})
		}
	}
	age := 0.0
	if !oldest.IsZero() && s.Now.After(oldest) {
		age = s.Now.Sub(oldest).Seconds()
	}
	ch <- c.gauge(oldestBehindDesc, age, 0, [3]string{})
	ch <- c.gauge(pausedDesc, boolFloat(s.Paused), 0, [3]string{})
	ch <- c.gauge(invalidDesc, float64(invalid), 0, [3]string{})
	// Series of clusters gone since the last scrape are dropped: the memory never outgrows the caches.
	maps.DeleteFunc(c.series, func(_ seriesKey, b *builtSeries) bool { return b.scrape != c.scrape })
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
