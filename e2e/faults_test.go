package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestAPIServerRestart: raysync survives kube-apiserver going away and coming back on the same
// port without being restarted; readiness reflects the outage; watches resume and it converges.
func TestAPIServerRestart(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if env.External {
			t.Skip("restarts the local API server")
		}
		ns := env.Namespace()
		token := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(token))
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
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
		ns := env.Namespace()
		token := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(token))
		args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, "--leader-elect=true", "--leader-election-namespace=" + ns}
		a, b := env.StartSyncer(args...), env.StartSyncer(args...)
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
