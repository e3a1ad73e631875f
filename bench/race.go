package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
)

// raceNamespace is one of the two namespaces the KubeRay operator watches (--watch-namespace): the
// other scenarios create thousands of RayClusters the operator must not act on.
const raceNamespace = "race"

type raceResult struct {
	// StartDelayMs is the kubelet stand-in's delay from pod creation to container creation
	// (scheduling plus image pull; a real Ray image pull takes tens of seconds).
	StartDelayMs  int     `json:"start_delay_ms"`
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
	// What the Ray processes started with: container starts with a RAY_AUTH_TOKEN (head, worker,
	// wait-gcs-ready), how many had another token than the canonical one, in how many clusters,
	// and the GCS joins the heads refused because of it.
	ContainerStarts  int `json:"container_starts"`
	NonCanonical     int `json:"non_canonical_starts"`
	ClustersAffected int `json:"clusters_with_non_canonical_starts"`
	JoinFailures     int `json:"gcs_join_failures"`
}

// race creates n token-auth RayClusters (head and one worker) at once with the KubeRay operator,
// raysync and the kubelet stand-in running, pods starting startDelay after they are created. For
// each auth Secret it measures the delay from its first watch event to the first event in which it
// holds the canonical token, and which of the two created it (the first field manager); then, from
// the stand-in, which token every Ray container started with.
func (b *bench) race(n int, startDelay time.Duration) raceResult {
	ctx := context.Background()
	ns, err := b.cp.Kube.CoreV1().Namespaces().Get(ctx, b.ns, metav1.GetOptions{})
	check(err)
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, framework.StandInStartDelay, startDelay.String())
	_, err = b.cp.Kube.CoreV1().Namespaces().Patch(ctx, ns.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	check(err)
	s := b.startSyncer("--namespaces=" + b.ns)
	defer s.stop()
	w := b.watchSecrets("")
	defer w.Stop()

	prefix := fmt.Sprintf("race-%dms-", startDelay.Milliseconds())
	names := make([]string, n)
	release := make(chan struct{})
	errs := make(chan error, n)
	for i := range n {
		names[i] = fmt.Sprintf("%s%02d", prefix, i)
		go func() {
			<-release
			_, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, rayClusterWithWorkers(b.ns, names[i], 1), metav1.CreateOptions{})
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
			if !ok || !strings.HasPrefix(sec.Name, prefix) || ev.Type == watch.Deleted {
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

	r := raceResult{StartDelayMs: int(startDelay.Milliseconds()), Clusters: n, OperatorImage: "KubeRay " + b.cp.KubeRayVersion, KubeRayMinMs: math.NaN()}
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
	}
	if math.IsNaN(r.KubeRayMinMs) {
		r.KubeRayMinMs = 0
	}
	sort.Float64s(all)
	r.P50Ms, r.P95Ms, r.P99Ms, r.MaxMs = pct(all, 50), pct(all, 95), pct(all, 99), all[len(all)-1]
	b.raceStarts(&r, prefix, names)
	fmt.Fprintf(os.Stderr, "bench: race at start delay %s: %d of %d container starts non-canonical, in %d clusters; %d GCS joins refused\n",
		startDelay, r.NonCanonical, r.ContainerStarts, r.ClustersAffected, r.JoinFailures)

	// The next round names its clusters differently and counts only its own; these go in the background.
	check(b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	return r
}

// raceStarts waits until every cluster's head, its worker's wait-gcs-ready and its raylet have
// started, or the head refused the worker's token (then the worker never gets further), and counts
// which token they started with.
func (b *bench) raceStarts(r *raceResult, prefix string, names []string) {
	ctx := context.Background()
	canonical := b.cp.Ray.Fingerprint(b.token)
	check(wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		starts, err := b.cp.Ray.Starts(ctx, b.ns)
		if err != nil {
			return false, nil
		}
		perCluster := map[string]int{}
		for _, s := range starts {
			if strings.HasPrefix(s.Cluster, prefix) && s.TokenFingerprint != "" {
				perCluster[s.Cluster]++
			}
		}
		for _, c := range names {
			if perCluster[c] >= 3 {
				continue
			}
			st, err := b.cp.Ray.Stats(ctx, b.ns, c)
			if err != nil || st.JoinFailures == 0 {
				return false, nil
			}
		}
		return true, nil
	}))
	starts, err := b.cp.Ray.Starts(ctx, b.ns)
	check(err)
	affected := map[string]bool{}
	for _, s := range starts {
		if !strings.HasPrefix(s.Cluster, prefix) || s.TokenFingerprint == "" {
			continue
		}
		r.ContainerStarts++
		if s.TokenFingerprint != canonical {
			r.NonCanonical++
			affected[s.Cluster] = true
		}
	}
	r.ClustersAffected = len(affected)
	for _, c := range names {
		st, err := b.cp.Ray.Stats(ctx, b.ns, c)
		check(err)
		r.JoinFailures += st.JoinFailures
	}
}

// pct is the nearest-rank percentile of sorted values.
func pct(sorted []float64, p float64) float64 {
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(i, 0)]
}

// rayClusterWithWorkers is rayCluster with one worker group of the given size: the workers and
// their wait-gcs-ready init containers take the token too.
func rayClusterWithWorkers(ns, name string, workers int64) *unstructured.Unstructured {
	rc := rayCluster(ns, name)
	spec := rc.Object["spec"].(map[string]any)
	spec["workerGroupSpecs"] = []any{map[string]any{
		"groupName": "workers", "replicas": workers, "minReplicas": int64(0), "maxReplicas": int64(10),
		"rayStartParams": map[string]any{},
		"template": map[string]any{"spec": map[string]any{"containers": []any{
			map[string]any{"name": "ray-worker", "image": "rayproject/ray:2.52.0"}}}},
	}}
	return rc
}
