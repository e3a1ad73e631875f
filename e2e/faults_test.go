package e2e

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/internal/kuberay"
)

// TestAPIServerRestart: raysync survives kube-apiserver going away and coming back on the same
// port without being restarted; readiness reflects the outage; watches resume and it converges.
func TestAPIServerRestart(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if env.External {
			t.Skip("restarts the local API server")
		}
		ns, token := env.NamespaceWithTokenNotStarted() // clusters take each new token at once
		s := env.StartSyncerUnderChart("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "survivor"))
		env.WaitSecret(ns, "survivor", 30*time.Second, holds(token))

		down := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- env.StopAPIServer() }()
		deadline := time.Now().Add(30 * time.Second)
		for s.Ready() {
			if time.Now().After(deadline) {
				t.Fatal("raysync stayed ready while the API server was down")
			}
			time.Sleep(200 * time.Millisecond)
		}
		notReadyAfter := time.Since(down)
		if err := <-stopped; err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		if err := env.StartAPIServer(env.ctx); err != nil {
			t.Fatal(err)
		}
		up := time.Now()
		for !s.Ready() {
			if time.Since(up) > 30*time.Second {
				t.Fatal("raysync did not become ready again")
			}
			time.Sleep(200 * time.Millisecond)
		}
		readyAfter := time.Since(up)

		// Its watches resumed: a rotation and a new cluster both converge.
		rotated := env.NewToken()
		start := time.Now()
		env.PutSource(ns, "ray-token", tokenData(rotated))
		env.CreateRayCluster(rayCluster(ns, "after"))
		env.WaitSecret(ns, "survivor", 60*time.Second, holds(rotated))
		env.WaitSecret(ns, "after", 60*time.Second, holds(rotated))
		t.Logf("MEASURE apiserver-restart kuberay=%s not_ready_after_ms=%d ready_again_after_ms=%d converged_after_ms=%d",
			env.KubeRayVersion, notReadyAfter.Milliseconds(), readyAfter.Milliseconds(), time.Since(start).Milliseconds())
		if s.cmd.ProcessState != nil {
			t.Fatal("raysync exited during the outage")
		}
	})
}

// TestLeaderFailover: with two replicas only the leader writes; kill -9 the leader and the standby
// takes over within the default lease timing (15 s lease) and finishes the work.
func TestLeaderFailover(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, token := env.NamespaceWithTokenNotStarted() // clusters take each new token at once
		args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, "--leader-elect=true", "--leader-election-namespace=" + ns}
		a := env.StartSyncerUnderChart(args...)
		b := env.StartReplica(args...)
		var leader, standby *Syncer
		deadline := time.Now().Add(30 * time.Second)
		for leader == nil {
			if time.Now().After(deadline) {
				t.Fatal("no leader elected")
			}
			la, _ := a.Metric("raysync_leader", nil)
			lb, _ := b.Metric("raysync_leader", nil)
			switch {
			case la == 1 && lb == 1:
				t.Fatal("two leaders")
			case la == 1:
				leader, standby = a, b
			case lb == 1:
				leader, standby = b, a
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !standby.Ready() {
			t.Error("standby is not ready (caches synced standbys must be ready)")
		}
		for i := range 3 {
			env.CreateRayCluster(rayCluster(ns, fmt.Sprintf("lead-%d", i)))
		}
		for i := range 3 {
			env.WaitSecret(ns, fmt.Sprintf("lead-%d", i), 30*time.Second, holds(token))
		}
		for _, r := range []string{"created", "updated"} {
			if v, _ := standby.Metric("raysync_sync_total", map[string]string{"result": r}); v != 0 {
				t.Errorf("standby wrote (%s = %v)", r, v)
			}
		}

		leader.Kill()
		killed := time.Now()
		rotated := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(rotated))
		for {
			if v, _ := standby.Metric("raysync_leader", nil); v == 1 {
				break
			}
			if time.Since(killed) > 40*time.Second {
				t.Fatal("standby never took over")
			}
			time.Sleep(100 * time.Millisecond)
		}
		failover := time.Since(killed)
		for i := range 3 {
			env.WaitSecret(ns, fmt.Sprintf("lead-%d", i), 30*time.Second, holds(rotated))
		}
		t.Logf("MEASURE leader-failover kuberay=%s failover_ms=%d work_done_ms=%d", env.KubeRayVersion, failover.Milliseconds(), time.Since(killed).Milliseconds())
		if failover > 30*time.Second {
			t.Errorf("failover took %s with default lease settings, want < 30s", failover)
		}
	})
}

