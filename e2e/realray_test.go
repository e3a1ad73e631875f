package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// Real Ray in the loop: the stand-in runs Ray 2.60 itself (the harness installs it) for the pods of
// these tests' namespaces, so what is checked is what Ray's own processes accept and do.

const realRayImage = "rayproject/ray:" + framework.RayVersion

// RealRayNamespace creates a namespace whose pods run real Ray. With RAYSYNC_REAL_RAY=off the test is
// skipped, saying so; otherwise a stand-in without real Ray fails it.
func (e *Env) RealRayNamespace() string {
	e.t.Helper()
	if framework.RealRayDisabled() {
		e.t.Skipf("real Ray is off (%s=off)", framework.RealRayOff)
	}
	if _, err := e.StandIn().Network(e.ctx); err != nil {
		e.t.Fatalf("the stand-in runs no real Ray: %v", err)
	}
	return e.NamespaceAnnotated(map[string]string{framework.StandInRay: "real", framework.StandInStartDelay: "0s"})
}

// longer gives a real-Ray test more time than the suite's 10 minutes per test.
func (e *Env) longer(d time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	e.t.Cleanup(cancel)
	e.ctx = ctx
}

// realRayCluster is a token-auth RayCluster for real Ray: a head that runs no tasks (num-cpus 0) and
// a worker group of 1-CPU workers from 0 to 2, small object stores.
func realRayCluster(ns, name string, mutate ...any) *unstructured.Unstructured {
	container := func(n string, mem string) map[string]any {
		return map[string]any{"name": n, "image": realRayImage,
			"resources": map[string]any{"limits": map[string]any{"cpu": "1", "memory": mem}}}
	}
	spec := map[string]any{
		"rayVersion":  framework.RayVersion,
		"authOptions": map[string]any{"mode": "token"},
		"headGroupSpec": map[string]any{
			"rayStartParams": map[string]any{"num-cpus": "0", "object-store-memory": "100000000"},
			"template":       map[string]any{"spec": map[string]any{"containers": []any{container("ray-head", "2Gi")}}},
		},
		"workerGroupSpecs": []any{map[string]any{
			"groupName": "workers", "replicas": int64(0), "minReplicas": int64(0), "maxReplicas": int64(2),
			"rayStartParams": map[string]any{"num-cpus": "1", "object-store-memory": "100000000"},
			"template":       map[string]any{"spec": map[string]any{"containers": []any{container("ray-worker", "1Gi")}}},
		}},
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
	for _, m := range mutate {
		switch m := m.(type) {
		case func(map[string]any):
			m(spec)
		case func(*unstructured.Unstructured):
			m(u)
		}
	}
	return u
}

// autoscalingWithoutServiceAccountToken turns on KubeRay's in-tree autoscaler and mounts no
// service-account token in the head pod: the autoscaler has only what raysync gives it.
func autoscalingWithoutServiceAccountToken(spec map[string]any) {
	spec["enableInTreeAutoscaling"] = true
	spec["autoscalerOptions"] = map[string]any{"idleTimeoutSeconds": int64(60)}
	spec["headGroupSpec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["automountServiceAccountToken"] = false
}

func withRealPrivateImage(spec map[string]any) {
	withPrivateImage(spec)
	templates := []map[string]any{spec["headGroupSpec"].(map[string]any)}
	for _, g := range spec["workerGroupSpecs"].([]any) {
		templates = append(templates, g.(map[string]any))
	}
	for _, t := range templates {
		for _, c := range t["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any) {
			c.(map[string]any)["image"] = framework.PrivateRegistry + "/ml/ray:" + framework.RayVersion
		}
	}
}

// rayCLI runs Ray's own CLI as a client outside the cluster (through the stand-in's client proxy,
// HTTP_PROXY), with the token in RAY_AUTH_TOKEN ("" for none), and returns its output and exit code.
func (e *Env) rayCLI(timeout time.Duration, token string, args ...string) (string, int) {
	e.t.Helper()
	return e.rayCLIVia(e.StandIn().ClientProxyURL, timeout, token, args...)
}

// rayCLIVia is rayCLI through the HTTP proxy at proxy.
func (e *Env) rayCLIVia(proxy string, timeout time.Duration, token string, args ...string) (string, int) {
	e.t.Helper()
	n, err := e.StandIn().Network(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.Venv, "bin", "ray"), args...)
	home := e.t.TempDir()
	cmd.Env = []string{"PATH=" + filepath.Join(n.Venv, "bin") + ":/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8",
		"HTTP_PROXY=" + proxy, "http_proxy=" + proxy, "NO_PROXY=", "RAY_USAGE_STATS_ENABLED=0"}
	if token != "" {
		cmd.Env = append(cmd.Env, "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN="+token)
	}
	out, err := cmd.CombinedOutput()
	code := 0
	if x, ok := err.(*exec.ExitError); ok {
		code = x.ExitCode()
	} else if err != nil {
		e.t.Fatalf("ray %s: %v", strings.Join(args, " "), err)
	}
	return e.redact(string(out)), code
}

// rayPython runs a Python program with Ray's virtualenv as a client outside the cluster: HTTP and
// gRPC (grpc_proxy: CONNECT) go through the stand-in's client proxy.
func (e *Env) rayPython(timeout time.Duration, token, program string) (string, int) {
	e.t.Helper()
	return e.rayPythonVia(e.StandIn().ClientProxyURL, timeout, token, program)
}

// rayClientServerFailed is what Ray Client says when the head's proxier could not start the
// per-client server (its runtime-env agent or the process was too slow on a loaded machine): Ray's
// own failure, which a user meets by connecting again. Auth failures say something else.
const rayClientServerFailed = "Starting Ray client server failed"

// rayZombie is Ray's other failure of its own on a busy machine: Ray reads a process's command line
// with psutil while that process has exited and is not yet reaped (psutil.ZombieProcess, seen once on
// a clean clone with the real node's tests running beside, in `ray.init("ray://…")`).
const rayZombie = "psutil.ZombieProcess"

// rayPythonVia is rayPython through the proxy at proxy (HTTP, and CONNECT for gRPC). A program that
// fails only because of Ray's own failures above is run again, up to 3 times; an authentication
// failure never is.
func (e *Env) rayPythonVia(proxy string, timeout time.Duration, token, program string) (string, int) {
	e.t.Helper()
	var out string
	var code int
	for attempt := 1; attempt <= 3; attempt++ {
		if out, code = e.rayPythonOnce(proxy, timeout, token, program); code == 0 ||
			!(strings.Contains(out, rayClientServerFailed) || strings.Contains(out, rayZombie)) {
			return out, code
		}
		e.t.Logf("attempt %d: Ray's own failure (the head could not start a Ray Client server, or psutil met a zombie); connecting again", attempt)
		time.Sleep(5 * time.Second)
	}
	return out, code
}

func (e *Env) rayPythonOnce(proxy string, timeout time.Duration, token, program string) (string, int) {
	e.t.Helper()
	n, err := e.StandIn().Network(e.ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(n.Venv, "bin", "python"), "-c", program)
	cmd.Env = []string{"PATH=" + filepath.Join(n.Venv, "bin") + ":/usr/bin:/bin", "HOME=" + e.t.TempDir(), "LANG=C.UTF-8", "RAY_USAGE_STATS_ENABLED=0",
		"HTTP_PROXY=" + proxy, "http_proxy=" + proxy, "grpc_proxy=" + proxy, "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=" + token,
		"RAY_grpc_enable_http_proxy=1"} // Ray turns gRPC's proxy support off unless told (ray_constants.GLOBAL_GRPC_OPTIONS)
	out, err := cmd.CombinedOutput()
	code := 0
	if x, ok := err.(*exec.ExitError); ok {
		code = x.ExitCode()
	} else if err != nil {
		e.t.Fatalf("python: %v", err)
	}
	return e.redact(string(out)), code
}

// redact removes every secret value the test registered from s (for output shown on failure).
func (e *Env) redact(s string) string {
	for _, v := range e.secrets {
		if len(v) >= 8 {
			s = strings.ReplaceAll(s, v, "<redacted>")
		}
	}
	return s
}

var submittedJob = regexp.MustCompile(`Job '([^']+)' submitted successfully`)

// submitJob submits entrypoint with `ray job submit --no-wait` and returns the job's id.
func (e *Env) submitJob(dashboard, token, entrypoint string) string {
	e.t.Helper()
	out, code := e.rayCLI(2*time.Minute, token, "job", "submit", "--address", dashboard, "--no-wait", "--", "python", "-c", entrypoint)
	m := submittedJob.FindStringSubmatch(out)
	if code != 0 || m == nil {
		e.t.Fatalf("ray job submit: exit %d\n%s", code, out)
	}
	return m[1]
}

// rayAPI GETs path on a dashboard through the client proxy with the token and decodes the JSON.
func (e *Env) rayAPI(dashboard, path, token string, into any) int {
	e.t.Helper()
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodGet, dashboard+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.StandIn().Client().Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if into != nil && resp.StatusCode == http.StatusOK {
		_ = json.NewDecoder(resp.Body).Decode(into)
	}
	return resp.StatusCode
}

// waitDashboard waits until a head's dashboard answers (a Ready head pod says its raylet and GCS are
// up; the dashboard comes a few seconds later).
func (e *Env) waitDashboard(dashboard, token string) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 500*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return e.rayAPI(dashboard, "/api/version", token, nil) == http.StatusOK, nil
	})
	if err != nil {
		e.t.Fatalf("the dashboard %s never answered", dashboard)
	}
}

