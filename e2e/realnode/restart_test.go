package realnode

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeRestartStartsEveryContainerOnTheWrittenToken: issue 26 item 3, raysync's half. A
// restart writes the new token into the cluster's Secret once no pod is left and then un-suspends;
// the real kubelet resolves the pods' secretKeyRef through its Watch-based secret manager, whose
// store can hold the previous value when a reflector for that Secret already runs on the node
// (kubernetes#129645). Here one always does: a client pod of the user's reads the cluster's Secret
// for its token the whole time. raysync is installed from the registry by helm with the restart
// policy for RayClusters; the canonical token rotates several times in a row; after each restart
// every Ray container's environment, as the kubelet resolved it (read from inside the container with
// `kubectl exec … printenv`), is compared with the token raysync wrote, and no container or init
// container may have started twice (a restart would hide a first start on another token). Then the cluster is deleted
// and created again under its name right after a rotation, the client pod still reading a Secret of
// that name. The counts are printed; any container on another token fails the test. Tokens are
// compared in the test, never printed.
func TestRealNodeRestartStartsEveryContainerOnTheWrittenToken(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	rayImage, err := cp.PushRayImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	const platform, ns, name, rounds = "raysync", "realnode-restart", "rc", 3
	createNamespaces(ctx, t, cp, platform, ns)
	token := func(r int) string { return fmt.Sprintf("realnode-restart-token-%d-%d", r, time.Now().UnixNano()) }
	tokens := []string{token(0)}
	source := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"}, StringData: map[string]string{"auth_token": tokens[0]}}
	if _, err := cp.Kube.CoreV1().Secrets(platform).Create(ctx, source, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installRaysync(ctx, t, cp, platform, "0.2.0-restart", "namespaces[0]="+ns, "rotation.policies.rayCluster=restart", "replicas=1")

	// The user's client pod reads the cluster's Secret for its token: the kubelet's reflector for
	// that Secret runs before, during and after every restart. It references the Secret before the
	// cluster exists (CreateContainerConfigError until raysync or KubeRay creates it).
	client := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ray-client", Namespace: ns}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "client", Image: framework.TinyImage, ImagePullPolicy: corev1.PullNever,
			Env: []corev1.EnvVar{{Name: "RAY_AUTH_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "auth_token"}}}}}}}}
	if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, client, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	rc := rayCluster(ns, name, rayImage)
	// No pull secret in the templates: raysync's webhook gives every Ray pod platform's regcred.
	for _, group := range []string{"headGroupSpec"} {
		unstructured.RemoveNestedField(rc.Object, "spec", group, "template", "spec", "imagePullSecrets")
	}
	workers, _, _ := unstructured.NestedSlice(rc.Object, "spec", "workerGroupSpecs")
	for _, w := range workers {
		unstructured.RemoveNestedField(w.(map[string]any), "template", "spec", "imagePullSecrets")
	}
	_ = unstructured.SetNestedSlice(rc.Object, workers, "spec", "workerGroupSpecs")
	t0 := time.Now()
	if _, err := cp.Dynamic.Resource(rayClusterGVR).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rayPods := waitClusterPods(ctx, t, cp, ns, name, t0)
	t.Logf("MEASURE RayCluster created (raysync installed) → head and worker Ready: %s", time.Since(t0).Round(time.Millisecond))
	waitPodRunning(ctx, t, cp.Kube, ns, client.Name)

	kubectl, err := framework.Kubectl(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	// envOf is the token a container started with, read from inside it.
	envOf := func(pod, container string) string {
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "-n", ns, "exec", pod, "-c", container, "--",
			"printenv", "RAY_AUTH_TOKEN").Output()
		if err != nil {
			t.Fatalf("kubectl exec %s -c %s -- printenv RAY_AUTH_TOKEN: %v", pod, container, err)
		}
		return strings.TrimSpace(string(out))
	}
	// check counts the Ray containers not on want (and logs which, never the value). printenv reads
	// the container's current start; a container (or init container, whose environment cannot be
	// read once it exited) that started more than once may have started first on another token and
	// failed on it, so any restart is counted as a start not shown to be on want.
	check := func(round int, pods []corev1.Pod, want string) (all, stale int) {
		for _, p := range pods {
			now, err := cp.Kube.CoreV1().Pods(ns).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, st := range append(append([]corev1.ContainerStatus{}, now.Status.InitContainerStatuses...), now.Status.ContainerStatuses...) {
				if st.RestartCount != 0 {
					stale++
					why := "" // the reason and exit code only: a termination message may hold the container's log
					if last := st.LastTerminationState.Terminated; last != nil {
						why = fmt.Sprintf(" (last ended: %s, exit %d)", last.Reason, last.ExitCode)
					}
					t.Errorf("round %d: %s/%s started %d times%s: its earlier starts are not shown to be on the token raysync wrote",
						round, p.Name, st.Name, st.RestartCount+1, why)
				}
			}
			for _, c := range p.Spec.Containers {
				all++
				switch got := envOf(p.Name, c.Name); {
				case got == want:
				case got == "":
					t.Errorf("round %d: %s/%s has no RAY_AUTH_TOKEN", round, p.Name, c.Name)
				default:
					stale++
					prev := "a token never written"
					for i, tok := range tokens {
						if got == tok {
							prev = fmt.Sprintf("the token of round %d", i)
						}
					}
					t.Errorf("round %d: %s/%s started with %s, not the one raysync wrote", round, p.Name, c.Name, prev)
				}
			}
		}
		return all, stale
	}
	if all, stale := check(0, rayPods, tokens[0]); stale != 0 || all < 2 {
		t.Fatalf("a new cluster: %d of %d Ray containers not on the canonical token", stale, all)
	}

	total, totalStale := 0, 0
	var took []string
	for r := 1; r <= rounds; r++ {
		tokens = append(tokens, token(r))
		s, err := cp.Kube.CoreV1().Secrets(platform).Get(ctx, "ray-token", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data = map[string][]byte{"auth_token": []byte(tokens[r])}
		rotated := time.Now()
		if _, err := cp.Kube.CoreV1().Secrets(platform).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		pods := waitClusterPods(ctx, t, cp, ns, name, rotated)
		took = append(took, time.Since(rotated).Round(100*time.Millisecond).String())
		all, stale := check(r, pods, tokens[r])
		total += all
		totalStale += stale
	}
	t.Logf("MEASURE restart policy, %d restarts in a row, the cluster's Secret read by another pod on the node throughout: %d of %d Ray containers started with a token other than the one raysync wrote; source write → new head and worker Ready: %s",
		rounds, totalStale, total, strings.Join(took, ", "))

	// A new cluster born while another pod on the node already reads a Secret of its name: the
	// cluster is deleted (its Secret goes with it), the token rotates while no cluster exists, and
	// the cluster is created again at once under the same name (a GitOps delete and re-create).
	if err := cp.Dynamic.Resource(rayClusterGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + name})
		_, serr := cp.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(pods.Items) == 0 && apierrors.IsNotFound(serr), nil
	}); err != nil {
		t.Fatalf("the deleted cluster's pods or Secret never went: %v", err)
	}
	r := rounds + 1
	tokens = append(tokens, token(r))
	s, err := cp.Kube.CoreV1().Secrets(platform).Get(ctx, "ray-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data = map[string][]byte{"auth_token": []byte(tokens[r])}
	if _, err := cp.Kube.CoreV1().Secrets(platform).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	reborn := time.Now()
	rc.SetResourceVersion("")
	if _, err := cp.Dynamic.Resource(rayClusterGVR).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	all, stale := check(r, waitClusterPods(ctx, t, cp, ns, name, reborn), tokens[r])
	t.Logf("MEASURE a cluster re-created under its name right after a rotation, a pod on the node reading a Secret of that name throughout: %d of %d Ray containers on another token than the canonical one", stale, all)
	logWebhookLatency(ctx, t, cp)
	// The client pod never restarted: it still holds the token it started with (a secretKeyRef is
	// resolved once per container start), as the README says of clients reading the Secret.
	if p, err := cp.Kube.CoreV1().Pods(ns).Get(ctx, client.Name, metav1.GetOptions{}); err != nil || p.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the client pod restarted: %v", err)
	}
}

// waitClusterPods waits until the cluster runs a Ready head and a Ready worker, all created after
// since and none being deleted, and returns them.
func waitClusterPods(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, name string, since time.Time) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + name})
		if err != nil {
			return false, nil
		}
		pods = list.Items
		ready := map[string]bool{}
		for i := range pods {
			p := &pods[i]
			if p.DeletionTimestamp != nil || p.CreationTimestamp.Time.Before(since.Truncate(time.Second)) {
				return false, nil
			}
			if podReady(p) {
				ready[p.Labels["ray.io/node-type"]] = true
			}
		}
		return len(pods) == 2 && ready["head"] && ready["worker"], nil
	})
	if err != nil {
		var b strings.Builder
		for _, p := range pods {
			fmt.Fprintf(&b, "%s: %s deleting=%v created=%s %+v\n", p.Name, p.Status.Phase, p.DeletionTimestamp != nil, p.CreationTimestamp, p.Status.ContainerStatuses)
		}
		t.Fatalf("cluster %s/%s: no Ready head and worker created after %s: %v\n%s\nevents:\n%s", ns, name, since.Format(time.RFC3339), err, b.String(), events(ctx, cp.Kube, ns))
	}
	return pods
}