// TestKillMidRotation: kill -9 raysync while it rotates 200 clusters that have not started (they take
// each new token at once), start it again: every target converges to the new token, and no target
// ever holds anything but the old or the new token. (Running clusters: rotation_test.go.)
func TestKillMidRotation(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.NamespaceWithoutKubelet()
		oldToken, newToken := env.NewToken(), env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(oldToken))
		args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns}
		s := env.StartSyncerUnderChart(args...)
		const n = 200
		noWorkers := func(spec map[string]any) { spec["workerGroupSpecs"] = []any{} }
		for i := range n {
			env.CreateRayCluster(rayCluster(ns, fmt.Sprintf("k%03d", i), noWorkers))
		}
		for i := range n {
			env.WaitSecret(ns, fmt.Sprintf("k%03d", i), 60*time.Second, holds(oldToken))
		}
		bad := env.watchValues(ns, oldToken, newToken)

		env.PutSource(ns, "ray-token", tokenData(newToken))
		time.Sleep(30 * time.Millisecond) // some targets written, most not
		s.Kill()
		restarted := time.Now()
		env.StartReplica(args...)
		for i := range n {
			env.WaitSecret(ns, fmt.Sprintf("k%03d", i), 60*time.Second, holds(newToken))
		}
		t.Logf("MEASURE kill-mid-rotation kuberay=%s clusters=%d converged_after_restart_ms=%d", env.KubeRayVersion, n, time.Since(restarted).Milliseconds())
		if v := bad(); v > 0 {
			t.Errorf("%d target writes held neither the old nor the new token", v)
		}
	})
}

