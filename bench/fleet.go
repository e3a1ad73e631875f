package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/e2e/standin"
)

// fleetNamespace holds the fleet rotation's RayServices (the KubeRay operator watches it).
const fleetNamespace = "fleet"

// fleetResult is one fleet rotation of RayServices: by raysync at a bound, or by the behaviour before
// rotation was made safe (the Secret written under running clusters).
type fleetResult struct {
	KubeRay      string  `json:"kuberay"`
	RayServices  int     `json:"rayservices"`
	Bound        int     `json:"bound"`    // --max-concurrent-rotations; 0: the previous behaviour
	WallSeconds  float64 `json:"wall_s"`   // rotation → every RayService serving from a cluster started on the new token
	Done         bool    `json:"complete"` // false: not done within the limit (always, for the previous behaviour)
	PeakInFlight int     `json:"peak_in_flight"`
	// OperatorRejected counts the operator's requests the fleet's clusters refused for their token.
	OperatorRejected int `json:"operator_requests_rejected"`
	JoinFailures     int `json:"worker_join_failures"`
}

// fleetRotation creates n RayServices on the canonical token, then rotates it once per bound with raysync
// at that bound, each measured until every RayService serves from a cluster started on the new token
// (or limit passes), and once with the raysync of beforeRev (the previous behaviour), observed as
// long as the first wave took.
func (b *bench) fleetRotation(n int, bounds []int, beforeRev string, limit time.Duration) []fleetResult {
	ctx := context.Background()
	b.setup(0)
	s := b.startSyncer("--namespaces="+b.ns, "--rotation-ledger="+b.ns+"/raysync-rotations")
	for i := range n {
		rs := rayService(b.ns, fmt.Sprintf("svc-%03d", i))
		// The old cluster goes 5 s after the switch (default 60): a replacement completes when it is gone.
		check(unstructured.SetNestedField(rs.Object, int64(5), "spec", "rayClusterDeletionDelaySeconds"))
		_, err := b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).Create(ctx, rs, metav1.CreateOptions{})
		check(err)
	}
	b.waitFleetOn(n, b.token, 15*time.Minute)
	fmt.Fprintf(os.Stderr, "bench: fleet: %d RayServices serving\n", n)
	s.stop()

	var out []fleetResult
	run := func(bin string, bound int, limit time.Duration) {
		args := []string{"--namespaces=" + b.ns} // the previous raysync knows no rotation flags
		if bound > 0 {
			args = append(args, "--rotation-ledger="+b.ns+"/raysync-rotations", fmt.Sprintf("--max-concurrent-rotations=%d", bound))
		}
		p := b.startSyncerBinary(bin, args...)
		defer p.stop()
		before := b.namespaceStats()
		token := fmt.Sprintf("%s-fleet-%d-%d", b.token, bound, time.Now().UnixNano())
		peak := b.watchPeakInFlight()
		start := time.Now()
		b.setSource(token)
		done := b.waitFleetOn(n, token, limit)
		r := fleetResult{KubeRay: b.cp.KubeRayVersion, RayServices: n, Bound: bound, WallSeconds: time.Since(start).Seconds(), Done: done, PeakInFlight: peak()}
		for c, st := range b.namespaceStats() {
			r.OperatorRejected += st.Requests[standin.CallerOperator].Rejected() - before[c].Requests[standin.CallerOperator].Rejected()
			r.JoinFailures += st.JoinFailures - before[c].JoinFailures
		}
		fmt.Fprintf(os.Stderr, "bench: fleet: %+v\n", r)
		out = append(out, r)
		if !done && bound > 0 {
			check(fmt.Errorf("fleet rotation at bound %d did not complete within %s", bound, limit))
		}
	}
	for _, bound := range bounds {
		run(b.bin, bound, limit)
	}
	if beforeRev != "" && len(out) > 0 {
		// The previous behaviour never completes: observe it as long as the first wave took.
		run(buildSyncerAt(beforeRev), 0, time.Duration(out[0].WallSeconds*float64(time.Second)))
	}
	check(b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	return out
}

// waitFleetOn waits until every RayService serves, from a cluster all of whose Ray processes started on
// token, with no replacement pending; false when limit passes first.
func (b *bench) waitFleetOn(n int, token string, limit time.Duration) bool {
	ctx := context.Background()
	want := b.cp.Ray.Fingerprint(token)
	err := wait.PollUntilContextTimeout(ctx, time.Second, limit, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) < n {
			return false, nil
		}
		starts, err := b.cp.Ray.Starts(ctx, b.ns)
		if err != nil {
			return false, nil
		}
		on := map[string]bool{} // cluster → every start so far used token
		for _, s := range starts {
			if s.TokenFingerprint == "" {
				continue
			}
			ok, seen := on[s.Cluster]
			on[s.Cluster] = (ok || !seen) && s.TokenFingerprint == want
		}
		for i := range l.Items {
			rs := &l.Items[i]
			pending, _, _ := unstructured.NestedString(rs.Object, "status", "pendingServiceStatus", "rayClusterName")
			if active := activeCluster(rs); active == "" || pending != "" || !on[active] || rs.GetAnnotations()["raysync.dev/rotation-started"] != "" {
				return false, nil
			}
		}
		return true, nil
	})
	return err == nil
}

// watchPeakInFlight samples how many RayServices carry raysync's in-flight mark, until the returned
// function is called; it returns the most at once.
func (b *bench) watchPeakInFlight() func() int {
	ctx, cancel := context.WithCancel(context.Background())
	peak := make(chan int)
	go func() {
		most := 0
		for ctx.Err() == nil {
			if l, err := b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).List(ctx, metav1.ListOptions{}); err == nil {
				n := 0
				for _, rs := range l.Items {
					if rs.GetAnnotations()["raysync.dev/rotation-started"] != "" {
						n++
					}
				}
				most = max(most, n)
			}
			time.Sleep(250 * time.Millisecond)
		}
		peak <- most
	}()
	return func() int { cancel(); return <-peak }
}

// namespaceStats is what the stand-in saw of every cluster in the namespace, by cluster.
func (b *bench) namespaceStats() map[string]standin.ClusterStats {
	all, err := b.cp.Ray.AllStats(context.Background())
	check(err)
	out := map[string]standin.ClusterStats{}
	for _, st := range all {
		if st.Namespace == b.ns {
			out[st.Cluster] = st
		}
	}
	return out
}

// buildSyncerAt builds cmd/syncer as it was at rev, from a temporary worktree of the repository.
func buildSyncerAt(rev string) string {
	root, err := framework.RepoRoot()
	check(err)
	cache, err := framework.CacheDir()
	check(err)
	tree, err := os.MkdirTemp("", "raysync-before-")
	check(err)
	defer func() {
		_ = exec.Command("git", "-C", root, "worktree", "remove", "--force", tree).Run()
	}()
	if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", tree, rev).CombinedOutput(); err != nil {
		check(fmt.Errorf("git worktree add %s: %v\n%s", rev, err, out))
	}
	bin := filepath.Join(cache, "bin", "syncer-"+rev)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/syncer")
	cmd.Dir, cmd.Env = tree, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		check(fmt.Errorf("build syncer at %s: %v\n%s", rev, err, out))
	}
	return bin
}
