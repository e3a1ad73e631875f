package standin

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

const testNS = "ns"

type testKubelet struct {
	*Kubelet
	kube *fake.Clientset
	t    *testing.T
}

// startTestKubelet runs a kubelet against a fake clientset, with every delay in milliseconds.
func startTestKubelet(t *testing.T, objs ...runtime.Object) *testKubelet {
	t.Helper()
	return startTestKubeletWith(t, func(*Config) {}, objs...)
}

// startTestKubeletWith starts a test kubelet whose Config set changes.
func startTestKubeletWith(t *testing.T, set func(*Config), objs ...runtime.Object) *testKubelet {
	t.Helper()
	kube := fake.NewClientset(objs...)
	// The fake has no binding subresource: do what the API server does with a Binding.
	kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "binding" {
			return false, nil, nil
		}
		b := a.(k8stesting.CreateAction).GetObject().(*corev1.Binding)
		obj, err := kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), b.Namespace, b.Name)
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod)
		pod.Spec.NodeName = b.Target.Name
		return true, b, kube.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, b.Namespace)
	})
	factory := informers.NewSharedInformerFactory(kube, 0)
	cfg := Config{NodeName: "standin", Backoff: 20 * time.Millisecond, GCSRetry: 20 * time.Millisecond, JoinTimeout: 300 * time.Millisecond,
		ServeDeployDelay: 50 * time.Millisecond, JobPending: 10 * time.Millisecond, JobDuration: 100 * time.Millisecond,
		PrivateRegistry: "registry.example.internal"}
	set(&cfg)
	k, err := NewKubelet(cfg, kube, factory, testFingerprinter(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := k.RegisterNode(ctx); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	return &testKubelet{Kubelet: k, kube: kube, t: t}
}

func tokenSecret(name, token string) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS}, Data: map[string][]byte{"auth_token": []byte(token)}}
}

// rayPod is a pod shaped like KubeRay's: the Ray container first, token auth from secret.
func rayPod(name, nodeType, cluster, secret string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID("uid-" + name),
			Labels: map[string]string{labelCluster: cluster, labelNodeType: nodeType}},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{
			Name: "ray-" + nodeType, Image: "rayproject/ray:2.52.0",
			Env: []corev1.EnvVar{{Name: envAuthMode, Value: authModeToken}, secretEnv(envAuthToken, secret, "auth_token", false)},
		}}},
	}
}

func (tk *testKubelet) create(objs ...runtime.Object) {
	tk.t.Helper()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Pod:
			_, err = tk.kube.CoreV1().Pods(testNS).Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Secret:
			_, err = tk.kube.CoreV1().Secrets(testNS).Create(context.Background(), o, metav1.CreateOptions{})
		case *corev1.Service:
			_, err = tk.kube.CoreV1().Services(testNS).Create(context.Background(), o, metav1.CreateOptions{})
		}
		if err != nil {
			tk.t.Fatal(err)
		}
	}
}

func (tk *testKubelet) updateSecret(s *corev1.Secret) {
	tk.t.Helper()
	if _, err := tk.kube.CoreV1().Secrets(testNS).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		tk.t.Fatal(err)
	}
}

// waitContainer waits until the container of pod satisfies ok and returns it.
func (tk *testKubelet) waitContainer(pod, container string, what string, ok func(ContainerReport) bool) ContainerReport {
	tk.t.Helper()
	var last ContainerReport
	eventually(tk.t, 5*time.Second, what, func() bool {
		p := tk.pod(testNS, pod)
		if p == nil {
			return false
		}
		for _, c := range p.report().Containers {
			if c.Name == container {
				last = c
				return ok(c)
			}
		}
		return false
	})
	return last
}

// apiPod is the pod as the API server has it (what the kubelet wrote).
func (tk *testKubelet) apiPod(name string) *corev1.Pod {
	tk.t.Helper()
	p, err := tk.kube.CoreV1().Pods(testNS).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		tk.t.Fatal(err)
	}
	return p
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func isRunning(c ContainerReport) bool { return c.State == "running" }