// watchValues counts target Secret versions in ns whose token is neither a nor b, until the test ends.
func (e *Env) watchValues(ns, a, b string) func() int {
	e.t.Helper()
	w, err := e.Kube.CoreV1().Secrets(ns).Watch(e.ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster", ResourceVersion: e.secretListRV(ns)})
	if err != nil {
		e.t.Fatal(err)
	}
	var mu sync.Mutex
	bad := 0
	go func() {
		for ev := range w.ResultChan() {
			if s, ok := ev.Object.(*corev1.Secret); ok && ev.Type != watch.Deleted {
				if v := string(s.Data["auth_token"]); v != a && v != b {
					mu.Lock()
					bad++
					mu.Unlock()
				}
			}
		}
	}()
	e.t.Cleanup(w.Stop)
	return func() int { mu.Lock(); defer mu.Unlock(); return bad }
}

// TestFightingWriter: another writer resets a target every 100 ms for 30 s; raysync restores it
// each time with a bounded request rate, and the target ends on the canonical token. The cluster's
// pods never start: with running containers a change is put back only when raysync can tell they
// started on the canonical token (TokenRestored, planner tables); here, where a container could have
// started on the other writer's value, it would rightly be left as it is and the cluster reported behind.
func TestFightingWriter(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, token := env.NamespaceWithTokenNotStarted()
		s := env.StartSyncerUnderChart("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "contested"))
		env.WaitSecret(ns, "contested", 30*time.Second, holds(token))
		requests := func() float64 {
			var sum float64
			for _, m := range s.Metrics()["raysync_rest_client_requests_total"].GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
		before := requests()
		start := time.Now()
		other := env.Secret("the-other-writer-token")
		fights, restored := 0, 0
		for time.Since(start) < 30*time.Second {
			cur, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "contested", metav1.GetOptions{})
			if err == nil {
				if string(cur.Data["auth_token"]) == token {
					restored++
				}
				cur.Data["auth_token"] = []byte(other)
				if _, err := env.Kube.CoreV1().Secrets(ns).Update(env.ctx, cur, metav1.UpdateOptions{}); err == nil {
					fights++
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		rate := (requests() - before) / time.Since(start).Seconds()
		env.WaitSecret(ns, "contested", 10*time.Second, holds(token))
		t.Logf("MEASURE fighting-writer kuberay=%s resets=%d found_restored=%d raysync_requests_per_s=%.1f", env.KubeRayVersion, fights, restored, rate)
		if restored < fights/2 {
			t.Errorf("raysync restored the target before only %d of %d resets", restored, fights)
		}
		if rate > 5*float64(fights)/30 {
			t.Errorf("raysync made %.1f requests/s against %d resets in 30 s: not bounded by the fight", rate, fights)
		}
	})
}

// TestTargetsDeletedAndClustersGoing: a deleted target is repaired; clusters and a whole namespace
// deleted under raysync cause no error loop, and their metric series disappear.
func TestTargetsDeletedAndClustersGoing(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		doomed := env.Namespace()
		token := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(token))
		s := env.StartSyncerUnderChart("--auth-source="+ns+"/ray-token", "--namespaces="+ns+","+doomed)
		env.CreateRayCluster(rayCluster(ns, "repaired"))
		env.WaitSecret(ns, "repaired", 30*time.Second, holds(token))

		// The target is deleted (KubeRay then recreates it with a random token, unless raysync is first).
		if err := env.Kube.CoreV1().Secrets(ns).Delete(env.ctx, "repaired", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		env.WaitSecret(ns, "repaired", 30*time.Second, holds(token))

		// Clusters deleted right after creation, mid-reconcile.
		for i := range 5 {
			name := fmt.Sprintf("brief-%d", i)
			env.CreateRayCluster(rayCluster(ns, name))
			env.DeleteRayCluster(ns, name)
		}
		// A namespace deleted with clusters in it.
		env.CreateRayCluster(rayCluster(doomed, "a"))
		env.CreateRayCluster(rayCluster(doomed, "b"))
		env.WaitSecret(doomed, "a", 30*time.Second, holds(token))
		env.WaitSecret(doomed, "b", 30*time.Second, holds(token))
		if err := env.Kube.CoreV1().Namespaces().Delete(env.ctx, doomed, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for {
			_, found := s.Metric("raysync_target_in_sync", map[string]string{"namespace": doomed})
			if !found {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("series of the deleted namespace never disappeared")
			}
			time.Sleep(200 * time.Millisecond)
		}
		// A few retries while the namespace goes are expected (under namespaced RBAC its Role may be
		// deleted before its Secrets, so a re-create is Forbidden until the cluster leaves the cache);
		// a loop would keep counting.
		time.Sleep(3 * time.Second)
		settled, _ := s.Metric("raysync_sync_total", map[string]string{"result": "error"})
		logged := strings.Count(s.Output(), "reconcile failed")
		time.Sleep(5 * time.Second)
		if v, _ := s.Metric("raysync_sync_total", map[string]string{"result": "error"}); v != settled || settled > 30 {
			t.Errorf("raysync_sync_total{result=error}: %v, then %v 5 s later: an error loop", settled, v)
		}
		if n := strings.Count(s.Output(), "reconcile failed"); n != logged {
			t.Errorf("failed reconciles still being logged (%d -> %d): an error loop", logged, n)
		}
	})
}

// TestTenancy: whatever a RayCluster's author writes, raysync only ever copies the configured source's
// token into the cluster's namespace, never another Secret.
func TestTenancy(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if !env.SupportsSecretName() {
			t.Skip("authOptions.secretName needs KubeRay v1.6+")
		}
		srcNS, tenant, other := env.Namespace(), env.Namespace(), env.Namespace()
		token := env.NewToken()
		env.PutSource(srcNS, "ray-token", tokenData(token))
		otherValue := env.NewToken()
		env.PutSource(other, "db-password", tokenData(otherValue))
		env.StartSyncerUnderChart("--auth-source="+srcNS+"/ray-token", "--namespaces="+tenant)
		// secretName naming another namespace's Secret, the source's own name, and annotations
		// pretending to name another source.
		env.CreateRayCluster(rayCluster(tenant, "steal", withSecretName("db-password"),
			withLabels(map[string]string{"raysync.dev/managed-by": "raysync"}),
			func(u *unstructured.Unstructured) {
				u.SetAnnotations(map[string]string{"raysync.dev/source": other + "/db-password", "raysync.dev/kind": "auth-token"})
			}))
		env.CreateRayCluster(rayCluster(tenant, "samename", withSecretName("ray-token")))
		for _, n := range []string{"db-password", "ray-token"} {
			s := env.WaitSecret(tenant, n, 30*time.Second, nil)
			if string(s.Data["auth_token"]) != token || len(s.Data) != 1 {
				t.Errorf("copy %s/%s holds something other than the canonical token", tenant, n)
			}
		}
		if s, err := env.Kube.CoreV1().Secrets(other).Get(env.ctx, "db-password", metav1.GetOptions{}); err != nil || string(s.Data["auth_token"]) != otherValue {
			t.Errorf("the other namespace's Secret changed: %v", err)
		}
	})
}

