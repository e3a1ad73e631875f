package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// Real Ray (-scenarios realray): what a cluster's start costs with and without raysync, how long Ray's
// autoscaler takes to add two workers through raysync's client certificate, a RayService blue-green
// upgrade's wall time, and one real head's memory. Pods run Ray 2.60 itself (the stand-in's real mode).

const realRayNamespace = "realray"

type realRayResult struct {
	Ray  string       `json:"ray"`
	Runs []realRayRun `json:"cluster_starts"`
	// ScaleUpS: job submitted (it needs two worker CPUs; the group is at 0) until both workers joined.
	ScaleUpS float64 `json:"autoscaler_scale_up_0_to_2_s"`
	// BlueGreenS: a RayService's spec changed until its new cluster serves and the old one is gone.
	BlueGreenS float64 `json:"rayservice_blue_green_s"`
	// HeadPSSMiB: proportional set size of every process of one idle head pod (head, autoscaler).
	HeadPSSMiB float64 `json:"head_pss_mib"`
	HeadProcs  int     `json:"head_processes"`
}

type realRayRun struct {
	Raysync bool `json:"raysync"`
	// From the RayCluster's creation: the head's and the worker's Ray container started (what raysync
	// could delay: its Secret, the webhook), and the pods Ready (Ready is quantized by KubeRay's probe
	// periods and wait-gcs-ready's 5 s polling).
	HeadStartedS   float64 `json:"head_container_started_s"`
	WorkerStartedS float64 `json:"worker_container_started_s"`
	HeadReadyS     float64 `json:"head_ready_s"`
	WorkerJoinS    float64 `json:"worker_joined_s"` // created until the worker pod is Ready (joined its head)
}

func realRayCluster(ns, name string, workers int64, autoscale bool) *unstructured.Unstructured {
	c := func(n, mem string) map[string]any {
		return map[string]any{"name": n, "image": "rayproject/ray:" + framework.RayVersion, "resources": map[string]any{"limits": map[string]any{"cpu": "1", "memory": mem}}}
	}
	head := map[string]any{"rayStartParams": map[string]any{"num-cpus": "0", "object-store-memory": "100000000"},
		"template": map[string]any{"spec": map[string]any{"containers": []any{c("ray-head", "2Gi")}}}}
	spec := map[string]any{"rayVersion": framework.RayVersion, "authOptions": map[string]any{"mode": "token"}, "headGroupSpec": head,
		"workerGroupSpecs": []any{map[string]any{"groupName": "workers", "replicas": workers, "minReplicas": int64(0), "maxReplicas": int64(2),
			"rayStartParams": map[string]any{"num-cpus": "1", "object-store-memory": "100000000"},
			"template":       map[string]any{"spec": map[string]any{"containers": []any{c("ray-worker", "1Gi")}}}}}}
	if autoscale {
		spec["enableInTreeAutoscaling"] = true
		head["template"].(map[string]any)["spec"].(map[string]any)["automountServiceAccountToken"] = false
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec}}
}

func (b *bench) realRay(runs int) realRayResult {
	ctx := context.Background()
	_, err := b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns,
		Annotations: map[string]string{framework.StandInRay: "real", framework.StandInStartDelay: "0s"}}}, metav1.CreateOptions{})
	check(err)
	b.token = "bench-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	const user = "raysync-bench-autoscaler"
	crt, key, ca, err := b.cp.IssueClientCert(user, nil)
	check(err)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"}, Data: map[string][]byte{"auth_token": []byte(b.token)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "autoscaler-tls"}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca}},
	} {
		_, err := b.cp.Kube.CoreV1().Secrets(b.ns).Create(ctx, s, metav1.CreateOptions{})
		check(err)
	}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{"ray.io"}, Resources: []string{"rayclusters"}, Verbs: []string{"get", "patch"}}}}
	_, err = b.cp.Kube.RbacV1().Roles(b.ns).Create(ctx, role, metav1.CreateOptions{})
	check(err)
	_, err = b.cp.Kube.RbacV1().RoleBindings(b.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}, metav1.CreateOptions{})
	check(err)
	n, err := b.cp.Ray.Network(ctx)
	check(err)
	res := realRayResult{Ray: framework.RayVersion}

	// Cluster starts, alternately with raysync (its webhook on) and without, after one warm-up.
	for i := -1; i < 2*runs; i++ {
		with := i%2 == 0
		stop := func() {}
		if with {
			var s *proc
			s, _, stop = b.startRealWebhook()
			_ = s
		}
		name := fmt.Sprintf("start-%d", i)
		created := time.Now()
		_, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, realRayCluster(b.ns, name, 1, false), metav1.CreateOptions{})
		check(err)
		run := realRayRun{Raysync: with}
		run.HeadReadyS = b.waitReady(name, "head", 1, created)
		run.WorkerJoinS = b.waitReady(name, "worker", 1, created)
		run.HeadStartedS, run.WorkerStartedS = b.rayStarted(name, "head", created), b.rayStarted(name, "worker", created)
		if i >= 0 {
			res.Runs = append(res.Runs, run)
		}
		if i == 0 {
			res.HeadPSSMiB, res.HeadProcs = b.podPSS(name)
		}
		b.deleteCluster(name)
		stop()
	}

	// Autoscaler scale-up 0 -> 2 through raysync's client certificate.
	_, _, stop := b.startRealWebhook("--autoscaler-tls-secret="+b.ns+"/autoscaler-tls", "--autoscaler-api-server=https://kubernetes.default.svc:443")
	_, err = b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, realRayCluster(b.ns, "auto", 0, true), metav1.CreateOptions{})
	check(err)
	b.waitReady("auto", "head", 1, time.Now())
	dashboard := fmt.Sprintf("http://auto-head-svc.%s.svc.cluster.local:8265", b.ns)
	b.waitDashboard(dashboard)
	submitted := time.Now()
	out, err := b.rayCLI(n.Venv, "job", "submit", "--address", dashboard, "--no-wait", "--", "python", "-c",
		"import ray, time; ray.init(); f = ray.remote(num_cpus=1)(lambda: time.sleep(5)); ray.get([f.remote(), f.remote()])")
	check(err)
	if !regexp.MustCompile(`submitted successfully`).MatchString(out) {
		check(fmt.Errorf("ray job submit: %s", out))
	}
	b.waitReady("auto", "worker", 2, submitted)
	res.ScaleUpS = time.Since(submitted).Seconds()
	b.deleteCluster("auto")
	stop()

	// A RayService blue-green upgrade on real Ray Serve.
	_, _, stop = b.startRealWebhook()
	res.BlueGreenS = b.realBlueGreen()
	stop()
	return res
}

// startRealWebhook runs raysync on the real-Ray namespace with its admission webhook.
func (b *bench) startRealWebhook(extra ...string) (*proc, string, func()) {
	port, err := framework.FreePort()
	check(err)
	name := "raysync-bench-" + b.ns
	api := b.cp.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	_, err = api.Create(context.Background(), framework.WebhookConfiguration(name, port, []string{b.ns}), metav1.CreateOptions{})
	check(err)
	args := append([]string{"--namespaces=" + b.ns, "--precreate-auth-secrets=false", fmt.Sprintf("--webhook-addr=127.0.0.1:%d", port), "--webhook-ips=127.0.0.1",
		"--webhook-configuration=" + name, "--webhook-cert-secret=" + b.ns + "/webhook-tls"}, extra...)
	s := b.startSyncer(args...)
	check(wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := api.Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(c.Webhooks[1].ClientConfig.CABundle) > 0, nil
	}))
	return s, "", func() {
		s.stop()
		_ = api.Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = b.cp.Kube.CoreV1().Secrets(b.ns).Delete(context.Background(), "webhook-tls", metav1.DeleteOptions{})
	}
}

// waitReady waits until cluster has n Ready pods of nodeType and returns the seconds since from.
func (b *bench) waitReady(cluster, nodeType string, n int, from time.Time) float64 {
	sel := kuberay.ClusterLabel + "=" + cluster + "," + kuberay.NodeTypeLabel + "=" + nodeType
	check(wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 6*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, p := range l.Items {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && p.DeletionTimestamp == nil {
					ready++
				}
			}
		}
		return ready >= n, nil
	}))
	return time.Since(from).Seconds()
}

// rayStarted is when the Ray container of the cluster's first pod of nodeType started, in seconds
// since from.
func (b *bench) rayStarted(cluster, nodeType string, from time.Time) float64 {
	l, err := b.cp.Kube.CoreV1().Pods(b.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster + "," + kuberay.NodeTypeLabel + "=" + nodeType})
	check(err)
	for _, p := range l.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if strings.HasPrefix(cs.Name, "ray-") && cs.State.Running != nil {
				return cs.State.Running.StartedAt.Sub(from.Truncate(time.Second)).Seconds()
			}
		}
	}
	return 0
}

func (b *bench) deleteCluster(name string) {
	ctx := context.Background()
	check(b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Delete(ctx, name, metav1.DeleteOptions{}))
	check(wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + name})
		return err == nil && len(l.Items) == 0, nil
	}))
}