func TestHeadRunsAndWritesStatus(t *testing.T) {
	tk := startTestKubelet(t, tokenSecret("c", "tok-a"))
	tk.create(rayPod("c-head", "head", "c", "c"))
	c := tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	if c.TokenFingerprint != tk.fp.Fingerprint("tok-a") {
		t.Error("head started with another token than its Secret's")
	}
	var pod *corev1.Pod
	eventually(t, 5*time.Second, "status written", func() bool {
		pod = tk.apiPod("c-head")
		return pod.Status.Phase == corev1.PodRunning && len(pod.Status.ContainerStatuses) == 1 && pod.Status.ContainerStatuses[0].Ready
	})
	if pod.Spec.NodeName != "standin" || pod.Status.PodIP == "" || pod.Status.HostIP != nodeIP {
		t.Errorf("binding or addresses: node %q, pod IP %q, host IP %q", pod.Spec.NodeName, pod.Status.PodIP, pod.Status.HostIP)
	}
	if _, err := tk.kube.CoreV1().Nodes().Get(context.Background(), "standin", metav1.GetOptions{}); err != nil {
		t.Errorf("node: %v", err)
	}
}

func TestMissingSecretBlocksTheContainerUntilItExists(t *testing.T) {
	tk := startTestKubelet(t)
	tk.create(rayPod("c-head", "head", "c", "later"))
	tk.waitContainer("c-head", "ray-head", "CreateContainerConfigError", func(c ContainerReport) bool {
		return c.State == "waiting" && c.Reason == "CreateContainerConfigError"
	})
	eventually(t, 5*time.Second, "config error written", func() bool {
		st := tk.apiPod("c-head").Status
		return st.Phase == corev1.PodPending && len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].State.Waiting != nil &&
			st.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	tk.create(tokenSecret("later", "tok-late"))
	c := tk.waitContainer("c-head", "ray-head", "running once the Secret exists", isRunning)
	if c.TokenFingerprint != tk.fp.Fingerprint("tok-late") || c.RestartCount != 0 {
		t.Errorf("started with the wrong token or counted a restart: %+v", c.RestartCount)
	}
}

func TestEnvIsResolvedOnceAtContainerCreation(t *testing.T) {
	tk := startTestKubelet(t, tokenSecret("c", "tok-a"))
	tk.create(rayPod("c-head", "head", "c", "c"))
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	tk.updateSecret(tokenSecret("c", "tok-b"))
	time.Sleep(50 * time.Millisecond) // give a (wrong) re-read every chance to happen
	if got := tk.pod(testNS, "c-head").report(); got.Containers[0].TokenFingerprint != tk.fp.Fingerprint("tok-a") {
		t.Error("a running container's token changed with its Secret")
	}
	ip := tk.pod(testNS, "c-head").report().IP
	for token, want := range map[string]int{"tok-a": http.StatusOK, "tok-b": http.StatusForbidden, "": http.StatusUnauthorized} {
		if got := tk.get(CallerClient, "http://"+ip+":8265/api/jobs/", token); got != want {
			t.Errorf("token %q: HTTP %d, want %d", token, got, want)
		}
	}
	st := tk.stats.clusterSnapshot(clusterKey{testNS, "c"}).Requests[CallerClient]
	if st.Accepted != 1 || st.Forbidden != 1 || st.Unauthenticated != 1 {
		t.Errorf("client requests: %+v", st)
	}
}

// get sends GET url through caller's proxy with token as X-Ray-Authorization ("" none).
func (tk *testKubelet) get(caller Caller, url, token string) int {
	req := httptest.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("X-Ray-Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	tk.Proxy(caller).ServeHTTP(rec, req)
	return rec.Code
}

func TestWorkerWithAnotherTokenRestartsWithBackoff(t *testing.T) {
	// A back-off base well above a failing run's length, so the gaps below measure the back-off and
	// not the machine's load (with 20 ms, a first run slowed by a busy machine outlasted run + 20 ms).
	tk := startTestKubeletWith(t, func(c *Config) { c.Backoff = 200 * time.Millisecond }, tokenSecret("c", "tok-head"), tokenSecret("w", "tok-other"))
	tk.create(rayPod("c-head", "head", "c", "c"))
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	tk.create(rayPod("c-worker", "worker", "c", "w"))
	tk.waitContainer("c-worker", "ray-worker", "three restarts", func(c ContainerReport) bool { return c.RestartCount >= 3 })
	st := tk.stats.clusterSnapshot(clusterKey{testNS, "c"})
	if st.JoinFailures < 3 || st.Restarts < 3 || st.Requests[CallerWorker].Forbidden < 3 || st.Requests[CallerWorker].Accepted != 0 {
		t.Errorf("stats: %+v", st)
	}
	pod := tk.apiPod("c-worker")
	if cs := pod.Status.ContainerStatuses; len(cs) != 1 || cs[0].LastTerminationState.Terminated == nil ||
		cs[0].LastTerminationState.Terminated.Reason != exitGCSUnauthorized {
		t.Errorf("worker status: %+v", cs)
	}
	// The first restart is immediate, then the back-off doubles: each gap between starts exceeds the
	// one before it (run + 0, run + 200 ms, run + 400 ms).
	var starts []time.Time
	for _, s := range tk.stats.startsIn(testNS) {
		if s.Pod == "c-worker" {
			starts = append(starts, s.StartedAt)
		}
	}
	if len(starts) < 4 || starts[2].Sub(starts[1]) <= starts[1].Sub(starts[0]) || starts[3].Sub(starts[2]) <= starts[2].Sub(starts[1]) {
		t.Errorf("restarts not backing off: %v", starts)
	}

	// The next restart reads the Secret again: with the head's token it joins.
	tk.updateSecret(tokenSecret("w", "tok-head"))
	c := tk.waitContainer("c-worker", "ray-worker", "joined", func(c ContainerReport) bool {
		return isRunning(c) && tk.pod(testNS, "c-worker").ready()
	})
	if c.TokenFingerprint != tk.fp.Fingerprint("tok-head") {
		t.Error("the restarted worker did not pick up the Secret's new value")
	}
}

func TestWaitGCSReadyRetriesARefusedTokenForever(t *testing.T) {
	tk := startTestKubelet(t, tokenSecret("c", "tok-head"), tokenSecret("w", "tok-other"))
	tk.create(rayPod("c-head", "head", "c", "c"))
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	worker := rayPod("c-worker", "worker", "c", "w")
	worker.Spec.InitContainers = []corev1.Container{{Name: waitGCSReady, Image: "rayproject/ray:2.52.0", Env: worker.Spec.Containers[0].Env}}
	tk.create(worker)
	eventually(t, 5*time.Second, "three refused health checks", func() bool {
		return tk.stats.clusterSnapshot(clusterKey{testNS, "c"}).JoinFailures >= 3
	})
	r := tk.pod(testNS, "c-worker").report()
	if r.Phase != string(corev1.PodPending) || r.Containers[0].State != "running" || r.Containers[0].RestartCount != 0 || r.Containers[1].State != "waiting" {
		t.Errorf("worker: %+v (want wait-gcs-ready still looping, the raylet not created)", r)
	}
}

func TestSubmitterIsAClientOfItsHead(t *testing.T) {
	tk := startTestKubelet(t, tokenSecret("c", "tok-head"), tokenSecret("bad", "tok-bad"))
	tk.create(rayPod("c-head", "head", "c", "c"), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "c-head-svc", Namespace: testNS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{labelCluster: "c", labelNodeType: "head"},
			Ports: []corev1.ServicePort{{Name: "dashboard", Port: 8265}}},
	})
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	submitter := func(name, secret string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNS, UID: types.UID("uid-" + name)},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "ray-job-submitter", Image: "rayproject/ray:2.52.0", Command: []string{"/bin/bash", "-ce", "--"},
				Args: []string{"if ! ray job status ... ; then ray job submit --address http://c-head-svc.ns.svc.cluster.local:8265 --no-wait --submission-id " + name + " -- python train.py ; fi ; ray job logs ..."},
				Env: []corev1.EnvVar{{Name: envDashboardAddress, Value: "c-head-svc.ns.svc.cluster.local:8265"}, {Name: envJobSubmissionID, Value: name},
					{Name: envAuthMode, Value: authModeToken}, secretEnv(envAuthToken, secret, "auth_token", false)},
			}}}}
	}
	tk.create(submitter("job-ok", "c"), submitter("job-bad", "bad"))
	eventually(t, 5*time.Second, "both submitters done", func() bool {
		return tk.apiPod("job-ok").Status.Phase == corev1.PodSucceeded && tk.apiPod("job-bad").Status.Phase == corev1.PodFailed
	})
	h := tk.headOf(clusterKey{testNS, "c"})
	if info, ok := h.jobs.get("job-ok", time.Now()); !ok || info.Status != jobSucceeded || info.Entrypoint != "python train.py" {
		t.Errorf("job-ok on the head: %+v", info)
	}
	if _, ok := h.jobs.get("job-bad", time.Now()); ok {
		t.Error("a submitter with the wrong token submitted")
	}
	if st := tk.stats.clusterSnapshot(clusterKey{testNS, "c"}).Requests[CallerSubmitter]; st.Accepted < 3 || st.Forbidden != 1 {
		t.Errorf("submitter requests: %+v", st)
	}
}