// waitJob waits until the job reaches a terminal status and returns it.
func (e *Env) waitJob(dashboard, id, token string, timeout time.Duration) string {
	e.t.Helper()
	var status string
	_ = wait.PollUntilContextTimeout(e.ctx, time.Second, timeout, true, func(context.Context) (bool, error) {
		var info struct {
			Status string `json:"status"`
		}
		if e.rayAPI(dashboard, "/api/jobs/"+id, token, &info) == http.StatusOK {
			status = info.Status
		}
		return status == "SUCCEEDED" || status == "FAILED" || status == "STOPPED", nil
	})
	return status
}

// rayNodes reads the nodes of a cluster from Ray's own state API: node IP -> state (ALIVE, DEAD).
func (e *Env) rayNodes(dashboard, token string) map[string]string {
	e.t.Helper()
	var body struct {
		Data struct {
			Result struct {
				Result []struct {
					NodeIP string `json:"node_ip"`
					State  string `json:"state"`
				} `json:"result"`
			} `json:"result"`
		} `json:"data"`
	}
	if code := e.rayAPI(dashboard, "/api/v0/nodes?limit=100", token, &body); code != http.StatusOK {
		e.t.Fatalf("GET /api/v0/nodes: HTTP %d", code)
	}
	out := map[string]string{}
	for _, n := range body.Data.Result.Result {
		out[n.NodeIP] = n.State
	}
	return out
}

