package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeRaysyncFromRegistry installs raysync as users install it: its image built and pushed to
// the node's private registry, its chart packaged and pushed as OCI, `helm install oci://…`. Both
// replicas pull the image with a pull secret, pass the chart's probes with a read-only root as a
// non-root user, talk to the API server in-cluster through the kubernetes Service (kube-proxy), elect
// one leader, and `kubectl -n raysync exec deploy/raysync -- /syncer status` answers.
func TestRealNodeRaysyncFromRegistry(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	const version = "0.2.0-realnode"
	t0 := time.Now()
	image, err := cp.PushRaysyncImage(ctx, version, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.PushChart(ctx, version, t.Logf); err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s and chart %s/raysync:%s pushed in %s", image, framework.RegistryChartRepo, version, time.Since(t0).Round(time.Millisecond))

	ns := "raysync"
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	secret, err := cp.RegistryPullSecret(ns, "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		StringData: map[string]string{"auth_token": "realnode-e2e-token-value"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	repo, _, _ := strings.Cut(image, ":"+version)
	t1 := time.Now()
	if out, err := cp.Helm(ctx, t.Logf, "install", "raysync", framework.RegistryChartRepo+"/raysync", "--version", version,
		"--namespace", ns, "--ca-file", cp.Dir+"/ca.crt",
		"--set", "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true,image.repository="+repo+",imagePullSecrets[0].name=regcred"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var dep *appsv1.Deployment
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cp.Kube.AppsV1().Deployments(ns).Get(ctx, "raysync", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		dep = d
		return d.Status.ReadyReplicas == 2 && d.Status.UpdatedReplicas == 2, nil
	}); err != nil {
		pods, _ := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		var b strings.Builder
		for _, p := range pods.Items {
			b.WriteString(p.Name + " " + string(p.Status.Phase) + "\n")
			if logs, err := cp.Kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptr(int64(15))}).DoRaw(ctx); err == nil {
				b.Write(logs)
			}
		}
		t.Fatalf("raysync not 2/2 Ready: %v (status %+v)\npods:\n%s\nevents:\n%s", err, dep.Status, b.String(), events(ctx, cp.Kube, ns))
	}
	t.Logf("helm install → 2/2 Ready in %s", time.Since(t1).Round(time.Millisecond))

	pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=raysync"})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range pods.Items {
		names[p.Name] = true
		c := p.Spec.Containers[0]
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("pod %s: securityContext %+v, probes %v/%v; want a read-only root and both probes", p.Name, sc, c.ReadinessProbe != nil, c.LivenessProbe != nil)
		}
		if st := p.Status.ContainerStatuses; len(st) == 0 || !strings.HasPrefix(st[0].ImageID, framework.RegistryHost+"/raysync@sha256:") {
			t.Errorf("pod %s: image %v, want pulled from %s", p.Name, st, framework.RegistryHost)
		}
		if p.Spec.NodeName != framework.NodeName {
			t.Errorf("pod %s on %q", p.Name, p.Spec.NodeName)
		}
	}
	if len(names) != 2 {
		t.Fatalf("raysync pods %v, want 2", names)
	}
	// One leader among the two (its identity is the pod's name).
	var holder string
	_ = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		leases, err := cp.Kube.CoordinationV1().Leases(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, l := range leases.Items {
			if l.Spec.HolderIdentity != nil {
				for n := range names {
					if strings.HasPrefix(*l.Spec.HolderIdentity, n) {
						holder = n
					}
				}
			}
		}
		return holder != "", nil
	})
	if holder == "" {
		t.Errorf("no Lease in %s held by a raysync pod", ns)
	}
	t.Logf("leader: %s", holder)

	// The webhook, called by the API server through raysync's Service (routed into the node, translated
	// by kube-proxy): a Ray pod's creation shows as a webhook request answered 200 in the API server's
	// own metrics. Right after the Deployment turns Ready the API server may still find no endpoint
	// (the EndpointSlice and kube-proxy's rules follow the pods' readiness) and fail open, as in any
	// cluster: Ray pods are created until one is answered, and the failures before are reported.
	rayNS := "realnode-ray"
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: rayNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, rayNS)
	var called, failedOpen []string
	tReady := time.Now()
	for i := 0; len(called) == 0 && time.Since(tReady) < time.Minute; i++ {
		rayPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c-head-%d", i), Namespace: rayNS,
			Labels: map[string]string{"app.kubernetes.io/created-by": "kuberay-operator", "ray.io/cluster": "c"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-head", Image: framework.TinyImage, ImagePullPolicy: corev1.PullNever}}}}
		if _, err := cp.Kube.CoreV1().Pods(rayNS).Create(ctx, rayPod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		metrics, err := cp.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		called, failedOpen = nil, nil
		for _, l := range strings.Split(string(metrics), "\n") {
			if strings.HasPrefix(l, "apiserver_admission_webhook_request_total{") && strings.Contains(l, `name="pods.raysync.dev"`) && strings.Contains(l, `code="200"`) {
				called = append(called, l)
			}
			if strings.HasPrefix(l, "apiserver_admission_webhook_fail_open_count{") && strings.Contains(l, "raysync.dev") {
				failedOpen = append(failedOpen, l)
			}
		}
		if len(called) == 0 {
			time.Sleep(500 * time.Millisecond)
		}
	}
	if len(called) == 0 {
		t.Errorf("the API server never got an answer from raysync's webhook within a minute of 2/2 Ready (failed open: %v)", failedOpen)
	}
	t.Logf("the API server called the webhook %s after 2/2 Ready: %v (failed open before: %v)", time.Since(tReady).Round(time.Millisecond), called, failedOpen)

	kubectl, err := framework.Kubectl(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "-n", ns, "exec", "deploy/raysync", "--", "/syncer", "status").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl exec deploy/raysync -- /syncer status: %v\n%s", err, out)
	}
	t.Logf("/syncer status in the pod:\n%s", out)
	logRaysyncMemory(ctx, t, cp, ns, holder)

	// Deleting the leader pod hands the Lease to the other replica within the lease time (15 s):
	// the leader drains and releases it on SIGTERM, the standby takes it at its next retry.
	watch := watchLeadership(ctx, t, cp, ns, "raysync")
	tDel := time.Now()
	if err := cp.Kube.CoreV1().Pods(ns).Delete(ctx, holder, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var next string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Kube.CoordinationV1().Leases(ns).Get(ctx, "raysync", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" || strings.HasPrefix(*l.Spec.HolderIdentity, holder) {
			return false, nil
		}
		next = *l.Spec.HolderIdentity
		return true, nil
	}); err != nil {
		t.Fatalf("the Lease never left the deleted leader %s", holder)
	}
	handover := time.Since(tDel)
	t.Logf("MEASURE leader pod deleted → Lease held by %s in %s", next, handover.Round(time.Millisecond))
	if handover > 15*time.Second {
		t.Errorf("handover took %s, longer than the lease (15 s)", handover)
	}
	if err := waitReady(ctx, cp, ns, 2); err != nil {
		t.Fatal(err)
	}

	// helm upgrade to a second chart version (and image tag) in the registry rolls both pods; at no
	// moment is the Lease unheld (released, or not renewed) for longer than the lease.
	const version2 = "0.2.1-realnode"
	if _, err := cp.PushRaysyncImage(ctx, version2, t.Logf); err != nil {
		t.Fatal(err)
	}
	if err := cp.PushChart(ctx, version2, t.Logf); err != nil {
		t.Fatal(err)
	}
	tUp := time.Now()
	if out, err := cp.Helm(ctx, t.Logf, "upgrade", "raysync", framework.RegistryChartRepo+"/raysync", "--version", version2,
		"--namespace", ns, "--ca-file", cp.Dir+"/ca.crt", "--reset-then-reuse-values"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=raysync"})
		if err != nil {
			return false, nil
		}
		n := 0
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && strings.HasSuffix(p.Spec.Containers[0].Image, ":"+version2) && podReady(&p) {
				n++
			}
		}
		return n == 2 && len(pods.Items) == 2, nil
	}); err != nil {
		t.Fatalf("helm upgrade to %s: both pods never ran the new image: %v\nevents:\n%s", version2, err, events(ctx, cp.Kube, ns))
	}
	time.Sleep(3 * time.Second) // the new leader renews at least once after the last old pod is gone
	gap := watch()
	t.Logf("MEASURE helm upgrade → 2 new pods Ready in %s; longest time the Lease was unheld since the leader's deletion: %s",
		time.Since(tUp).Round(time.Millisecond), gap.Round(time.Millisecond))
	if gap > 15*time.Second {
		t.Errorf("the Lease was unheld for %s, longer than the lease (15 s)", gap)
	}
}