func TestDeletionIsFinished(t *testing.T) {
	tk := startTestKubelet(t, tokenSecret("c", "tok"))
	tk.create(rayPod("c-head", "head", "c", "c"))
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	pod := tk.apiPod("c-head")
	now := metav1.Now()
	pod.DeletionTimestamp = &now
	if _, err := tk.kube.CoreV1().Pods(testNS).Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "pod object deleted", func() bool {
		_, err := tk.kube.CoreV1().Pods(testNS).Get(context.Background(), "c-head", metav1.GetOptions{})
		return err != nil
	})
	if tk.headOf(clusterKey{testNS, "c"}) != nil {
		t.Error("the head of a deleted pod still answers")
	}
	// As the real kubelet, the last status before the object goes is terminal.
	writes := tk.statusWrites("c-head")
	last := writes[len(writes)-1]
	if last.Phase != corev1.PodSucceeded || len(last.ContainerStatuses) != 1 || last.ContainerStatuses[0].State.Terminated == nil {
		t.Errorf("last status written: phase %s, containers %+v; want Succeeded, terminated", last.Phase, last.ContainerStatuses)
	}
}

func TestNamespaceAnnotations(t *testing.T) {
	tk := startTestKubelet(t, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNS, Annotations: map[string]string{AnnotationStart: "never"}}})
	eventually(t, time.Second, "namespace in the cache", func() bool { _, err := tk.nsl.Get(testNS); return err == nil })
	if _, start, _ := tk.namespaceOptions(testNS); start {
		t.Error("a never-start namespace starts pods")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "slow", Annotations: map[string]string{AnnotationStartDelay: "1s"}}}
	if _, err := tk.kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Second, "slow namespace's delay", func() bool { d, ok, _ := tk.namespaceOptions("slow"); return ok && d == time.Second })
}