func alive(nodes map[string]string) int {
	n := 0
	for _, st := range nodes {
		if st == "ALIVE" {
			n++
		}
	}
	return n
}

// grantAutoscaler gives user what KubeRay's own autoscaler Role grants (controllers/ray/common/rbac.go).
func (e *Env) grantAutoscaler(ns, user string) {
	e.t.Helper()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/resize"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"ray.io"}, Resources: []string{"rayclusters"}, Verbs: []string{"get", "patch"}},
	}}
	if _, err := e.Kube.RbacV1().Roles(ns).Create(e.ctx, role, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := e.Kube.RbacV1().RoleBindings(ns).Create(e.ctx, rb, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// A job that needs one worker CPU, and one that needs two at the same time.
const (
	oneWorkerJob  = "import ray, socket; ray.init(); print('ran on', ray.get(ray.remote(num_cpus=1)(lambda: socket.gethostname()).remote()))"
	twoWorkersJob = "import ray, time, socket; ray.init(); f = ray.remote(num_cpus=1)(lambda: (time.sleep(20), socket.gethostname())[1]); print('ran on', sorted(set(ray.get([f.remote(), f.remote()]))))"
)

// Seed 001 and 002 end to end with real Ray: a token-auth cluster from a private registry with
// in-tree autoscaling and no service-account token. A job that needs a worker makes Ray's own
// autoscaler scale the group up through the client certificate raysync mounts (its API server is the
// real kube-apiserver, which authenticates it by x509 only); the workers pull with the pull secret,
// start on the canonical token, join, and the job succeeds; a wrong token is refused by Ray. Then the
// canonical token rotates: the cluster is held, and a job needing two workers scales it up again; the
// new workers get the token the cluster runs on and join (Ray's own node list).
func TestRealRayAutoscalingPrivateClusterThroughARotation(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.longer(20 * time.Minute)
		ns, srcNS := env.RealRayNamespace(), env.Namespace()
		t1 := env.NewToken()
		env.PutSource(srcNS, "ray-token", tokenData(t1))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
		const user = "raysync-e2e-autoscaler"
		crt, key, ca, err := env.IssueClientCert(user, nil)
		if err != nil {
			t.Fatal(err)
		}
		env.Secret(strings.Split(string(key), "\n")[1])
		env.PutSecret(srcNS, "autoscaler-tls", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca})
		env.grantAutoscaler(ns, user)
		args := append([]string{"--auth-source=" + srcNS + "/ray-token", "--namespaces=" + ns, "--pull-secret=" + srcNS + "/regcred",
			"--autoscaler-tls-secret=" + srcNS + "/autoscaler-tls", "--autoscaler-api-server=https://kubernetes.default.svc:443"},
			env.webhookFor(srcNS, ns)...)
		s := env.StartSyncer(args...)
		env.waitCABundle(args)

		created := time.Now()
		env.CreateRayCluster(realRayCluster(ns, "auto", autoscalingWithoutServiceAccountToken, withRealPrivateImage))
		head := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=auto,"+kuberay.NodeTypeLabel+"=head", 1, 5*time.Minute)[0]
		headReady := time.Since(created)
		dashboard := headURL(ns, "auto-head-svc")
		env.waitDashboard(dashboard, t1)
		i := slices.IndexFunc(head.Spec.Containers, func(c corev1.Container) bool { return c.Name == "autoscaler" })
		if i < 0 || !hasAutoscalerTLS(&head) {
			t.Fatalf("the head pod's autoscaler lacks raysync's client certificate: %s", describePods([]corev1.Pod{head}))
		}
		for _, v := range head.Spec.Volumes {
			if v.Projected != nil {
				t.Fatalf("the head pod mounts a projected volume %s: the autoscaler must have no service-account token", v.Name)
			}
		}

		// A job that needs a worker: Ray's autoscaler asks the API server for one, with the certificate.
		submitted := time.Now()
		id := env.submitJob(dashboard, t1, oneWorkerJob)
		if st := env.waitJob(dashboard, id, t1, 6*time.Minute); st != "SUCCEEDED" {
			out, _ := env.rayCLI(time.Minute, t1, "job", "logs", "--address", dashboard, id)
			t.Fatalf("job %s: %s; the autoscaler says:\n%s\njob logs:\n%s", id, st, env.containerLog(ns, head.Name, "autoscaler", 30), out)
		}
		scaledUp := time.Since(submitted)
		out, _ := env.rayCLI(time.Minute, t1, "job", "logs", "--address", dashboard, id)
		if !strings.Contains(out, "ran on auto-workers-worker-") {
			t.Errorf("the task did not run on a worker pod:\n%s", out)
		}
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=auto,"+kuberay.NodeTypeLabel+"=worker", 1, time.Minute)
		env.AssertStartedWith(ns, t1, "auto")
		if n := env.rayNodes(dashboard, t1); alive(n) < 2 {
			t.Errorf("Ray's node list %v: want the head and a worker alive", n)
		}
		// Ray Client (gRPC on 10001) from outside, through the stand-in's proxy (HTTP CONNECT).
		if out, code := env.rayPython(2*time.Minute, t1, "import ray; ray.init('ray://auto-head-svc."+ns+".svc.cluster.local:10001'); "+
			"print('ray client says', ray.get(ray.remote(num_cpus=0)(lambda: 42).remote()))"); code != 0 || !strings.Contains(out, "ray client says 42") {
			t.Errorf("Ray Client with the canonical token: exit %d\n%s", code, lastLines(out, 15))
		}
		if out, code := env.rayCLI(time.Minute, env.NewToken(), "job", "submit", "--address", dashboard, "--", "python", "-c", "print(1)"); code == 0 ||
			!strings.Contains(out, "Invalid authentication token") {
			t.Errorf("a job with a wrong token: exit %d\n%s", code, out)
		}
		if v, _ := s.Metric("raysync_pods_recycled_total", map[string]string{"reason": "pull_secret"}); v != 0 {
			t.Errorf("%v pods recycled: the webhook should have given every pod the pull secret at creation", v)
		}

		// Rotation: the cluster is held on t1; a job needing two workers scales it up again, on t1.
		before := env.WaitSecret(ns, "auto", 10*time.Second, holds(t1))
		t2 := env.NewToken()
		rotatedAt := time.Now()
		env.PutSource(srcNS, "ray-token", tokenData(t2))
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "behind"}, 1, 30*time.Second)
		id2 := env.submitJob(dashboard, t1, twoWorkersJob)
		if st := env.waitJob(dashboard, id2, t1, 6*time.Minute); st != "SUCCEEDED" {
			t.Fatalf("job %s on the held cluster: %s; autoscaler:\n%s", id2, st, env.containerLog(ns, head.Name, "autoscaler", 30))
		}
		if cur := env.WaitSecret(ns, "auto", time.Second, nil); cur.ResourceVersion != before.ResourceVersion {
			t.Error("the held cluster's Secret was written after the rotation")
		}
		if all, with := env.startsSince(ns, "auto", t1, rotatedAt, nil); all == 0 || with != all {
			t.Errorf("held cluster: %d of %d container starts after the rotation used the token it runs on", with, all)
		}
		// A node is DEAD in Ray's list once the autoscaler removed its idle worker (idleTimeoutSeconds
		// 60 can pass between the two jobs on a loaded machine): that pod is gone. A DEAD node whose
		// pod still exists is a worker that failed to join or died.
		nodes := env.rayNodes(dashboard, t1)
		pods, err := env.Kube.CoreV1().Pods(ns).List(env.ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=auto"})
		if err != nil {
			t.Fatal(err)
		}
		for ip, st := range nodes {
			for _, p := range pods.Items {
				if st != "ALIVE" && p.Status.PodIP == ip && p.DeletionTimestamp == nil {
					t.Errorf("Ray's node %s is %s while its pod %s exists (a join failure)", ip, st, p.Name)
				}
			}
		}
		if alive(nodes) < 3 {
			t.Errorf("Ray's node list after the scale-up: %v; want the head and two workers alive", nodes)
		}
		if st, err := env.StandIn().Stats(env.ctx, ns, "auto"); err != nil || st.JoinFailures != 0 {
			t.Errorf("join failures seen by the stand-in: %+v %v", st.JoinFailures, err)
		}
		if code := env.rayAPI(dashboard, "/api/jobs/", t2, nil); code != http.StatusForbidden {
			t.Errorf("the held cluster answered the new token with HTTP %d, want 403 (it runs on the old one)", code)
		}

		// The counterfactual, once: a worker started with the other token.
		began := time.Now()
		out, code, err := env.StandIn().RunRayClient(env.ctx, 2*time.Minute, map[string]string{"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": t2},
			"ray", "start", "--address=auto-head-svc."+ns+".svc.cluster.local:6379", "--num-cpus=0", "--block")
		refused := time.Since(began)
		if err != nil || code == 0 || !strings.Contains(out, "InvalidAuthToken") {
			t.Errorf("a worker on the other token: exit %d (%v)\n%s", code, err, env.redact(lastLines(out, 10)))
		}
		line := ""
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "InvalidAuthToken") {
				line = strings.TrimSpace(l)
				break
			}
		}
		workerExit := code
		// The same autoscaler without raysync's entries (no client certificate, no service-account
		// token) cannot authenticate to the API server at all.
		out, code, err = env.StandIn().RunRayClient(env.ctx, 2*time.Minute, map[string]string{"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": t1,
			"KUBERNETES_SERVICE_HOST": "kubernetes.default.svc", "KUBERNETES_SERVICE_PORT_HTTPS": "443", "KUBERAY_CRD_VER": "v1"},
			"ray", "kuberay-autoscaler", "--cluster-name", "auto", "--cluster-namespace", ns, "--gcs-address", "auto-head-svc."+ns+".svc.cluster.local:6379")
		if err != nil || code == 0 || !strings.Contains(out, "/var/run/secrets/kubernetes.io/serviceaccount/token") {
			t.Errorf("the autoscaler without raysync's client certificate: exit %d (%v)\n%s", code, err, env.redact(lastLines(out, 10)))
		}
		t.Logf("MEASURE real-ray kuberay=%s head_ready_s=%.1f submit_to_job_done_with_new_worker_s=%.1f wrong_token_worker_exit=%d after_s=%.1f line=%q autoscaler_without_raysync=%q",
			env.KubeRayVersion, headReady.Seconds(), scaledUp.Seconds(), workerExit, refused.Seconds(), line, lastLines(out, 1))
	})
}

