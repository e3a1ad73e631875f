package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// Rotation with Ray in the loop: a running cluster moves to a new token only as a whole, and what
// the Ray processes start with is what the tests check.

func withAnnotations(a map[string]string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { u.SetAnnotations(a) }
}

// rotate runs `syncer rotate` and returns its output and exit code.
func (e *Env) rotate(args ...string) (string, int) { return e.syncerCLI("rotate", args...) }

// startsSince counts a cluster's container starts with a token after t, and how many used token.
// Starts in the pods of old are left out: a restart moves a cluster by replacing its pods, and
// until their deletion an old pod's container may crash and restart (the kubelet restarts a first
// crash at once, a worker dies with its head) on the token the old pods share — the Secret is
// never written under them.
func (e *Env) startsSince(ns, cluster, token string, t time.Time, old map[types.UID]bool) (all, with int) {
	e.t.Helper()
	skipped := 0
	counts := e.tokenStarts(ns, token, func(s standin.ContainerStart) bool {
		if s.Cluster != cluster || s.StartedAt.Before(t) {
			return false
		}
		if old[types.UID(s.PodUID)] {
			skipped++
			return false
		}
		return true
	})
	if skipped > 0 {
		e.t.Logf("%s: %d container starts after the rotation in pods it replaced, not counted", cluster, skipped)
	}
	c := counts[cluster]
	return c[0], c[1]
}