func (b *bench) waitDashboard(dashboard string) {
	client := b.cp.Ray.Client()
	check(wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, dashboard+"/api/version", nil)
		req.Header.Set("Authorization", "Bearer "+b.token)
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}))
}

// rayCLI runs Ray's CLI through the stand-in's client proxy with the bench's token.
func (b *bench) rayCLI(venv string, args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(venv, "bin", "ray"), args...)
	cmd.Env = []string{"PATH=" + filepath.Join(venv, "bin") + ":/usr/bin:/bin", "HOME=" + os.TempDir(), "LANG=C.UTF-8", "RAY_USAGE_STATS_ENABLED=0",
		"HTTP_PROXY=" + b.cp.Ray.ClientProxyURL, "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=" + b.token}
	out, err := cmd.CombinedOutput()
	return strings.ReplaceAll(string(out), b.token, "<token>"), err
}

// podPSS sums the proportional set size of every process of a cluster's head pod's containers: the
// process trees of its sandboxes.
func (b *bench) podPSS(cluster string) (float64, int) {
	l, err := b.cp.Kube.CoreV1().Pods(b.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster + "," + kuberay.NodeTypeLabel + "=head"})
	check(err)
	if len(l.Items) == 0 {
		return 0, 0
	}
	uid := string(l.Items[0].UID)
	children := map[int][]int{}
	var roots []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], pid)
		if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.Contains(string(cmd), "sandbox") && strings.Contains(string(cmd), uid) {
			roots = append(roots, pid)
		}
	}
	var kb float64
	procs := 0
	var walk func(int)
	walk = func(pid int) {
		procs++
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid)); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "Pss:") {
					v, _ := strconv.ParseFloat(strings.Fields(line)[1], 64)
					kb += v
				}
			}
		}
		for _, c := range children[pid] {
			walk(c)
		}
	}
	for _, r := range roots {
		walk(r)
	}
	return kb / 1024, procs
}

// realBlueGreen creates a RayService on real Serve, waits until it serves, changes its cluster spec
// and measures until the new cluster serves and the old one is gone.
func (b *bench) realBlueGreen() float64 {
	ctx := context.Background()
	root, err := framework.RepoRoot()
	check(err)
	serve := "applications:\n  - name: hello\n    route_prefix: /\n    import_path: hello:app\n    runtime_env:\n      env_vars:\n        PYTHONPATH: " +
		filepath.Join(root, "e2e", "ray", "serveapp") + "\n    deployments:\n      - name: Hello\n        num_replicas: 1\n"
	spec := realRayCluster(b.ns, "x", 0, false).Object["spec"].(map[string]any)
	spec["workerGroupSpecs"] = []any{}
	rs := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": "hello", "namespace": b.ns},
		"spec":     map[string]any{"rayClusterDeletionDelaySeconds": int64(5), "serveConfigV2": serve, "rayClusterConfig": spec}}}
	gvr := kuberay.RayServiceGVR
	_, err = b.cp.Dynamic.Resource(gvr).Namespace(b.ns).Create(ctx, rs, metav1.CreateOptions{})
	check(err)
	active := func() (string, bool) {
		cur, err := b.cp.Dynamic.Resource(gvr).Namespace(b.ns).Get(ctx, "hello", metav1.GetOptions{})
		if err != nil {
			return "", false
		}
		name, _, _ := unstructured.NestedString(cur.Object, "status", "activeServiceStatus", "rayClusterName")
		pending, _, _ := unstructured.NestedString(cur.Object, "status", "pendingServiceStatus", "rayClusterName")
		conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
		ready := false
		for _, c := range conds {
			m, _ := c.(map[string]any)
			ready = ready || (m["type"] == "Ready" && m["status"] == "True")
		}
		return name, ready && pending == ""
	}
	var blue string
	check(wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(context.Context) (bool, error) {
		n, ok := active()
		blue = n
		return ok && n != "", nil
	}))
	patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"rayClusterConfig": map[string]any{"headGroupSpec": map[string]any{"template": map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{"bench.raysync.dev/version": "2"}}}}}}})
	started := time.Now()
	_, err = b.cp.Dynamic.Resource(gvr).Namespace(b.ns).Patch(ctx, "hello", "application/merge-patch+json", patch, metav1.PatchOptions{})
	check(err)
	check(wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(context.Context) (bool, error) {
		n, ok := active()
		if !ok || n == blue {
			return false, nil
		}
		_, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Get(ctx, blue, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}))
	took := time.Since(started).Seconds()
	_ = b.cp.Dynamic.Resource(gvr).Namespace(b.ns).Delete(ctx, "hello", metav1.DeleteOptions{})
	return took
}
