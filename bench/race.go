package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// raceNamespace is the only namespace the KubeRay operator watches (--watch-namespace): the other
// scenarios create thousands of RayClusters the operator must not act on.
const raceNamespace = "race"

type raceResult struct {
	Clusters      int     `json:"clusters"`
	RaysyncFirst  int     `json:"raysync_created"`
	KubeRayFirst  int     `json:"kuberay_created"`
	P50Ms         float64 `json:"p50_ms"`
	P95Ms         float64 `json:"p95_ms"`
	P99Ms         float64 `json:"p99_ms"`
	MaxMs         float64 `json:"max_ms"`
	KubeRayMaxMs  float64 `json:"max_ms_when_kuberay_created"`
	KubeRayMinMs  float64 `json:"min_ms_when_kuberay_created"`
	OperatorImage string  `json:"kuberay_operator"`
}

// race creates n token-auth RayClusters at once with the KubeRay operator and raysync running and,
// for each auth Secret, measures the delay from its first watch event to the first event in which it
// holds the canonical token, and which of the two created it (the first field manager).
func (b *bench) race(n int) raceResult {
	ctx := context.Background()
	b.setup(0)
	s := b.startSyncer("--namespaces=" + b.ns)
	defer s.stop()
	w := b.watchSecrets("")
	defer w.Stop()

	// All at once: one goroutine per cluster, released together.
	release := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		go func() {
			<-release
			_, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, rayCluster(b.ns, fmt.Sprintf("race-%02d", i)), metav1.CreateOptions{})
			errs <- err
		}()
	}
	close(release)
	for range n {
		check(<-errs)
	}

	first := map[string]time.Time{}
	creator := map[string]string{}
	delay := map[string]time.Duration{}
	timeout := time.After(3 * time.Minute)
	for len(delay) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				check(fmt.Errorf("race: watch closed"))
			}
			sec, ok := ev.Object.(*corev1.Secret)
			if !ok || sec.Name == "ray-token" || ev.Type == watch.Deleted {
				continue
			}
			now := time.Now()
			if _, seen := first[sec.Name]; !seen {
				first[sec.Name] = now
				creator[sec.Name] = "?"
				if len(sec.ManagedFields) > 0 {
					creator[sec.Name] = sec.ManagedFields[0].Manager
				}
			}
			if _, done := delay[sec.Name]; !done && string(sec.Data["auth_token"]) == b.token {
				delay[sec.Name] = now.Sub(first[sec.Name])
			}
		case <-timeout:
			check(fmt.Errorf("race: %d of %d auth Secrets hold the canonical token after 3 minutes", len(delay), n))
		}
	}

	r := raceResult{Clusters: n, OperatorImage: "KubeRay " + b.cp.KubeRayVersion, KubeRayMinMs: math.NaN()}
	var all []float64
	for name, d := range delay {
		ms := float64(d.Microseconds()) / 1000
		all = append(all, ms)
		if creator[name] == "raysync" {
			r.RaysyncFirst++
			continue
		}
		r.KubeRayFirst++
		r.KubeRayMaxMs = math.Max(r.KubeRayMaxMs, ms)
		if math.IsNaN(r.KubeRayMinMs) || ms < r.KubeRayMinMs {
			r.KubeRayMinMs = ms
		}
		fmt.Fprintf(os.Stderr, "bench: race: %s created by %s, canonical token %.1f ms later\n", name, creator[name], ms)
	}
	if math.IsNaN(r.KubeRayMinMs) {
		r.KubeRayMinMs = 0
	}
	sort.Float64s(all)
	r.P50Ms, r.P95Ms, r.P99Ms, r.MaxMs = pct(all, 50), pct(all, 95), pct(all, 99), all[len(all)-1]
	// The operator stops acting on the namespace's clusters once they are gone.
	check(b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	return r
}

// pct is the nearest-rank percentile of sorted values.
func pct(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}
