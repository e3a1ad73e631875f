package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// The fleet rotation of issue 13: 20 RayServices (replace), 10 standalone RayClusters (hold), 2
// (restart) and a running RayJob; rotate; scale a held cluster up and restart one of its workers.
// Over the whole run no cluster refuses its operator or a worker, never more than the bound rotate
// at once, held Secrets do not change, every RayService ends serving on the new token, the RayJob
// finishes on its token and the next one starts on the new one, and `syncer rotate` restarts a held
// cluster exactly once. Variants: raysync killed mid-wave; a second rotation mid-wave. "Serving on the
// new token" is every running container of the serving cluster started on it; a replacement cluster
// KubeRay creates while raysync is down starts on KubeRay's random token, and its raced pods must have
// been recycled by raysync (a PodRecycled Event names each), never left or removed otherwise.

const (
	fleetServices = 20
	fleetHeld     = 10
	fleetRestart  = 2
	fleetBound    = 5
)

type fleet struct {
	env         *Env
	ns          string
	t1          string
	heldSecret  map[string]string // held cluster → Secret resourceVersion before the rotation
	maxInFlight func() int
}

func TestFleetRotation(t *testing.T) {
	for _, variant := range []string{"plain", "raysync killed mid-wave", "second rotation mid-wave"} {
		t.Run(variant, func(t *testing.T) {
			eachKubeRay(t, func(t *testing.T, env *Env) {
				if testing.Short() {
					t.Skip("long")
				}
				runFleet(t, env, variant)
			})
		})
	}
}