// TestSoakBurstWhileRotating (make soak): 1,000 clusters created in one burst while the source
// rotates three times; all end on the newest token.
func TestSoakBurstWhileRotating(t *testing.T) {
	if os.Getenv("RAYSYNC_SOAK") == "" {
		t.Skip("long: run with make soak")
	}
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		env.PutSource(ns, "ray-token", tokenData(env.NewToken()))
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		const n = 1000
		noWorkers := func(spec map[string]any) { spec["workerGroupSpecs"] = []any{} }
		start := time.Now()
		var latest string
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Create(env.ctx, rayCluster(ns, fmt.Sprintf("b%04d", i), noWorkers), metav1.CreateOptions{}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		for range 3 {
			time.Sleep(500 * time.Millisecond)
			latest = env.NewToken()
			env.PutSource(ns, "ray-token", tokenData(latest))
		}
		wg.Wait()
		created := time.Since(start)
		for i := range n {
			env.WaitSecret(ns, fmt.Sprintf("b%04d", i), 5*time.Minute, holds(latest))
		}
		t.Logf("MEASURE burst-while-rotating kuberay=%s clusters=%d created_in_ms=%d all_on_newest_token_ms=%d", env.KubeRayVersion, n, created.Milliseconds(), time.Since(start).Milliseconds())
	})
}

// TestLostLeaseStopsWithinTheRenewDeadline: when another identity takes the Lease, the leader exits
// instead of writing on, once its renewal has failed for --leader-election-renew-deadline (client-go's
// semantics: 10 s by default; measured 11.9-12.0 s), and within that plus two retry periods.
func TestLostLeaseStopsWithinTheRenewDeadline(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		env.PutSource(ns, "ray-token", tokenData(env.NewToken()))
		s := env.StartSyncerUnderChart("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--leader-elect=true")
		rel, lease := env.lastRelease, env.lastName
		s.WaitMetric("raysync_leader", nil, 1, 30*time.Second)
		// Someone else takes the Lease (as a partitioned leader would find after the lease ran out).
		if err := retryOnConflict(env, func() error {
			l, err := env.Kube.CoordinationV1().Leases(rel).Get(env.ctx, lease, metav1.GetOptions{})
			if err != nil {
				return err
			}
			intruder := "intruder"
			now := metav1.NewMicroTime(time.Now())
			l.Spec.HolderIdentity, l.Spec.RenewTime, l.Spec.AcquireTime = &intruder, &now, &now
			_, err = env.Kube.CoordinationV1().Leases(rel).Update(env.ctx, l, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		taken := time.Now()
		const ceiling = 10*time.Second + 2*2*time.Second // the renew deadline and two retry periods (the defaults)
		select {
		case <-s.done:
		case <-time.After(ceiling):
			t.Fatalf("leader kept running %s after losing its Lease", ceiling)
		}
		t.Logf("MEASURE lost-lease kuberay=%s exited_after_ms=%d", env.KubeRayVersion, time.Since(taken).Milliseconds())
		if code := s.cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(s.Output(), "lost leadership") {
			t.Errorf("exit code %d; want non-zero with \"lost leadership\" logged", code)
		}
	})
}