// containerLog is the last n lines a real container printed (its current run).
func (e *Env) containerLog(ns, pod, container string, n int) string {
	e.t.Helper()
	r, err := e.StandIn().Pod(e.ctx, ns, pod)
	if err != nil {
		return err.Error()
	}
	for _, c := range r.Containers {
		if c.Name == container && c.Log != "" {
			b, _ := os.ReadFile(c.Log)
			return e.redact(lastLines(string(b), n))
		}
	}
	return "(no log)"
}

// TestEmulationMatchesRealRay: the emulated Ray the fleet-scale tests run on is checked against Ray
// 2.60 itself. One table of calls goes to a real head and an emulated one: the Jobs API and the
// dashboard with right, wrong and missing tokens in every form Ray reads, the endpoints Ray leaves
// open, Serve's API, POST /api/authenticate, browser traffic, worker joins with the right and a wrong
// token, and KubeRay's own dashboard client. Every difference is a defect of the emulation.
func TestEmulationMatchesRealRay(t *testing.T) {
	if len(controlPlanes) == 0 {
		t.Skip("no control plane")
	}
	cp := newestKubeRay() // v1.6.1 when both run: a user RAY_AUTH_TOKEN wins there
	env := newEnv(t, cp)
	env.longer(15 * time.Minute)
	realNS := env.RealRayNamespace()
	emuNS := env.Namespace()
	wrong := env.NewToken()
	withWrongTokenWorker := func(spec map[string]any) {
		groups := spec["workerGroupSpecs"].([]any)
		g := map[string]any{"groupName": "wrongtoken", "replicas": int64(1), "minReplicas": int64(0), "maxReplicas": int64(1),
			"rayStartParams": map[string]any{"num-cpus": "1", "object-store-memory": "100000000"},
			"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "ray-worker", "image": realRayImage,
				"env": []any{map[string]any{"name": "RAY_AUTH_TOKEN", "value": wrong}}}}}}}
		first := groups[0].(map[string]any)
		first["replicas"] = int64(1)
		spec["workerGroupSpecs"] = append(groups, g)
	}
	supportsUserToken := env.SupportsSecretName() // v1.6+: KubeRay keeps a container's own RAY_AUTH_TOKEN
	// A cluster without token auth whose head nevertheless has a token: Ray 2.59+ turns auth on.
	tokenWithoutAuth := func(spec map[string]any) {
		delete(spec, "authOptions")
		spec["workerGroupSpecs"] = []any{}
		c := spec["headGroupSpec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		c["env"] = []any{map[string]any{"name": "RAY_AUTH_TOKEN", "value": wrong}}
	}
	for _, ns := range []string{realNS, emuNS} {
		opts := []any{}
		if supportsUserToken {
			opts = append(opts, withWrongTokenWorker)
		} else {
			opts = append(opts, func(spec map[string]any) { spec["workerGroupSpecs"].([]any)[0].(map[string]any)["replicas"] = int64(1) })
		}
		env.CreateRayCluster(realRayCluster(ns, "cmp", opts...))
		env.CreateRayCluster(realRayCluster(ns, "noauth", tokenWithoutAuth))
	}
	tokens := map[string]string{}
	for _, ns := range []string{realNS, emuNS} {
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=cmp,"+kuberay.NodeTypeLabel+"=head", 1, 5*time.Minute)
		tokens[ns] = env.Secret(env.secretToken(ns, "cmp"))
		env.waitDashboard(headURL(ns, "cmp-head-svc"), tokens[ns])
	}
	type row struct {
		name, method, path string
		headers            func(token string) map[string]string
	}
	bearer := func(k, prefix string) func(string) map[string]string {
		return func(tok string) map[string]string { return map[string]string{k: prefix + tok} }
	}
	none := func(string) map[string]string { return nil }
	wrongFor := func(h func(string) map[string]string) func(string) map[string]string {
		return func(string) map[string]string { return h(wrong) }
	}
	rows := []row{}
	for _, path := range []string{"/api/jobs/", "/api/version", "/api/serve/applications/"} {
		rows = append(rows,
			row{"no token", "GET", path, none},
			row{"Authorization: Bearer", "GET", path, bearer("Authorization", "Bearer ")},
			row{"Authorization: Bearer, wrong", "GET", path, wrongFor(bearer("Authorization", "Bearer "))},
			row{"Authorization without Bearer", "GET", path, bearer("Authorization", "")},
			row{"Authorization: bearer (lower case)", "GET", path, bearer("Authorization", "bearer ")},
			row{"X-Ray-Authorization: Bearer", "GET", path, bearer("X-Ray-Authorization", "Bearer ")},
			row{"X-Ray-Authorization: Bearer, wrong", "GET", path, wrongFor(bearer("X-Ray-Authorization", "Bearer "))},
			row{"X-Ray-Authorization without Bearer", "GET", path, bearer("X-Ray-Authorization", "")},
			row{"cookie", "GET", path, func(tok string) map[string]string {
				return map[string]string{"Cookie": "ray-authentication-token=" + tok}
			}},
			row{"cookie, wrong", "GET", path, func(string) map[string]string {
				return map[string]string{"Cookie": "ray-authentication-token=" + wrong}
			}},
			row{"wrong Authorization, right X-Ray-Authorization", "GET", path, func(tok string) map[string]string {
				return map[string]string{"Authorization": "Bearer " + wrong, "X-Ray-Authorization": "Bearer " + tok}
			}},
		)
	}
	for _, path := range []string{"/api/gcs_healthz", "/api/authentication_mode", "/api/healthz"} {
		rows = append(rows, row{"no token", "GET", path, none})
	}
	rows = append(rows,
		row{"right token", "POST", "/api/authenticate", bearer("Authorization", "Bearer ")},
		row{"wrong token", "POST", "/api/authenticate", wrongFor(bearer("Authorization", "Bearer "))},
		row{"no token", "POST", "/api/authenticate", none},
		row{"token in X-Ray-Authorization", "POST", "/api/authenticate", bearer("X-Ray-Authorization", "Bearer ")},
		row{"a browser, right token", "POST", "/api/jobs/", func(tok string) map[string]string {
			return map[string]string{"Authorization": "Bearer " + tok, "User-Agent": "Mozilla/5.0", "Content-Type": "application/json"}
		}},
	)
	call := func(ns string, r row) (int, bool) {
		req, _ := http.NewRequestWithContext(env.ctx, r.method, headURL(ns, "cmp-head-svc")+r.path, strings.NewReader(`{"entrypoint":"echo 1"}`))
		for k, v := range r.headers(tokens[ns]) {
			req.Header.Set(k, v)
		}
		resp, err := env.StandIn().Client().Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", r.method, r.path, err)
		}
		resp.Body.Close()
		cookie := false
		for _, c := range resp.Cookies() {
			cookie = cookie || c.Name == "ray-authentication-token"
		}
		return resp.StatusCode, cookie
	}
	for _, ns := range []string{realNS, emuNS} {
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=noauth", 1, 5*time.Minute)
		env.waitDashboard(headURL(ns, "noauth-head-svc"), wrong)
	}
	if got, want := env.rayAPI(headURL(emuNS, "noauth-head-svc"), "/api/jobs/", "", nil), env.rayAPI(headURL(realNS, "noauth-head-svc"), "/api/jobs/", "", nil); got != want {
		t.Errorf("a head with RAY_AUTH_TOKEN and no RAY_AUTH_MODE, no token presented: real Ray answers %d, the emulation %d", want, got)
	}
	for _, r := range rows {
		got, gotCookie := call(emuNS, r)
		want, wantCookie := call(realNS, r)
		if got != want || gotCookie != wantCookie {
			t.Errorf("%s %s (%s): real Ray answers %d (sets the cookie: %v), the emulation %d (%v)", r.method, r.path, r.name, want, wantCookie, got, gotCookie)
		}
	}

	// Worker joins: with the cluster's token a worker joins; with another it is refused and restarts.
	for _, group := range []string{"workers", "wrongtoken"} {
		if group == "wrongtoken" && !supportsUserToken {
			continue
		}
		outcome := map[string]string{}
		for _, ns := range []string{realNS, emuNS} {
			deadline := time.Now().Add(2 * time.Minute)
			for {
				l, err := env.Kube.CoreV1().Pods(ns).List(env.ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=cmp,ray.io/group=" + group})
				if err != nil {
					t.Fatal(err)
				}
				if len(l.Items) > 0 {
					p := l.Items[0]
					switch {
					case podReady(&p):
						outcome[ns] = "joined"
					case restartCount(&p, "ray-worker") > 0:
						outcome[ns] = "refused and restarted"
					case p.Status.StartTime != nil && time.Since(p.Status.StartTime.Time) > 30*time.Second && len(p.Status.InitContainerStatuses) > 0 &&
						p.Status.InitContainerStatuses[0].State.Running != nil:
						outcome[ns] = "wait-gcs-ready refused, retrying"
					}
				}
				if outcome[ns] != "" || time.Now().After(deadline) {
					break
				}
				time.Sleep(time.Second)
			}
		}
		if outcome[realNS] != outcome[emuNS] || outcome[realNS] == "" {
			t.Errorf("worker group %s: real Ray %q, the emulation %q", group, outcome[realNS], outcome[emuNS])
		}
	}

	// KubeRay's own dashboard client, with the cluster's token and a wrong one.
	for _, tok := range []string{"", wrong} {
		r := map[string]rayClientReport{}
		for _, ns := range []string{realNS, emuNS} {
			use := tokens[ns]
			if tok != "" {
				use = tok
			}
			r[ns] = env.runRayClient(headURL(ns, "cmp-head-svc"), use, "cmp-"+strings.TrimPrefix(ns, "e2e-")+fmt.Sprint(len(tok)))
		}
		real, emu := r[realNS], r[emuNS]
		same := func(a, b string) bool { return (a == "") == (b == "") && statusIn(a) == statusIn(b) }
		if real.JobStatus != emu.JobStatus || !same(real.SubmitError, emu.SubmitError) || !same(real.StatusError, emu.StatusError) ||
			!same(real.ServeError, emu.ServeError) || real.GotLogs != emu.GotLogs || !same(real.DeleteError, emu.DeleteError) {
			t.Errorf("KubeRay's dashboard client (wrong token: %v):\nreal Ray  %+v\nemulation %+v", tok != "", real, emu)
		}
	}
}