func TestARestartedStandInAdoptsItsPods(t *testing.T) {
	head := rayPod("c-head", "head", "c", "c")
	head.Spec.NodeName = "standin"
	started := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	head.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "198.19.7.7", StartTime: &started,
		ContainerStatuses: []corev1.ContainerStatus{{Name: "ray-head", RestartCount: 2, State: running()}}}
	tk := startTestKubelet(t, tokenSecret("c", "tok"), head)
	c := tk.waitContainer("c-head", "ray-head", "running again", isRunning)
	if c.RestartCount != 3 {
		t.Errorf("restart count %d, want 3 (the container ran again after the node restart)", c.RestartCount)
	}
	r := tk.pod(testNS, "c-head").report()
	if r.IP != "198.19.7.7" || tk.podByIP("198.19.7.7") == nil {
		t.Errorf("the adopted pod's IP changed to %q", r.IP)
	}
	eventually(t, 5*time.Second, "status kept its start time", func() bool {
		st := tk.apiPod("c-head").Status
		return st.StartTime != nil && st.StartTime.Equal(&started) && len(st.ContainerStatuses) == 1 && st.ContainerStatuses[0].RestartCount == 3
	})
}

// statusWrites are the pod statuses the kubelet wrote for pod, in order.
func (tk *testKubelet) statusWrites(pod string) []corev1.PodStatus {
	tk.t.Helper()
	var out []corev1.PodStatus
	for _, a := range tk.kube.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetSubresource() != "status" || p.GetName() != pod {
			continue
		}
		var body struct{ Status corev1.PodStatus }
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			tk.t.Fatal(err)
		}
		out = append(out, body.Status)
	}
	return out
}

