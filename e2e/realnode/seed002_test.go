package realnode

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
)

var rayServiceGVR = schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayservices"}

// serveAppConfigMap holds e2e/ray/serveapp/hello.py; the Ray containers mount it at /home/ray/serveapp.
func serveAppConfigMap(t *testing.T, ns string) *corev1.ConfigMap {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "e2e/ray/serveapp/hello.py"))
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "serveapp", Namespace: ns}, Data: map[string]string{"hello.py": string(b)}}
}

// rayService is a token-auth RayService of the private Ray image with no pull secret (seed 002's
// platform: the registry's credentials live in another namespace): a head and one worker, the Serve
// application e2e/ray/serveapp saying color; the old cluster goes 5 s after a switch.
func rayService(ns, name, image, color string) *unstructured.Unstructured {
	cluster := rayCluster(ns, "unused", image).Object["spec"].(map[string]any)
	for _, g := range []map[string]any{cluster["headGroupSpec"].(map[string]any), cluster["workerGroupSpecs"].([]any)[0].(map[string]any)} {
		spec := g["template"].(map[string]any)["spec"].(map[string]any)
		delete(spec, "imagePullSecrets")
		spec["volumes"] = []any{map[string]any{"name": "serveapp", "configMap": map[string]any{"name": "serveapp"}}}
		c := spec["containers"].([]any)[0].(map[string]any)
		c["volumeMounts"] = []any{map[string]any{"name": "serveapp", "mountPath": "/home/ray/serveapp"}}
		c["env"] = []any{map[string]any{"name": "SERVE_COLOR", "value": color}}
	}
	serve := `applications:
  - name: hello
    route_prefix: /
    import_path: hello:app
    runtime_env:
      env_vars:
        PYTHONPATH: /home/ray/serveapp
    deployments:
      - name: Hello
        num_replicas: 1
`
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"rayClusterDeletionDelaySeconds": int64(5), "serveConfigV2": serve, "rayClusterConfig": cluster}}}
}

// podLedger records every Ray pod of a namespace by UID: when it ran, and whether anyone deleted it
// before its cluster went.
type podLedger struct {
	mu      sync.Mutex
	pods    map[string]*corev1.Pod
	deleted map[string]bool
}

func watchRayPods(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns string) *podLedger {
	l := &podLedger{pods: map[string]*corev1.Pod{}, deleted: map[string]bool{}}
	w, err := cp.Kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "ray.io/is-ray-node=yes"})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			l.mu.Lock()
			l.pods[string(p.UID)] = p
			if ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
				l.deleted[string(p.UID)] = true
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(w.Stop)
	return l
}

