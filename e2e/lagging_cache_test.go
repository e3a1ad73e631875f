package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// Issue 35 item 2, the conditions of issue 25's TestFleetRotation/"raysync killed mid-wave" failure,
// made deterministic: raysync starts (as after a kill) while KubeRay creates a cluster, and its pod
// cache lags the API server by 4 s (an API proxy delays every pod list and watch event). The kubelet
// binds the pods and starts their containers on KubeRay's random token 2 s after their creation; raysync,
// whose cache still shows them unbound, writes the canonical token over it. That write is marked as
// raced whatever the cache showed, and once the cache shows the containers' start times, the pods are
// recycled: every container that runs in the end started on the canonical token. Before, the write went
// unmarked and the cluster ran on KubeRay's token for ever, its Secret saying the canonical one. No
// webhook and no pre-creation (the webhook bypassed): raysync's own rule decides. One KubeRay version.
func TestPodCacheBehindNeverLeavesAContainerOnAnotherToken(t *testing.T) {
	cp := newestKubeRay()
	if cp == nil || cp.External {
		t.Skip("needs the local control plane")
	}
	t.Parallel()
	env := newEnv(t, cp)
	env.StandIn()
	ns := env.NamespaceAnnotated(map[string]string{framework.StandInStartDelay: "2s"})
	token := env.NewToken()
	env.PutSource(ns, "ray-token", tokenData(token))
	proxy, err := framework.StartLagProxy(cp, t.TempDir(), 4*time.Second, func(r *http.Request) bool {
		return strings.HasSuffix(r.URL.Path, "/pods")
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)

	created := time.Now()
	env.CreateRayCluster(rayCluster(ns, "c1"))
	env.WaitSecret(ns, "c1", 30*time.Second, func(s *corev1.Secret) bool { return len(s.Data[kuberay.AuthTokenKey]) > 0 })
	s := env.StartSyncerAs(proxy.Kubeconfig, "--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--precreate-auth-secrets=false")
	env.WaitSecret(ns, "c1", 30*time.Second, holds(token))

	// In the end every running container started on the canonical token.
	var running []corev1.Pod
	err = wait.PollUntilContextTimeout(env.ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		running = env.WaitPodsReady(ns, kuberay.ClusterLabel+"=c1", 2, 2*time.Minute)
		current := map[types.UID]bool{}
		for _, p := range running {
			current[p.UID] = true
		}
		counts := env.tokenStarts(ns, token, func(st standin.ContainerStart) bool { return current[types.UID(st.PodUID)] })
		c := counts["c1"]
		return c[0] > 0 && c[0] == c[1], nil
	})
	starts, _ := env.StandIn().Starts(env.ctx, ns)
	var first []string
	for _, st := range starts {
		if st.Cluster == "c1" {
			first = append(first, st.Pod+"/"+st.Container+"@"+st.StartedAt.Sub(created).Round(100*time.Millisecond).String())
		}
	}
	if err != nil {
		t.Fatalf("the running pods of c1 did not all start on the canonical token (container starts since the cluster's creation: %v)\n%s",
			first, describePods(running))
	}
	recycled, _ := s.Metric("raysync_pods_recycled_total", map[string]string{"reason": "auth_token"})
	t.Logf("MEASURE lagging-pod-cache delay_s=4 pods_recycled=%v container_starts=%v", recycled, first)
	if recycled == 0 {
		t.Error("no pod was recycled: the containers cannot have started on KubeRay's token before raysync's write, so this test tested nothing")
	}
}