var httpStatusIn = regexp.MustCompile(`\b(40[0-9]|50[0-9])\b`)

// statusIn is the HTTP status an error message names ("" when none).
func statusIn(msg string) string { return httpStatusIn.FindString(msg) }

// realServeConfig is the RayService's Serve application: e2e/ray/serveapp/hello.py.
func realServeConfig() string {
	root, _ := framework.RepoRoot()
	return `applications:
  - name: hello
    route_prefix: /
    import_path: hello:app
    runtime_env:
      env_vars:
        PYTHONPATH: ` + filepath.Join(root, "e2e", "ray", "serveapp") + `
    deployments:
      - name: Hello
        num_replicas: 1
`
}

// realRayService is a RayService on real Ray: a head-only cluster (the replica needs no CPU) that
// says color, whose old cluster goes 5 s after a switch.
func realRayService(ns, name, color string) *unstructured.Unstructured {
	spec := realRayCluster(ns, "unused", func(spec map[string]any) {
		spec["workerGroupSpecs"] = []any{}
		c := spec["headGroupSpec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		c["env"] = []any{map[string]any{"name": "SERVE_COLOR", "value": color}}
	}).Object["spec"]
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"rayClusterDeletionDelaySeconds": int64(5), "serveConfigV2": realServeConfig(), "rayClusterConfig": spec}}}
}