// TestRealNodeSeed002PrivateRayImage is seed 002 on the real node: a RayService whose head and
// workers use the private Ray image, in a namespace without the registry's credentials, then a RayJob
// of that image in each submission mode. Without
// raysync every Ray pod stays in ImagePullBackOff (the kubelet's 401 event). With raysync installed
// from the registry by helm (pullSecrets: platform-secrets/regcred), its webhook gives every Ray pod
// the pull secret at creation: every Ray pod pulls and runs and none is recycled, through a
// blue-green upgrade; and every RayJob succeeds, every pod it made (its submitter's too) pulled with
// the pull secret.
func TestRealNodeSeed002PrivateRayImage(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	image, err := cp.PushRayImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"platform-secrets", "raysync", "seed002"} {
		if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitServiceAccount(ctx, t, cp.Kube, ns)
	}
	regcred, err := cp.RegistryPullSecret("platform-secrets", "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets("platform-secrets").Create(ctx, regcred, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const ns = "seed002"
	if _, err := cp.Kube.CoreV1().ConfigMaps(ns).Create(ctx, serveAppConfigMap(t, ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	services := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns)

	// Without raysync: every Ray pod of the RayService sits in ImagePullBackOff, the kubelet saying 401.
	if _, err := services.Create(ctx, rayService(ns, "before", image, "blue"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var stuck []string
	err = wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/is-ray-node=yes"})
		if err != nil || len(pods.Items) < 2 {
			return false, nil
		}
		stuck = nil
		for _, p := range pods.Items {
			if backOffWith401(ctx, cp, &p) {
				stuck = append(stuck, p.Name)
			}
		}
		return len(stuck) == len(pods.Items), nil
	})
	if err != nil {
		t.Fatalf("without raysync, Ray pods in ImagePullBackOff with the kubelet's 401 event: %v (%v)\n%s", stuck, err, events(ctx, cp.Kube, ns))
	}
	t.Logf("without raysync: %v in ImagePullBackOff, the kubelet's event: authorization failed (401)", stuck)
	if err := services.Delete(ctx, "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/is-ray-node=yes"})
		return err == nil && len(pods.Items) == 0, nil
	}); err != nil {
		t.Fatalf("the first RayService's pods never went: %v", err)
	}

	// raysync from the registry, as a user installs it.
	const version = "0.2.0-seed002"
	raysyncImage, err := cp.PushRaysyncImage(ctx, version, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.PushChart(ctx, version, t.Logf); err != nil {
		t.Fatal(err)
	}
	rs, err := cp.RegistryPullSecret("raysync", "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets("raysync").Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets("raysync").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		StringData: map[string]string{"auth_token": "seed002-realnode-token-value-0123456789"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	repo, _, _ := strings.Cut(raysyncImage, ":"+version)
	if out, err := cp.Helm(ctx, t.Logf, "install", "raysync", framework.RegistryChartRepo+"/raysync", "--version", version,
		"--namespace", "raysync", "--ca-file", cp.Dir+"/ca.crt", "--wait", "--timeout", "5m",
		"--set", "authSource.namespace=raysync,authSource.name=ray-token,namespaces[0]="+ns+",image.repository="+repo+
			",imagePullSecrets[0].name=regcred,pullSecrets[0]=platform-secrets/regcred"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := waitWebhookAnswers(ctx, cp, "raysync", 2); err != nil {
		t.Fatal(err)
	}

	ledger := watchRayPods(ctx, t, cp, ns)
	t0 := time.Now()
	if _, err := services.Create(ctx, rayService(ns, "svc", image, "blue"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first := waitRayServiceServing(ctx, t, cp, ns, "svc", "")
	t.Logf("MEASURE RayService with the private image → Ready (cluster %s, every pod pulled with the pull secret raysync added) in %s", first, time.Since(t0).Round(time.Millisecond))
	waitServes(ctx, t, cp, ns, "svc", "hello from blue")

	// Blue-green: a new rayClusterConfig makes KubeRay create a new cluster; its pods pull too.
	t1 := time.Now()
	u, err := services.Get(ctx, "svc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	green := rayService(ns, "svc", image, "green")
	u.Object["spec"].(map[string]any)["rayClusterConfig"] = green.Object["spec"].(map[string]any)["rayClusterConfig"]
	if _, err := services.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := waitRayServiceServing(ctx, t, cp, ns, "svc", first)
	t.Logf("MEASURE blue-green upgrade → the new cluster %s serves, the old one gone, in %s", second, time.Since(t1).Round(time.Millisecond))
	waitServes(ctx, t, cp, ns, "svc", "hello from green")

	// RayJobs of the private image in each submission mode, at once: K8sJobMode's submitter is a
	// Job's pod running the Ray image (raysync's submitter webhook gives it the pull secret),
	// SidecarMode's a container of the head pod, HTTPMode has none (the operator submits).
	runRayJobsInEachMode(ctx, t, cp, ns, image)

	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	clusters := map[string]int{}
	for uid, p := range ledger.pods {
		c := p.Labels["ray.io/cluster"]
		clusters[c]++
		hasSecret := false
		for _, s := range p.Spec.ImagePullSecrets {
			hasSecret = hasSecret || s.Name == "regcred"
		}
		if !hasSecret {
			t.Errorf("pod %s (cluster %s) was created without the pull secret: %v", p.Name, c, p.Spec.ImagePullSecrets)
		}
		if ledger.deleted[uid] && c == second {
			t.Errorf("pod %s of the serving cluster %s was deleted (recycled)", p.Name, c)
		}
	}
	if clusters[first] != 2 || clusters[second] != 2 {
		t.Errorf("Ray pods per cluster %v; want exactly 2 (head, worker) for %s and %s: none recycled", clusters, first, second)
	}
}

// backOffWith401 reports whether the pod waits in ImagePullBackOff and the kubelet's Failed event
// for it says the registry refused the pull (401, "authorization failed").
func backOffWith401(ctx context.Context, cp *framework.ControlPlane, p *corev1.Pod) bool {
	back := false
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		back = back || (s.State.Waiting != nil && s.State.Waiting.Reason == "ImagePullBackOff")
	}
	if !back {
		return false
	}
	evs, err := cp.Kube.CoreV1().Events(p.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + p.Name + ",reason=Failed"})
	if err != nil {
		return false
	}
	for _, e := range evs.Items {
		if e.Source.Component == "kubelet" && strings.Contains(e.Message, "authorization failed") {
			return true
		}
	}
	return false
}

// waitWebhookAnswers waits until want replicas back raysync's webhook Service in ns (kube-proxy
// follows the pods' readiness, and the EndpointSlice may lag Ready by a second), then for kube-proxy.
func waitWebhookAnswers(ctx context.Context, cp *framework.ControlPlane, ns string, want int) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := cp.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=raysync-webhook"})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, sl := range s.Items {
			for _, e := range sl.Endpoints {
				if e.Conditions.Ready != nil && *e.Conditions.Ready {
					ready++
				}
			}
		}
		if ready < want {
			return false, nil
		}
		time.Sleep(2 * time.Second) // kube-proxy's rules follow the slice
		return true, nil
	})
}