func runFleet(t *testing.T, env *Env, variant string) {
	env.StandIn()
	ns, t1 := env.NamespaceWithToken()
	args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, fmt.Sprintf("--max-concurrent-rotations=%d", fleetBound), "--rotation-timeout=5m"}
	s := env.StartSyncer(args...)
	f := &fleet{env: env, ns: ns, t1: t1, heldSecret: map[string]string{}}
	oneWorker := func(spec map[string]any) {
		spec["workerGroupSpecs"].([]any)[0].(map[string]any)["replicas"] = int64(1)
	}
	for i := range fleetServices {
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, fmt.Sprintf("svc-%02d", i), "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range fleetHeld {
		env.CreateRayCluster(rayCluster(ns, fmt.Sprintf("held-%02d", i), oneWorker))
	}
	for i := range fleetRestart {
		env.CreateRayCluster(rayCluster(ns, fmt.Sprintf("restart-%d", i), oneWorker, withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})))
	}
	job := rayJob(ns, "job-before", "HTTPMode")
	// The stand-in runs a job whose entrypoint says "sleep N" for N seconds: long enough to span the wave.
	_ = unstructured.SetNestedField(job.Object, "sleep 90", "spec", "entrypoint")
	if _, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Create(env.ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range fleetServices {
		env.WaitRayServiceReady(ns, fmt.Sprintf("svc-%02d", i), 3*time.Minute, nil)
	}
	for i := range fleetHeld {
		name := fmt.Sprintf("held-%02d", i)
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+name, 2, 2*time.Minute)
		f.heldSecret[name] = env.WaitSecret(ns, name, 10*time.Second, holds(t1)).ResourceVersion
	}
	jobCluster := f.waitJobRunning("job-before")
	f.maxInFlight = f.watchInFlight()
	env.waitForNextSecond(f.allPods())

	t2 := env.NewToken()
	start := time.Now()
	env.PutSource(ns, "ray-token", tokenData(t2))
	final := t2
	switch variant {
	case "raysync killed mid-wave":
		f.waitRotationsStarted(s, fleetBound)
		s.Kill()
		time.Sleep(2 * time.Second)
		s = env.StartSyncer(args...)
	case "second rotation mid-wave":
		f.waitRotationsStarted(s, fleetBound)
		final = env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(final))
	}

	// A held cluster scales up and restarts a worker mid-wave: both join on the held token.
	held0 := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=held-00", 2, time.Minute)
	for _, p := range held0 {
		if p.Labels[kuberay.NodeTypeLabel] == "worker" {
			_ = env.Kube.CoreV1().Pods(ns).Delete(env.ctx, p.Name, metav1.DeleteOptions{})
		}
	}
	if _, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Patch(env.ctx, "held-00", types.JSONPatchType,
		[]byte(`[{"op":"replace","path":"/spec/workerGroupSpecs/0/replicas","value":2}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	env.waitFreshPods(ns, "held-00", 3, podUIDs(held0))

	// Every RayService ends serving from a cluster started on the final token.
	for i := range fleetServices {
		svc := fmt.Sprintf("svc-%02d", i)
		f.waitServingOn(svc, final, 6*time.Minute)
	}
	took := time.Since(start)
	s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayService", "state": "current"}, fleetServices, 2*time.Minute)
	for i := range fleetRestart {
		env.WaitSecret(ns, fmt.Sprintf("restart-%d", i), 2*time.Minute, holds(final))
	}

	// The RayJob finished on its own token, its cluster untouched; the next one gets the new token.
	f.waitJobDone("job-before")
	env.AssertStartedWith(ns, t1, jobCluster)
	next := rayJob(ns, "job-after", "HTTPMode")
	if _, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Create(env.ctx, next, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nextCluster := f.waitJobDone("job-after")
	env.AssertStartedWith(ns, final, nextCluster)

	// Held clusters kept their Secret; `syncer rotate` moves one, exactly once.
	for name, rv := range f.heldSecret {
		if cur := env.WaitSecret(ns, name, time.Second, nil); cur.ResourceVersion != rv {
			t.Errorf("held cluster %s: its Secret changed during the wave", name)
		}
	}
	restartsBefore, _ := s.Metric("raysync_rotations_performed_total", map[string]string{"action": "restart"})
	if out, code := env.rotate("--auth-source="+ns+"/ray-token", "--namespaces="+ns, ns+"/held-01"); code != 0 {
		t.Fatalf("syncer rotate: exit %d\n%s", code, out)
	}
	env.WaitEvent(ns, "held-01", "RotationCompleted", 2*time.Minute)
	env.WaitSecret(ns, "held-01", 10*time.Second, holds(final))
	time.Sleep(3 * time.Second)
	if v, _ := s.Metric("raysync_rotations_performed_total", map[string]string{"action": "restart"}); v != restartsBefore+1 {
		t.Errorf("syncer rotate: %v restarts performed, want exactly one", v-restartsBefore)
	}

	if m := f.maxInFlight(); m > fleetBound || m == 0 {
		t.Errorf("at most %d rotations in flight at a time, want 1..%d", m, fleetBound)
	}
	env.assertNoRefusals(ns)
	t.Logf("MEASURE fleet-rotation kuberay=%s variant=%q services=%d bound=%d wave_s=%.1f max_in_flight=%d",
		env.KubeRayVersion, variant, fleetServices, fleetBound, took.Seconds(), f.maxInFlight())
}

// watchInFlight polls the rotation marks on RayServices and RayClusters until the test ends, and
// reports the most seen at once.
func (f *fleet) watchInFlight() func() int {
	var mu sync.Mutex
	peak := 0
	ctx, cancel := context.WithCancel(f.env.ctx)
	f.env.t.Cleanup(cancel)
	go func() {
		for ctx.Err() == nil {
			n := 0
			for _, gvr := range []schema.GroupVersionResource{kuberay.RayServiceGVR, kuberay.RayClusterGVR} {
				l, err := f.env.Dynamic.Resource(gvr).Namespace(f.ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					continue
				}
				for _, o := range l.Items {
					if o.GetAnnotations()["raysync.dev/rotation-started"] != "" && (o.GetKind() == "RayService" || o.GetLabels()[kuberay.OriginatedFromCRDLabel] != "RayService") {
						n++
					}
				}
			}
			mu.Lock()
			peak = max(peak, n)
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() int { mu.Lock(); defer mu.Unlock(); return peak }
}

func (f *fleet) allPods() []corev1.Pod {
	l, err := f.env.Kube.CoreV1().Pods(f.ns).List(f.env.ctx, metav1.ListOptions{})
	if err != nil {
		f.env.t.Fatal(err)
	}
	return l.Items
}

// waitRotationsStarted waits until raysync has started n replacements or restarts.
func (f *fleet) waitRotationsStarted(s *Syncer, n int) {
	f.env.t.Helper()
	err := wait.PollUntilContextTimeout(f.env.ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		a, _ := s.Metric("raysync_rotations_performed_total", map[string]string{"action": "replace"})
		b, _ := s.Metric("raysync_rotations_performed_total", map[string]string{"action": "restart"})
		return int(a+b) >= n, nil
	})
	if err != nil {
		f.env.t.Fatalf("raysync never started %d rotations", n)
	}
}

// waitServingOn waits until the RayService serves from a cluster every container of which started
// on token.
func (f *fleet) waitServingOn(svc, token string, timeout time.Duration) {
	f.env.t.Helper()
	want := f.env.StandIn().Fingerprint(token)
	var raced map[string]bool // pods of the serving cluster that started on another token and are gone
	err := wait.PollUntilContextTimeout(f.env.ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		rs, err := f.env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(f.ns).Get(ctx, svc, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		active, _, _ := unstructured.NestedString(rs.Object, "status", "activeServiceStatus", "rayClusterName")
		pending, _, _ := unstructured.NestedString(rs.Object, "status", "pendingServiceStatus", "rayClusterName")
		if active == "" || pending != "" || !conditionTrue(rs, "Ready") {
			return false, nil
		}
		starts, err := f.env.StandIn().Starts(ctx, f.ns)
		if err != nil {
			return false, nil
		}
		pods, err := f.env.Kube.CoreV1().Pods(f.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + active})
		if err != nil {
			return false, nil
		}
		live := map[string]bool{}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				live[string(p.UID)] = true
			}
		}
		n, gone := 0, map[string]bool{}
		for _, s := range starts {
			switch {
			case s.Cluster != active || s.TokenFingerprint == "":
			case s.TokenFingerprint != want && live[s.PodUID]:
				return false, nil // a pod that runs holds a container started on another token: not yet (or split)
			case s.TokenFingerprint != want:
				gone[s.Pod] = true
			case live[s.PodUID]:
				n++
			}
		}
		raced = gone
		return n > 0, nil
	})
	if err != nil {
		f.env.t.Fatalf("RayService %s never served from a cluster started on the new token: %s", svc, f.describeService(svc, want))
	}
	// A pod that started on another token and is gone was recycled by raysync (a new cluster born while
	// raysync was down, its Secret raced): no other way out is allowed.
	recycled := map[string]bool{}
	for _, e := range f.env.Events(f.ns, "raysync", names.ReasonPodRecycled) {
		if name, _, ok := strings.Cut(strings.TrimPrefix(e.Message, "deleted pod "), ":"); ok {
			recycled[name] = true
		}
	}
	for pod := range raced {
		if !recycled[pod] {
			f.env.t.Errorf("RayService %s: pod %s of its serving cluster started on another token and went without raysync recycling it: %s",
				svc, pod, f.describeService(svc, want))
		} else {
			f.env.t.Logf("MEASURE fleet %s: pod %s raced KubeRay's token and was recycled", svc, pod)
		}
	}
}

// describeService says where a RayService and its clusters stand (for failure messages).
func (f *fleet) describeService(svc, want string) string {
	rs, err := f.env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(f.ns).Get(f.env.ctx, svc, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	active, _, _ := unstructured.NestedString(rs.Object, "status", "activeServiceStatus", "rayClusterName")
	pending, _, _ := unstructured.NestedString(rs.Object, "status", "pendingServiceStatus", "rayClusterName")
	out := fmt.Sprintf("active %q pending %q ready %v annotations %v;", active, pending, conditionTrue(rs, "Ready"), rs.GetAnnotations())
	l, _ := f.env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(f.ns).List(f.env.ctx, metav1.ListOptions{LabelSelector: kuberay.OriginatedFromNameLabel + "=" + svc})
	starts, _ := f.env.StandIn().Starts(f.env.ctx, f.ns)
	for _, rc := range l.Items {
		on, other := 0, 0
		for _, s := range starts {
			if s.Cluster == rc.GetName() && s.TokenFingerprint != "" {
				if s.TokenFingerprint == want {
					on++
				} else {
					other++
				}
			}
		}
		state, _, _ := unstructured.NestedString(rc.Object, "status", "state")
		out += fmt.Sprintf(" cluster %s (created %s, state %q, deleting %v): %d starts on the new token, %d on another;",
			rc.GetName(), rc.GetCreationTimestamp().Format(time.RFC3339), state, rc.GetDeletionTimestamp() != nil, on, other)
		// Which container started when, on which token, against when raysync wrote the Secret: a
		// container on another token beside ones on the new token is a split cluster.
		for _, s := range starts {
			if s.Cluster == rc.GetName() && s.TokenFingerprint != "" {
				out += fmt.Sprintf("\n  %s/%s (pod uid %s) started %s on the %s token", s.Pod, s.Container, s.PodUID,
					s.StartedAt.UTC().Format(time.RFC3339Nano), map[bool]string{true: "new", false: "other"}[s.TokenFingerprint == want])
			}
		}
		if sec, err := f.env.Kube.CoreV1().Secrets(f.ns).Get(f.env.ctx, rc.GetName(), metav1.GetOptions{}); err == nil {
			out += fmt.Sprintf("\n  Secret %s created %s, annotations %v", sec.Name, sec.CreationTimestamp.UTC().Format(time.RFC3339), withoutDigest(sec.Annotations))
		}
		if pods, err := f.env.Kube.CoreV1().Pods(f.ns).List(f.env.ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + rc.GetName()}); err == nil {
			for _, p := range pods.Items {
				out += fmt.Sprintf("\n  pod %s (uid %s) created %s", p.Name, p.UID, p.CreationTimestamp.UTC().Format(time.RFC3339))
			}
		}
	}
	return out
}

func (f *fleet) rayJob(name string) *unstructured.Unstructured {
	j, err := f.env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(f.ns).Get(f.env.ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return j
}

// waitJobRunning waits until the RayJob's job runs and returns its cluster's name.
func (f *fleet) waitJobRunning(name string) string {
	f.env.t.Helper()
	var cluster string
	err := wait.PollUntilContextTimeout(f.env.ctx, 200*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		j := f.rayJob(name)
		if j == nil {
			return false, nil
		}
		status, _, _ := unstructured.NestedString(j.Object, "status", "jobStatus")
		cluster, _, _ = unstructured.NestedString(j.Object, "status", "rayClusterName")
		return status == "RUNNING" && cluster != "", nil
	})
	if err != nil {
		f.env.t.Fatalf("RayJob %s never ran", name)
	}
	return cluster
}

// waitJobDone waits until the RayJob succeeded and returns its cluster's name.
func (f *fleet) waitJobDone(name string) string {
	f.env.t.Helper()
	var cluster, status string
	err := wait.PollUntilContextTimeout(f.env.ctx, 200*time.Millisecond, 4*time.Minute, true, func(context.Context) (bool, error) {
		j := f.rayJob(name)
		if j == nil {
			return false, nil
		}
		status, _, _ = unstructured.NestedString(j.Object, "status", "jobStatus")
		cluster, _, _ = unstructured.NestedString(j.Object, "status", "rayClusterName")
		deploy, _, _ := unstructured.NestedString(j.Object, "status", "jobDeploymentStatus")
		return deploy == "Complete" || deploy == "Failed", nil
	})
	if err != nil || status != "SUCCEEDED" {
		f.env.t.Fatalf("RayJob %s: status %q (%v)", name, status, err)
	}
	return cluster
}

// withoutDigest drops the token digest from a Secret's annotations (never printed).
func withoutDigest(a map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range a {
		if k != names.TokenSHA256Annotation {
			out[k] = v
		}
	}
	return out
}