// TestRealRayServiceServesThroughUpgradeAndRotation: a RayService on real Ray with a real Serve
// application becomes Ready and serves; a blue-green upgrade and a raysync-driven replacement on
// rotation follow, with raysync's webhook on as the chart installs it. A client sending Serve requests
// throughout sees no failed request (Serve is not token-authenticated); the Jobs API accepts the canonical token on the serving cluster at every
// moment but the switch: from the rotation until the new cluster serves (measured).
func TestRealRayServiceServesThroughUpgradeAndRotation(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.longer(25 * time.Minute)
		ns := env.RealRayNamespace()
		t1 := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(t1))
		// As users run it (the chart's default): with the webhook, every cluster's Secret is born on the
		// canonical token. Without it raysync races KubeRay for each new cluster's Secret, and a raced
		// head is recycled once 35 s old (KubeRay's expectations), which can be after the RayService
		// switched its traffic to that cluster: Serve calls fail meanwhile (docs/concepts/webhook.md).
		args := append([]string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns}, env.webhookFor(ns, ns)...)
		s := env.StartSyncer(args...)
		env.waitCABundle(args)
		created := time.Now()
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, realRayService(ns, "hello", "blue"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		blue := env.WaitServiceClusters(ns, "hello", 1, nil)[0].GetName()
		env.WaitRayServiceReady(ns, "hello", 8*time.Minute, func(active string) bool { return active == blue })
		ready := time.Since(created)
		env.AssertStartedWith(ns, t1, blue)

		serveURL := fmt.Sprintf("http://hello-serve-svc.%s.svc.cluster.local:8000/", ns)
		jobsURL := headURL(ns, "hello-head-svc") + "/api/jobs/"
		var canonical atomic.Value
		canonical.Store(t1)
		serve, jobs := &framework.CallLog{}, &framework.CallLog{}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		loop := func(log *framework.CallLog, url string, token func() string) {
			defer wg.Done()
			client := env.StandIn().Client()
			for {
				select {
				case <-stop:
					return
				case <-time.After(250 * time.Millisecond):
				}
				req, _ := http.NewRequestWithContext(env.ctx, http.MethodGet, url, nil)
				if tok := token(); tok != "" {
					req.Header.Set("Authorization", "Bearer "+tok)
				}
				at := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					log.Add(0, "", at)
					continue
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				log.Add(resp.StatusCode, strings.TrimSpace(string(b)), at)
			}
		}
		wg.Add(2)
		go loop(serve, serveURL, func() string { return "" })
		go loop(jobs, jobsURL, func() string { return canonical.Load().(string) })

		// Blue-green upgrade: KubeRay's own, started by a change of the cluster spec.
		upgradeAt := time.Now()
		env.PatchRayService(ns, "hello", `{"spec":{"rayClusterConfig":{"headGroupSpec":{"template":{"spec":{"containers":[{"name":"ray-head","image":"`+
			realRayImage+`","resources":{"limits":{"cpu":"1","memory":"2Gi"}},"env":[{"name":"SERVE_COLOR","value":"green"}]}]}}}}}}`)
		green := env.WaitServiceClusters(ns, "hello", 1, func(rc *unstructured.Unstructured) bool { return rc.GetName() != blue })[0].GetName()
		env.WaitRayServiceReady(ns, "hello", 8*time.Minute, func(active string) bool { return active == green })
		env.waitClusterGone(ns, blue, 3*time.Minute)
		blueGreen := time.Since(upgradeAt)
		env.AssertStartedWith(ns, t1, green)

		// Rotation: raysync has KubeRay replace the cluster; it serves on the new token.
		t2 := env.NewToken()
		rotatedAt := time.Now()
		env.PutSource(ns, "ray-token", tokenData(t2))
		canonical.Store(t2)
		third := env.WaitServiceClusters(ns, "hello", 1, func(rc *unstructured.Unstructured) bool { return rc.GetName() != blue && rc.GetName() != green })[0].GetName()
		env.WaitRayServiceReady(ns, "hello", 8*time.Minute, func(active string) bool { return active == third })
		switchedAt := time.Now()
		env.WaitEvent(ns, "hello", "RotationCompleted", 3*time.Minute)
		replaced := time.Since(rotatedAt)
		time.Sleep(3 * time.Second) // the clients' last calls against the new cluster
		close(stop)
		wg.Wait()
		env.AssertStartedWith(ns, t2, third)
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayService", "state": "current"}, 1, 30*time.Second)

		if serve.Fail != 0 || serve.OK == 0 {
			t.Errorf("Serve requests throughout: %d failed, %d answered", serve.Fail, serve.OK)
		}
		if len(serve.Bodies) < 2 || serve.Bodies[0] != "hello from blue" || serve.Bodies[len(serve.Bodies)-1] != "hello from green" {
			t.Errorf("Serve answers in order: %q", serve.Bodies)
		}
		var window time.Duration
		for _, at := range jobs.Refused {
			if at.Before(rotatedAt) || at.After(switchedAt.Add(2*time.Second)) {
				t.Errorf("the Jobs API refused the canonical token at %s, outside the switch (rotation %s, switch %s)",
					at.Format(time.RFC3339Nano), rotatedAt.Format(time.RFC3339Nano), switchedAt.Format(time.RFC3339Nano))
			}
		}
		if n := len(jobs.Refused); n > 0 {
			window = jobs.Refused[n-1].Sub(jobs.Refused[0]) + 250*time.Millisecond
		}
		if jobs.Fail != len(jobs.Refused) {
			t.Errorf("Jobs API: %d calls failed other than for their token", jobs.Fail-len(jobs.Refused))
		}
		t.Logf("MEASURE real-ray-service kuberay=%s ready_s=%.1f blue_green_s=%.1f rotation_replace_s=%.1f serve_ok=%d serve_failed=%d jobs_ok=%d jobs_refused=%d refused_window_s=%.1f",
			env.KubeRayVersion, ready.Seconds(), blueGreen.Seconds(), replaced.Seconds(), serve.OK, serve.Fail, jobs.OK, len(jobs.Refused), window.Seconds())
	})
}