// assertNoRefusals fails if any cluster of ns refused its operator, or a worker's join.
func (e *Env) assertNoRefusals(ns string) {
	e.t.Helper()
	all, err := e.StandIn().AllStats(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, st := range all {
		if st.Namespace != ns {
			continue
		}
		if op := st.Requests[standin.Caller("operator")]; op.Rejected() != 0 {
			e.t.Errorf("cluster %s refused %d operator requests", st.Cluster, op.Rejected())
		}
		if st.JoinFailures != 0 {
			e.t.Errorf("cluster %s refused %d GCS joins", st.Cluster, st.JoinFailures)
		}
	}
}

func podUIDs(pods []corev1.Pod) map[types.UID]bool {
	out := map[types.UID]bool{}
	for _, p := range pods {
		out[p.UID] = true
	}
	return out
}

// TestRunningClusterKeepsItsTokenUntilItMoves: after a rotation a held cluster keeps its Secret (its
// restarted and added workers join on it), a restart cluster restarts once as a whole and runs on
// the new token, and `syncer rotate` restarts the held cluster exactly once.
func TestRunningClusterKeepsItsTokenUntilItMoves(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.StandIn()
		ns, t1 := env.NamespaceWithToken()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--rotation-timeout=3m")
		env.CreateRayCluster(rayCluster(ns, "held"))
		env.CreateRayCluster(rayCluster(ns, "restarted", withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})))
		held := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=held", 2, 60*time.Second)
		restarted := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarted", 2, 60*time.Second)
		env.AssertStartedWith(ns, t1, "held", "restarted")
		heldSecret := env.WaitSecret(ns, "held", 10*time.Second, holds(t1))
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "current"}, 2, 30*time.Second)

		env.waitForNextSecond(append(held, restarted...))
		t2 := env.NewToken()
		rotatedAt := time.Now()
		env.PutSource(ns, "ray-token", tokenData(t2))

		// restart: every pod replaced once, every new container on t2.
		env.WaitEvent(ns, "restarted", "RotationCompleted", 120*time.Second)
		env.WaitSecret(ns, "restarted", 5*time.Second, holds(t2))
		after := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarted", 2, 60*time.Second)
		old := podUIDs(restarted)
		for _, p := range after {
			if old[p.UID] {
				t.Errorf("pod %s of the restarted cluster survived the restart", p.Name)
			}
		}
		if all, with := env.startsSince(ns, "restarted", t2, rotatedAt, old); all == 0 || with != all {
			t.Errorf("restarted cluster: %d of %d container starts after the rotation used the new token", with, all)
		}
		s.WaitMetric("raysync_rotations_performed_total", map[string]string{"action": "restart"}, 1, 10*time.Second)

		// hold: the Secret is untouched, the cluster reported behind; a restarted worker and an added
		// one start on the token the head runs with, and join.
		if cur := env.WaitSecret(ns, "held", time.Second, nil); cur.ResourceVersion != heldSecret.ResourceVersion {
			t.Errorf("the held cluster's Secret was written after the rotation")
		}
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "behind"}, 1, 30*time.Second)
		out, code := env.status("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		if code != 1 || !regexpLine(out, ns, "held", "-", "generated", "frozen", "behind") {
			t.Errorf("syncer status with a cluster behind: exit %d\n%s", code, out)
		}
		for _, p := range held {
			if p.Labels[kuberay.NodeTypeLabel] == "worker" {
				if err := env.Kube.CoreV1().Pods(ns).Delete(env.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Patch(env.ctx, "held", types.JSONPatchType,
			[]byte(`[{"op":"replace","path":"/spec/workerGroupSpecs/0/replicas","value":2}]`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		env.waitFreshPods(ns, "held", 3, podUIDs(held))
		if all, with := env.startsSince(ns, "held", t1, rotatedAt, nil); all == 0 || with != all {
			t.Errorf("held cluster: %d of %d container starts after the rotation used its own token", with, all)
		}

		// syncer rotate: the held cluster restarts exactly once, onto t2.
		if out, code := env.rotate(ns+"/held", "--auth-source", ns+"/ray-token", "--namespaces", ns); code != 0 || !strings.Contains(out, "will be restarted") {
			t.Fatalf("syncer rotate: exit %d\n%s", code, out)
		}
		env.WaitEvent(ns, "held", "RotationCompleted", 120*time.Second)
		env.WaitSecret(ns, "held", 5*time.Second, holds(t2))
		s.WaitMetric("raysync_rotations_performed_total", map[string]string{"action": "restart"}, 2, 10*time.Second)
		time.Sleep(3 * time.Second) // a second restart would start within the wave's next passes
		if v, _ := s.Metric("raysync_rotations_performed_total", map[string]string{"action": "restart"}); v != 2 {
			t.Errorf("raysync_rotations_performed_total{action=restart} = %v, want 2 (each cluster restarted once)", v)
		}
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "current"}, 2, 60*time.Second)
		if out, code := env.status("--auth-source="+ns+"/ray-token", "--namespaces="+ns); code != 0 {
			t.Errorf("syncer status after the wave: exit %d\n%s", code, out)
		}
		// A request for a cluster that is not behind is refused, never parked for the next rotation;
		// one made by hand (the annotation) is consumed at once.
		if out, code := env.rotate("--auth-source="+ns+"/ray-token", "--namespaces="+ns, ns+"/restarted"); code != 1 || !strings.Contains(out, "refused: not behind") {
			t.Errorf("syncer rotate of a current cluster: exit %d\n%s", code, out)
		}
		if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Patch(env.ctx, "restarted", types.MergePatchType,
			[]byte(`{"metadata":{"annotations":{"raysync.dev/rotate":"by-hand"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		env.WaitEventMessage(ns, "restarted", "RotationNotNeeded", 30*time.Second, "already runs on the current canonical token")
		if rc, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(env.ctx, "restarted", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		} else if _, kept := rc.GetAnnotations()["raysync.dev/rotate"]; kept {
			t.Error("the rotation request on a current cluster was kept")
		}
		env.assertNoRefusals(ns)
	})
}

// waitNoPods waits until a cluster has no pod left.
func (e *Env) waitNoPods(ns, cluster string, timeout time.Duration) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster})
		return err == nil && len(l.Items) == 0, nil
	})
	if err != nil {
		e.t.Fatalf("cluster %s/%s still has pods after %s", ns, cluster, timeout)
	}
}

// waitFreshPods waits until a cluster has n Ready pods of which at least one is new (not in old).
func (e *Env) waitFreshPods(ns, cluster string, n int, old map[types.UID]bool) []corev1.Pod {
	e.t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster})
		if err != nil {
			return false, nil
		}
		pods = l.Items
		ready, fresh := 0, 0
		for _, p := range pods {
			if p.DeletionTimestamp == nil && podReady(&p) {
				ready++
				if !old[p.UID] {
					fresh++
				}
			}
		}
		return ready >= n && fresh > 0, nil
	})
	if err != nil {
		e.t.Fatalf("cluster %s/%s: want %d Ready pods, some new; have %s", ns, cluster, n, describePods(pods))
	}
	return pods
}

// TestRayServiceRotationReplaces: a rotation replaces a RayService's running cluster through KubeRay's
// own blue-green upgrade: the old cluster serves on its token until the new one, started on the new
// token, takes over; the operator is never refused.
func TestRayServiceRotationReplaces(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.StandIn()
		ns, t1 := env.NamespaceWithToken()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, "serve", "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		blue := env.WaitServiceClusters(ns, "serve", 1, nil)[0].GetName()
		env.WaitRayServiceReady(ns, "serve", 120*time.Second, func(active string) bool { return active == blue })
		env.AssertStartedWith(ns, t1, blue)
		pods := env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+blue, 2, 60*time.Second)

		env.waitForNextSecond(pods)
		t2 := env.NewToken()
		rotatedAt := time.Now()
		env.PutSource(ns, "ray-token", tokenData(t2))
		green := env.WaitServiceClusters(ns, "serve", 1, func(rc *unstructured.Unstructured) bool { return rc.GetName() != blue })[0].GetName()
		env.WaitRayServiceReady(ns, "serve", 120*time.Second, func(active string) bool { return active == green })
		env.WaitEvent(ns, "serve", "RotationCompleted", 120*time.Second)
		took := time.Since(rotatedAt)
		if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(env.ctx, blue, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the rotation completed while the old cluster %s still exists", blue)
		}
		env.AssertStartedWith(ns, t2, green)
		env.assertServesFrom(ns, "serve", green)
		s.WaitMetric("raysync_rotations_performed_total", map[string]string{"action": "replace"}, 1, 10*time.Second)
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayService", "state": "current"}, 1, 30*time.Second)
		env.assertNoRefusals(ns)
		// What raysync wrote onto the RayService: a rotation number, never the token or its digest.
		rs, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Get(env.ctx, "serve", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		id, _, _ := unstructured.NestedString(rs.Object, "spec", "rayClusterConfig", "headGroupSpec", "template", "metadata", "annotations", "raysync.dev/rotation-id")
		b, _ := rs.MarshalJSON()
		if id == "" || strings.Contains(string(b), t2) || strings.Contains(string(b), t1) {
			t.Errorf("rotation-id %q on the RayService; it must be a number that names no token", id)
		}
		t.Logf("MEASURE rotation-replace kuberay=%s rotation_to_completed_s=%.1f", env.KubeRayVersion, took.Seconds())
	})
}

// TestSharedSecretRotation (KubeRay v1.6+, spec.authOptions.secretName): a managed copy shared by
// running clusters holds its token and its clusters are held, saying why; a cluster reading the
// source itself is split by a rotation, reported behind, and moved by its policy.
func TestSharedSecretRotation(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if !env.SupportsSecretName() {
			t.Skip("authOptions.secretName needs KubeRay v1.6+")
		}
		env.StandIn()
		ns, t1 := env.NamespaceWithToken()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		restart := withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})
		env.CreateRayCluster(rayCluster(ns, "share-a", withSecretName("shared"), restart))
		env.CreateRayCluster(rayCluster(ns, "share-b", withSecretName("shared"), restart))
		env.CreateRayCluster(rayCluster(ns, "reads-source", withSecretName("ray-token"), restart))
		var pods []corev1.Pod
		for _, c := range []string{"share-a", "share-b", "reads-source"} {
			pods = append(pods, env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+c, 2, 60*time.Second)...)
		}
		shared := env.WaitSecret(ns, "shared", 10*time.Second, holds(t1))
		env.AssertStartedWith(ns, t1, "share-a", "share-b", "reads-source")

		env.waitForNextSecond(pods)
		t2 := env.NewToken()
		rotatedAt := time.Now()
		env.PutSource(ns, "ray-token", tokenData(t2))

		// The source itself changed under reads-source: its restart moves it onto t2.
		env.WaitEvent(ns, "reads-source", "RotationCompleted", 120*time.Second)
		if all, with := env.startsSince(ns, "reads-source", t2, rotatedAt, podUIDs(pods)); all == 0 || with != all {
			t.Errorf("reads-source: %d of %d container starts after the rotation used the new token", with, all)
		}
		// The shared copy keeps t1; both clusters are held and say why.
		env.WaitEventMessage(ns, "share-a", "RotationHeld", 30*time.Second, "shares the managed Secret shared")
		if cur := env.WaitSecret(ns, "shared", time.Second, nil); cur.ResourceVersion != shared.ResourceVersion {
			t.Errorf("the shared managed copy was written under running clusters")
		}
		// A third cluster naming the held copy starts on the copy's token and is behind with the others;
		// suspending one sharer does not free the copy while another runs, and the running sharer's new
		// worker joins on the token its head holds.
		env.CreateRayCluster(rayCluster(ns, "share-c", withSecretName("shared"), restart))
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=share-c", 2, 60*time.Second)
		env.AssertStartedWith(ns, t1, "share-c")
		if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Patch(env.ctx, "share-b", types.MergePatchType,
			[]byte(`{"spec":{"suspend":true}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		env.waitNoPods(ns, "share-b", 60*time.Second)
		shareA := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=share-a", 2, 60*time.Second)
		if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Patch(env.ctx, "share-a", types.JSONPatchType,
			[]byte(`[{"op":"replace","path":"/spec/workerGroupSpecs/0/replicas","value":2}]`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		env.waitFreshPods(ns, "share-a", 3, podUIDs(shareA))
		if cur := env.WaitSecret(ns, "shared", time.Second, nil); cur.ResourceVersion != shared.ResourceVersion {
			t.Errorf("the shared managed copy was written under a running sharer when a new cluster named it")
		}
		if all, with := env.startsSince(ns, "share-a", t1, rotatedAt, nil); all == 0 || with != all {
			t.Errorf("share-a: %d of %d container starts after the rotation used the token its head holds", with, all)
		}
		out, code := env.status("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		if code != 1 || !regexpLine(out, ns, "share-c", "-", "referenced", "frozen", "behind") || !strings.Contains(out, "shares the managed Secret shared") {
			t.Errorf("syncer status: exit %d\n%s", code, out)
		}
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "behind"}, 3, 30*time.Second)
		for _, c := range []string{"share-a", "share-b", "share-c"} {
			st, err := env.StandIn().Stats(env.ctx, ns, c)
			if err != nil {
				t.Fatal(err)
			}
			if st.JoinFailures != 0 {
				t.Errorf("%s: %d join failures", c, st.JoinFailures)
			}
		}
	})
}