// waitRayServiceServing waits until the RayService is Ready on an active cluster other than old,
// old's RayCluster is gone, and every Ray pod left runs; it returns the active cluster's name.
func waitRayServiceServing(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, name, old string) string {
	t.Helper()
	var active, why string
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 12*time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		active, _, _ = unstructured.NestedString(u.Object, "status", "activeServiceStatus", "rayClusterName")
		ready := false
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Ready" && m["status"] == "True" {
				ready = true
			}
		}
		if !ready || active == "" || active == old {
			why = fmt.Sprintf("Ready %v, active cluster %q", ready, active)
			return false, nil
		}
		if old != "" {
			if _, err := cp.Dynamic.Resource(rayClusterGVR).Namespace(ns).Get(ctx, old, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				why = "the old cluster " + old + " is still there"
				return false, nil
			}
		}
		pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + active})
		if err != nil || len(pods.Items) != 2 {
			why = fmt.Sprintf("%d pods of %s", len(pods.Items), active)
			return false, nil
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning {
				why = p.Name + " " + string(p.Status.Phase)
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("RayService %s/%s not serving on a new cluster: %s (%v)\nevents:\n%s", ns, name, why, err, events(ctx, cp.Kube, ns))
	}
	return active
}

// waitServes waits until the RayService's serve Service answers want (the Serve application on real
// Ray, called by the Service's cluster name through the node's service proxy).
func waitServes(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, name, want string) {
	t.Helper()
	client := cp.ServiceClient(5 * time.Second)
	url := "http://" + name + "-serve-svc." + ns + ".svc.cluster.local:8000/"
	var got string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			got = err.Error()
			return false, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		got = fmt.Sprintf("HTTP %d %s", resp.StatusCode, b)
		return resp.StatusCode == http.StatusOK && string(b) == want, nil
	}); err != nil {
		t.Fatalf("%s: %s, want %q", url, got, want)
	}
	t.Logf("%s answers %q", url, want)
}

var rayJobGVR = schema.GroupVersionResource{Group: "ray.io", Version: "v1", Resource: "rayjobs"}

// rayJob is a token-auth RayJob of the private image with no pull secret: a head-only cluster that
// runs the entrypoint, submitted in mode, shut down when the job ends.
func rayJob(ns, name, image, mode string) *unstructured.Unstructured {
	cluster := rayCluster(ns, "unused", image).Object["spec"].(map[string]any)
	delete(cluster, "workerGroupSpecs")
	head := cluster["headGroupSpec"].(map[string]any)
	head["rayStartParams"] = map[string]any{"num-cpus": "1", "object-store-memory": "100000000"}
	delete(head["template"].(map[string]any)["spec"].(map[string]any), "imagePullSecrets")
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayJob",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"submissionMode": mode, "shutdownAfterJobFinishes": true, "rayClusterSpec": cluster,
			"entrypoint": `python -c "import ray; ray.init(); print('raysync-rayjob', ray.get(ray.remote(lambda: 42).remote()))"`}}}
}