// waitClusterGone waits until a RayCluster no longer exists.
func (e *Env) waitClusterGone(ns, name string, timeout time.Duration) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 500*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		e.t.Fatalf("RayCluster %s/%s still exists after %s", ns, name, timeout)
	}
}

// A restart a newer rotation overtakes (issue 17: with real Ray a head takes seconds from start to
// Ready, the window the emulation hides): the restart for rotation 2 ends once the cluster runs on new
// pods with its head Ready, with a RotationRetried Warning, frees its slot, and the cluster is
// restarted again onto rotation 3. No container ever runs on a token its head does not hold.
func TestRealRayRestartOvertakenByANewerRotation(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.longer(15 * time.Minute)
		ns := env.RealRayNamespace()
		t1 := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(t1))
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--max-concurrent-rotations=1", "--rotation-timeout=10m")
		headOnly := func(spec map[string]any) { spec["workerGroupSpecs"] = []any{} }
		env.CreateRayCluster(realRayCluster(ns, "restarted", headOnly, withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})))
		first := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarted", 1, 5*time.Minute)[0]
		env.AssertStartedWith(ns, t1, "restarted")
		env.waitForNextSecond([]corev1.Pod{first})

		t2 := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(t2))
		// The restart's new head has started (on t2) and is not Ready yet: the next rotation lands.
		var second corev1.Pod
		err := wait.PollUntilContextTimeout(env.ctx, 100*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			l, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=restarted"})
			if err != nil || len(l.Items) != 1 || l.Items[0].UID == first.UID {
				return false, nil
			}
			second = l.Items[0]
			return containerRunning(&second, "ray-head") && !podReady(&second), nil
		})
		if err != nil {
			t.Fatal("the restart's new head never started")
		}
		t3 := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(t3))

		env.WaitEventMessage(ns, "restarted", "RotationRetried", 5*time.Minute, "rotated again meanwhile")
		env.WaitEvent(ns, "restarted", "RotationCompleted", 5*time.Minute)
		env.WaitSecret(ns, "restarted", 10*time.Second, holds(t3))
		third := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarted", 1, 2*time.Minute)[0]
		if third.UID == second.UID {
			t.Error("the cluster was not restarted again after the overtaken restart")
		}
		starts := env.tokenStarts(ns, t2, func(st standin.ContainerStart) bool { return st.PodUID == string(second.UID) })
		if c := starts["restarted"]; c[0] == 0 || c[1] != c[0] {
			t.Errorf("the overtaken restart's pod: %d of %d container starts on rotation 2's token", c[1], c[0])
		}
		starts = env.tokenStarts(ns, t3, func(st standin.ContainerStart) bool { return st.PodUID == string(third.UID) })
		if c := starts["restarted"]; c[0] == 0 || c[1] != c[0] {
			t.Errorf("the pod after the second restart: %d of %d container starts on rotation 3's token", c[1], c[0])
		}
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "current"}, 1, time.Minute)
		if v, _ := s.Metric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "blocked"}); v != 0 {
			t.Errorf("%v clusters blocked", v)
		}
		if v, _ := s.Metric("raysync_rotations_performed_total", map[string]string{"action": "restart"}); v != 2 {
			t.Errorf("raysync_rotations_performed_total{action=restart} = %v, want 2 (the overtaken restart and the one after)", v)
		}
	})
}

func containerRunning(p *corev1.Pod, name string) bool {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == name && cs.State.Running != nil {
			return true
		}
	}
	return false
}