// The real kubelet (TestStandInMatchesRealKubelet): containers behind init containers wait with
// PodInitializing (a reason raysync reads as "env not read yet"), a completed init container is
// ready, and every step has the kubelet's Event.
func TestInitContainersLikeTheKubelet(t *testing.T) {
	tk := startTestKubelet(t, tokenSecret("c", "tok"))
	pod := rayPod("c-worker", "worker", "c", "c")
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "rayproject/ray:2.52.0",
		Env: []corev1.EnvVar{secretEnv("X", "later", "k", false)}}}
	tk.create(pod)
	eventually(t, 5*time.Second, "init container in CreateContainerConfigError", func() bool {
		st := tk.apiPod("c-worker").Status
		return len(st.InitContainerStatuses) == 1 && st.InitContainerStatuses[0].State.Waiting != nil &&
			st.InitContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
	if w := tk.apiPod("c-worker").Status.ContainerStatuses[0].State.Waiting; w == nil || w.Reason != "PodInitializing" {
		t.Errorf("the container behind a waiting init container: %+v, want waiting PodInitializing", w)
	}
	tk.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "later", Namespace: testNS}, Data: map[string][]byte{"k": []byte("v")}})
	eventually(t, 5*time.Second, "init container completed", func() bool {
		st := tk.apiPod("c-worker").Status
		return len(st.InitContainerStatuses) == 1 && st.InitContainerStatuses[0].State.Terminated != nil
	})
	eventually(t, 5*time.Second, "a completed init container is ready", func() bool {
		return tk.apiPod("c-worker").Status.InitContainerStatuses[0].Ready
	})
	eventually(t, 5*time.Second, "the kubelet's Events", func() bool {
		evs, err := tk.kube.CoreV1().Events(testNS).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false
		}
		reasons := map[string]bool{}
		for _, e := range evs.Items {
			if e.Source.Component == "kubelet" && e.InvolvedObject.Name == "c-worker" {
				reasons[e.Reason] = true
			}
		}
		return reasons["Failed"] && reasons["Pulled"] && reasons["Created"] && reasons["Started"]
	})
}

// The real kubelet restarts a container that failed for the first time at once, and backs off
// from the second failure: the first CrashLoopBackOff follows the second run (restartCount 1).
// The back-off is long enough (1 s) for the CrashLoopBackOff status to be written under load: with
// 20 ms the next run's status could replace it before a write (make test on a cold machine saw none).
func TestFirstCrashRestartsAtOnce(t *testing.T) {
	tk := startTestKubeletWith(t, func(c *Config) { c.Backoff = time.Second }, tokenSecret("c", "tok-head"), tokenSecret("w", "tok-other"))
	tk.create(rayPod("c-head", "head", "c", "c"))
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	tk.create(rayPod("c-worker", "worker", "c", "w"))
	tk.waitContainer("c-worker", "ray-worker", "two restarts", func(c ContainerReport) bool { return c.RestartCount >= 2 })
	for _, st := range tk.statusWrites("c-worker") {
		if cs := st.ContainerStatuses; len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CrashLoopBackOff" {
			if cs[0].RestartCount != 1 || cs[0].LastTerminationState.Terminated == nil {
				t.Errorf("first CrashLoopBackOff: restartCount %d, last termination %+v; want 1 and the second run's", cs[0].RestartCount, cs[0].LastTerminationState)
			}
			return
		}
	}
	t.Error("no CrashLoopBackOff written")
}
