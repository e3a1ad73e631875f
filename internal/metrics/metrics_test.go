package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raysync/raysync/internal/names"
)

func TestScrapeTimeState(t *testing.T) {
	snap := Snapshot{
		Sources: []SourceState{{Source: "sys/token", Valid: true}},
		Targets: []TargetState{
			{Namespace: "ray", RayCluster: "a", Kind: string(names.KindAuthToken), State: names.StateInSync},
			{Namespace: "ray", RayCluster: "b", Kind: string(names.KindAuthToken), State: names.StateNotOwned},
			// behind, its target kept on the token its containers run on: as raysync wants it
			{Namespace: "ray", RayCluster: "c", Kind: string(names.KindAuthToken), State: names.StateFrozen},
		},
		StalePods: []StalePods{{Namespace: "ray", RayCluster: "a", Reason: "pull_secret", Count: 2}},
		Rotations: []RotationState{
			{Namespace: "ray", RayCluster: "a", Kind: "RayService", State: names.TokenCurrent},
			{Namespace: "ray", RayCluster: "b", Kind: "RayCluster", State: names.TokenBehind, Since: time.Unix(1000, 0)},
			{Namespace: "ray", RayCluster: "c", Kind: "RayCluster", State: names.TokenBlocked, Since: time.Unix(1100, 0), Invalid: true},
		},
		InvalidOther: 1, // a cluster without token auth with an unreadable raysync annotation
		Now:          time.Unix(1600, 0),
	}
	m := New(func() Snapshot { return snap })
	want := `
# HELP raysync_targets In-scope RayClusters by target kind and state.
# TYPE raysync_targets gauge
raysync_targets{kind="auth_token",state="frozen"} 1
raysync_targets{kind="auth_token",state="in_sync"} 1
raysync_targets{kind="auth_token",state="missing"} 0
raysync_targets{kind="auth_token",state="not_owned"} 1
raysync_targets{kind="auth_token",state="out_of_sync"} 0
raysync_targets{kind="auth_token",state="source_invalid"} 0
# HELP raysync_target_in_sync 1 if the RayCluster's target of this kind is as raysync wants it (token projected, pull secret or autoscaler TLS in place), else 0.
# TYPE raysync_target_in_sync gauge
raysync_target_in_sync{kind="auth_token",namespace="ray",raycluster="a"} 1
raysync_target_in_sync{kind="auth_token",namespace="ray",raycluster="b"} 0
raysync_target_in_sync{kind="auth_token",namespace="ray",raycluster="c"} 1
# HELP raysync_stale_pods Running Ray pods lacking a pull secret or the autoscaler TLS (they pick it up when restarted).
# TYPE raysync_stale_pods gauge
raysync_stale_pods{namespace="ray",raycluster="a",reason="pull_secret"} 2
# HELP raysync_rotation_oldest_behind_seconds How long the cluster longest behind the current canonical token has been behind (0 when none is).
# TYPE raysync_rotation_oldest_behind_seconds gauge
raysync_rotation_oldest_behind_seconds 600
# HELP raysync_source_valid 1 if the canonical source Secret exists and holds a valid value, else 0 (targets are then left untouched).
# TYPE raysync_source_valid gauge
raysync_source_valid{source="sys/token"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"raysync_targets", "raysync_target_in_sync", "raysync_stale_pods", "raysync_source_valid"); err != nil {
		t.Fatal(err)
	}
	if v := testutil.ToFloat64(gaugeOf(t, m, "raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "behind"})); v != 1 {
		t.Errorf("raysync_rotation_clusters{kind=RayCluster,state=behind} = %v, want 1", v)
	}
	if n := testutil.CollectAndCount(m.Registry, "raysync_rotation_clusters"); n != 15 {
		t.Errorf("raysync_rotation_clusters has %d series, want 15 (3 kinds x 5 states, zeros included)", n)
	}
	if v := testutil.ToFloat64(gaugeOf(t, m, "raysync_invalid_annotations", nil)); v != 2 {
		t.Errorf("raysync_invalid_annotations = %v, want 2 (one with a rotation state, one without)", v)
	}
	// A cluster that disappears from the caches leaves no series.
	snap.Targets = snap.Targets[:1]
	if n := testutil.CollectAndCount(m.Registry, "raysync_target_in_sync"); n != 1 {
		t.Fatalf("series after delete = %d", n)
	}
}

func TestEveryMetricIsRegistered(t *testing.T) {
	m := New(func() Snapshot {
		return Snapshot{Sources: []SourceState{{Source: "a/b", Valid: true, NotAfter: time.Unix(1e9, 0)}},
			Targets:   []TargetState{{Namespace: "n", RayCluster: "c", Kind: string(names.KindPullSecret), State: names.StateOutOfSync}},
			StalePods: []StalePods{{Namespace: "n", RayCluster: "c", Reason: "pull_secret"}},
			Deferred:  []ClusterRef{{Namespace: "n", RayCluster: "c"}}}
	})
	m.PodsRecycled.WithLabelValues("pull_secret")
	m.Rotations.WithLabelValues("a/b")
	m.LastRotation.WithLabelValues("a/b")
	m.RotationDuration.Observe(30)
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fams {
		have[f.GetName()] = true
	}
	for _, name := range []string{"raysync_source_valid", "raysync_source_rotations_total", "raysync_source_last_rotation_timestamp_seconds",
		"raysync_target_in_sync", "raysync_targets", "raysync_stale_pods", "raysync_sync_total", "raysync_propagation_seconds",
		"raysync_autoscaler_client_cert_expiry_timestamp_seconds", "raysync_template_deferred", "raysync_template_reapplied_total",
		"raysync_pods_recycled_total", "raysync_leader", "raysync_rotation_clusters", "raysync_rotation_oldest_behind_seconds",
		"raysync_rotations_performed_total", "raysync_rotation_duration_seconds", "go_goroutines", "process_resident_memory_bytes"} {
		if !have[name] {
			t.Errorf("%s not exported", name)
		}
	}
	// A second registry (tests, benchmarks) must not panic on the process-global client-go hooks.
	New(func() Snapshot { return Snapshot{} })
}

func TestNamesListsEveryRaysyncMetric(t *testing.T) {
	names := strings.Join(New(func() Snapshot { return Snapshot{} }).Names(), " ")
	for _, n := range []string{"raysync_targets", "raysync_propagation_seconds", "raysync_workqueue_depth", "raysync_rest_client_requests_total", "raysync_leader"} {
		if !strings.Contains(" "+names+" ", " "+n+" ") {
			t.Errorf("Names() lacks %s: %s", n, names)
		}
	}
}

// gaugeOf picks one series of a gathered family as a collector testutil can read.
func gaugeOf(t *testing.T, m *Metrics, name string, labels map[string]string) prometheus.Collector {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "x"}, func() float64 { return mt.GetGauge().GetValue() })
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return nil
}

// A standby exports no cluster or source state: with two replicas every sum counts each cluster once.
func TestStandbyExportsNoState(t *testing.T) {
	snap := Snapshot{Standby: true, Sources: []SourceState{{Source: "sys/token", Valid: true}},
		Targets:   []TargetState{{Namespace: "ray", RayCluster: "a", Kind: "auth_token", State: "in_sync"}},
		Rotations: []RotationState{{Namespace: "ray", RayCluster: "a", Kind: "RayCluster", State: "behind"}}}
	if n := testutil.CollectAndCount(&stateCollector{snapshot: func() Snapshot { return snap }}); n != 0 {
		t.Errorf("a standby exported %d state series", n)
	}
	snap.Standby = false
	if n := testutil.CollectAndCount(&stateCollector{snapshot: func() Snapshot { return snap }}); n == 0 {
		t.Error("the leader exported no state")
	}
}

// TestSeriesFollowEachScrape: the series the collector keeps between scrapes change with their value,
// and a cluster gone since the last scrape leaves no series behind.
func TestSeriesFollowEachScrape(t *testing.T) {
	snap := Snapshot{Targets: []TargetState{
		{Namespace: "ray", RayCluster: "a", Kind: string(names.KindAuthToken), State: names.StateInSync},
		{Namespace: "ray", RayCluster: "b", Kind: string(names.KindAuthToken), State: names.StateInSync},
	}}
	m := New(func() Snapshot { return snap })
	text := func() string {
		var b strings.Builder
		families, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "raysync_target_in_sync" {
				for _, s := range f.Metric {
					b.WriteString(s.Label[2].GetValue() + "=" + strings.TrimSuffix(s.String(), "\n") + ";")
				}
			}
		}
		return b.String()
	}
	first := text()
	if !strings.Contains(first, `value:"a"`) || !strings.Contains(first, `value:"b"`) || strings.Count(first, "value:1") != 2 {
		t.Fatalf("first scrape: %s", first)
	}
	snap.Targets = []TargetState{{Namespace: "ray", RayCluster: "a", Kind: string(names.KindAuthToken), State: names.StateOutOfSync}}
	second := text()
	if strings.Contains(second, `value:"b"`) || !strings.Contains(second, "value:0") || strings.Contains(second, "value:1") {
		t.Fatalf("second scrape (b gone, a out of sync): %s", second)
	}
}