// runRayJobsInEachMode runs one RayJob per submission mode side by side in ns (no pull secret of
// its own) and fails unless each SUCCEEDED and every pod the jobs made carried raysync's pull secret;
// K8sJobMode must have made a submitter pod (not a Ray pod) and it must have pulled too.
func runRayJobsInEachMode(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, image string) {
	t.Helper()
	modes := map[string]string{"job-k8s": "K8sJobMode", "job-sidecar": "SidecarMode", "job-http": "HTTPMode"}
	var mu sync.Mutex
	seen := map[string]*corev1.Pod{} // every pod of the jobs, by UID, as last seen
	w, err := cp.Kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && strings.HasPrefix(p.Name, "job-") {
				mu.Lock()
				seen[string(p.UID)] = p
				mu.Unlock()
			}
		}
	}()
	t0 := time.Now()
	for name, mode := range modes {
		if _, err := cp.Dynamic.Resource(rayJobGVR).Namespace(ns).Create(ctx, rayJob(ns, name, image, mode), metav1.CreateOptions{}); err != nil {
			t.Fatalf("RayJob %s (%s): %v", name, mode, err)
		}
	}
	done := map[string]string{}
	err = wait.PollUntilContextTimeout(ctx, 2*time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		for name := range modes {
			u, err := cp.Dynamic.Resource(rayJobGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				continue
			}
			job, _, _ := unstructured.NestedString(u.Object, "status", "jobStatus")
			deploy, _, _ := unstructured.NestedString(u.Object, "status", "jobDeploymentStatus")
			if deploy == "Complete" || deploy == "Failed" {
				if _, ok := done[name]; !ok {
					t.Logf("MEASURE RayJob %s (%s) of the private image: %s/%s after %s", name, modes[name], deploy, job, time.Since(t0).Round(time.Second))
				}
				done[name] = deploy + "/" + job
			}
		}
		return len(done) == len(modes), nil
	})
	if err != nil {
		mu.Lock()
		var stuck []string
		for _, p := range seen {
			if !podReady(p) && p.Status.Phase != corev1.PodSucceeded {
				stuck = append(stuck, p.Name+" "+describeWaiting(p))
			}
		}
		mu.Unlock()
		t.Fatalf("RayJobs not finished within 10 minutes: %v; pods not running: %v\n%s", done, stuck, events(ctx, cp.Kube, ns))
	}
	for name, st := range done {
		if st != "Complete/SUCCEEDED" {
			t.Errorf("RayJob %s (%s): %s, want Complete/SUCCEEDED\n%s", name, modes[name], st, events(ctx, cp.Kube, ns))
		}
	}
	time.Sleep(2 * time.Second) // the watch's last events
	mu.Lock()
	defer mu.Unlock()
	submitters := 0
	for _, p := range seen {
		has := false
		for _, s := range p.Spec.ImagePullSecrets {
			has = has || s.Name == "regcred"
		}
		if !has {
			t.Errorf("pod %s was created without the pull secret: %v", p.Name, p.Spec.ImagePullSecrets)
		}
		if p.Labels["ray.io/is-ray-node"] == "" {
			submitters++
			if !strings.HasPrefix(p.Name, "job-k8s") {
				t.Errorf("a pod that is neither a Ray pod nor K8sJobMode's submitter: %s", p.Name)
			}
		}
	}
	if submitters == 0 {
		t.Errorf("no submitter pod seen for K8sJobMode (pods: %d)", len(seen))
	}
}

// describeWaiting says why a pod's containers wait, if they do.
func describeWaiting(p *corev1.Pod) string {
	var out []string
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if s.State.Waiting != nil {
			out = append(out, s.Name+":"+s.State.Waiting.Reason)
		}
	}
	return strings.Join(out, ",")
}