// installRaysync pushes raysync's image and chart (version) to the node's registry and installs it
// as users do — `helm install raysync oci://… --version …` into ns with the pull secret regcred and
// the canonical token ns/ray-token (which the caller creates) — plus sets, then waits until every
// replica is Ready and the API server gets answers from its webhook.
func installRaysync(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, version string, sets ...string) {
	t.Helper()
	image, err := cp.PushRaysyncImage(ctx, version, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.PushChart(ctx, version, t.Logf); err != nil {
		t.Fatal(err)
	}
	secret, err := cp.RegistryPullSecret(ns, "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	repo, _, _ := strings.Cut(image, ":"+version)
	args := []string{"install", "raysync", framework.RegistryChartRepo + "/raysync", "--version", version, "--namespace", ns,
		"--ca-file", cp.Dir + "/ca.crt", "--set", "authSource.namespace=" + ns + ",authSource.name=ray-token,image.repository=" + repo +
			",imagePullSecrets[0].name=regcred,pullSecrets[0]=" + ns + "/regcred"}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	t0 := time.Now()
	if out, err := cp.Helm(ctx, t.Logf, args...); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := cp.Kube.AppsV1().Deployments(ns).Get(ctx, "raysync", metav1.GetOptions{})
		return err == nil && d.Status.ReadyReplicas == *d.Spec.Replicas && d.Status.UpdatedReplicas == *d.Spec.Replicas, nil
	}); err != nil {
		t.Fatalf("raysync never Ready: %v\nevents:\n%s", err, events(ctx, cp.Kube, ns))
	}
	// Ready replicas reach the API server's webhook calls once the EndpointSlice and kube-proxy
	// follow; until then a Ray pod would be admitted unchanged (failurePolicy Ignore).
	d, err := cp.Kube.AppsV1().Deployments(ns).Get(ctx, "raysync", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := waitWebhookAnswers(ctx, cp, ns, int(*d.Spec.Replicas)); err != nil {
		t.Fatal(err)
	}
	t.Logf("raysync %s installed from the registry and Ready in %s", version, time.Since(t0).Round(time.Millisecond))
}

// logWebhookLatency prints the API server's own measure of raysync's pod webhook: calls and the mean
// time each added to a pod's creation (apiserver_admission_webhook_admission_duration_seconds).
func logWebhookLatency(ctx context.Context, t *testing.T, cp *framework.ControlPlane) {
	t.Helper()
	raw, err := cp.Kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		t.Errorf("the API server's metrics: %v", err)
		return
	}
	var sum, count float64
	for _, l := range strings.Split(string(raw), "\n") {
		if !strings.Contains(l, `name="pods.raysync.dev"`) || !strings.Contains(l, `operation="CREATE"`) {
			continue
		}
		f := strings.Fields(l)
		var v float64
		if _, err := fmt.Sscan(f[len(f)-1], &v); err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(l, "apiserver_admission_webhook_admission_duration_seconds_sum{"):
			sum += v
		case strings.HasPrefix(l, "apiserver_admission_webhook_admission_duration_seconds_count{"):
			count += v
		}
	}
	if count == 0 {
		t.Errorf("the API server measured no call of raysync's pod webhook")
		return
	}
	t.Logf("MEASURE raysync's pod webhook as the API server measured it: %.0f pod creations, %.1f ms each on average", count, 1000*sum/count)
}