// watchLeadership samples the Lease every 200 ms until the returned func is called, which returns
// the longest stretch in which no replica led: no holder, or a holder that had not renewed within
// the lease duration.
func watchLeadership(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, name string) func() time.Duration {
	stop := make(chan struct{})
	done := make(chan time.Duration)
	go func() {
		var longest time.Duration
		var since time.Time
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- longest
				return
			case <-tick.C:
			}
			l, err := cp.Kube.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				continue // an API error says nothing of the Lease
			}
			led := l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Spec.RenewTime != nil &&
				l.Spec.LeaseDurationSeconds != nil && time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
			switch {
			case !led && since.IsZero():
				since = time.Now()
			case led && !since.IsZero():
				longest = max(longest, time.Since(since))
				since = time.Time{}
			}
			if !since.IsZero() {
				longest = max(longest, time.Since(since))
			}
		}
	}()
	return func() time.Duration { close(stop); return <-done }
}

// logRaysyncMemory prints each raysync container's memory as the kubelet measures it for eviction and
// `kubectl top` (its Summary API, read through the API server's node proxy): the working set and RSS.
func logRaysyncMemory(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, leader string) {
	t.Helper()
	raw, err := cp.Kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", framework.NodeName, "proxy/stats/summary").DoRaw(ctx)
	if err != nil {
		t.Errorf("the kubelet's Summary API: %v", err)
		return
	}
	var summary struct {
		Pods []struct {
			PodRef struct {
				Name, Namespace string
			} `json:"podRef"`
			Containers []struct {
				Name   string `json:"name"`
				Memory *struct {
					WorkingSetBytes *uint64 `json:"workingSetBytes"`
					RSSBytes        *uint64 `json:"rssBytes"`
				} `json:"memory"`
			} `json:"containers"`
		} `json:"pods"`
	}
	if err := json.Unmarshal(raw, &summary); err != nil {
		t.Errorf("the kubelet's Summary API: %v", err)
		return
	}
	seen := 0
	for _, p := range summary.Pods {
		if p.PodRef.Namespace != ns {
			continue
		}
		for _, c := range p.Containers {
			if c.Memory == nil || c.Memory.WorkingSetBytes == nil {
				continue
			}
			role := "standby"
			if p.PodRef.Name == leader {
				role = "leader"
			}
			rss := uint64(0)
			if c.Memory.RSSBytes != nil {
				rss = *c.Memory.RSSBytes
			}
			seen++
			t.Logf("MEASURE raysync pod memory (%s, %s/%s): working set %.1f MiB, RSS %.1f MiB",
				role, p.PodRef.Name, c.Name, float64(*c.Memory.WorkingSetBytes)/(1<<20), float64(rss)/(1<<20))
		}
	}
	if seen == 0 {
		t.Errorf("the kubelet's Summary API reported no memory for a container in %s", ns)
	}
}

func waitReady(ctx context.Context, cp *framework.ControlPlane, ns string, n int32) error {
	return wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cp.Kube.AppsV1().Deployments(ns).Get(ctx, "raysync", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == n && d.Status.Replicas == n, nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }
