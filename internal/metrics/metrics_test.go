package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raysync/raysync/internal/names"
)

func TestScrapeTimeState(t *testing.T) {
	snap := Snapshot{
		Sources: []SourceState{{Source: "sys/token", Valid: true}},
		Targets: []TargetState{
			{Namespace: "ray", RayCluster: "a", Kind: string(names.KindAuthToken), State: names.StateInSync},
			{Namespace: "ray", RayCluster: "b", Kind: string(names.KindAuthToken), State: names.StateNotOwned},
		},
		StalePods: []StalePods{{Namespace: "ray", RayCluster: "a", Reason: "token", Count: 2}},
	}
	m := New(func() Snapshot { return snap })
	want := `
# HELP raysync_targets In-scope RayClusters by target kind and state.
# TYPE raysync_targets gauge
raysync_targets{kind="auth_token",state="in_sync"} 1
raysync_targets{kind="auth_token",state="not_owned"} 1
raysync_targets{kind="auth_token",state="out_of_sync"} 0
raysync_targets{kind="auth_token",state="source_invalid"} 0
# HELP raysync_target_in_sync 1 if the RayCluster's target of this kind is as raysync wants it (token projected, pull secret or autoscaler TLS in place), else 0.
# TYPE raysync_target_in_sync gauge
raysync_target_in_sync{kind="auth_token",namespace="ray",raycluster="a"} 1
raysync_target_in_sync{kind="auth_token",namespace="ray",raycluster="b"} 0
# HELP raysync_stale_pods Running Ray pods with an outdated token (started before their Secret got it) or lacking a pull secret or the autoscaler TLS.
# TYPE raysync_stale_pods gauge
raysync_stale_pods{namespace="ray",raycluster="a",reason="token"} 2
# HELP raysync_source_valid 1 if the canonical source Secret exists and holds a valid value, else 0 (targets are then left untouched).
# TYPE raysync_source_valid gauge
raysync_source_valid{source="sys/token"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want),
		"raysync_targets", "raysync_target_in_sync", "raysync_stale_pods", "raysync_source_valid"); err != nil {
		t.Fatal(err)
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
		"raysync_pods_recycled_total", "raysync_leader", "go_goroutines", "process_resident_memory_bytes"} {
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
