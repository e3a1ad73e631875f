package realnode

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/raysync/raysync/e2e/framework"
)

// startNode starts a control plane with the real node and KubeRay v1.6.1 and returns it; the test's
// cleanup stops it.
func startNode(t *testing.T) *framework.ControlPlane {
	t.Helper()
	return startNodeWith(t, "v1.6.1")
}

// startNodeWith is startNode with the given KubeRay operator version.
func startNodeWith(t *testing.T, kuberay string) *framework.ControlPlane {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: skipped in -short mode")
	}
	if os.Geteuid() != 0 {
		t.Fatal("the real node needs root (network, mount and PID namespaces, cgroups)")
	}
	t0 := time.Now()
	cp, err := framework.Start(context.Background(), framework.Options{RealNode: true, KubeRayVersion: kuberay, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane and real node up in %s", time.Since(t0).Round(time.Millisecond))
	t.Cleanup(func() { _ = cp.Stop() })
	return cp
}

// TestRealNodeRunsAPod: the node registers with kubelet v1.37.2 and containerd 2, a pod is scheduled
// onto it and runs with an environment variable the kubelet resolved from a Secret, read back through
// the API server from the kubelet (logs); stopping the node leaves nothing on the host.
func TestRealNodeRunsAPod(t *testing.T) {
	sysctls, err := framework.KubeletSysctls()
	if err != nil {
		t.Fatal(err)
	}
	if left := framework.RealNodeLeftovers(); len(left) > 0 {
		t.Fatalf("a real node's remains before the test: %v", left)
	}
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	node, err := cp.Kube.CoreV1().Nodes().Get(ctx, framework.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info := node.Status.NodeInfo
	t.Logf("node %s: kubelet %s, %s, kernel %s", node.Name, info.KubeletVersion, info.ContainerRuntimeVersion, info.KernelVersion)
	if info.KubeletVersion != framework.KubernetesVersion || !strings.HasPrefix(info.ContainerRuntimeVersion, "containerd://2.") {
		t.Errorf("nodeInfo: kubelet %q, runtime %q; want %s and containerd 2.x", info.KubeletVersion, info.ContainerRuntimeVersion, framework.KubernetesVersion)
	}

	ns := "realnode-pod"
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "greeting"},
		StringData: map[string]string{"value": "hello from a Secret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "env", Namespace: ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "env", Image: framework.TinyImage, ImagePullPolicy: corev1.PullNever, Args: []string{"env", "GREETING"},
			Env: []corev1.EnvVar{{Name: "GREETING", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "greeting"}, Key: "value"}}}},
		}}},
	}
	t0 := time.Now()
	if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := waitPodRunning(ctx, t, cp.Kube, ns, pod.Name)
	t.Logf("pod Running %s after creation on %s, IP %s", time.Since(t0).Round(time.Millisecond), running.Spec.NodeName, running.Status.PodIP)
	if running.Spec.NodeName != framework.NodeName {
		t.Errorf("pod on node %q, want %s", running.Spec.NodeName, framework.NodeName)
	}
	// The kubelet leaves the weight of its cgroup root alone (it sets kubepods' below it).
	if w, err := framework.NodeCPUWeight(); err != nil || w != framework.NodeCPUShares {
		t.Errorf("the node's cgroup cpu.shares: %d, %v; want %d", w, err, framework.NodeCPUShares)
	}
	var logs string
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		b, err := cp.Kube.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		logs = string(b)
		if err != nil {
			logs = err.Error()
		}
		return err == nil && strings.Contains(logs, "GREETING="), nil
	})
	if want := "GREETING=hello from a Secret"; !strings.Contains(logs, want) {
		t.Errorf("pod logs (through the API server from the kubelet): %q, want %q", logs, want)
	}

	t.Run("TeardownLeavesNothing", func(t *testing.T) {
		if err := cp.Stop(); err != nil {
			t.Fatal(err)
		}
		if left := framework.RealNodeLeftovers(); len(left) > 0 {
			t.Errorf("left on the host after teardown:\n%s", strings.Join(left, "\n"))
		}
		after, err := framework.KubeletSysctls()
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(after) != fmt.Sprint(sysctls) {
			t.Errorf("sysctls after teardown %v, before %v", after, sysctls)
		}
	})
}

func waitServiceAccount(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("no default ServiceAccount in %s: %v", ns, err)
	}
}

// waitPodRunning waits until the pod runs; on timeout it fails with the pod's status and events.
func waitPodRunning(ctx context.Context, t *testing.T, kube kubernetes.Interface, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not Running: %v\nstatus: %+v\nevents:\n%s", ns, name, err, podStatus(pod), events(ctx, kube, ns))
	}
	return pod
}

func podStatus(p *corev1.Pod) any {
	if p == nil {
		return nil
	}
	return p.Status
}

func events(ctx context.Context, kube kubernetes.Interface, ns string) string {
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range evs.Items {
		fmt.Fprintf(&b, "%s %s %s/%s: %s\n", e.Type, e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
	}
	return b.String()
}

// createNamespaces creates each namespace and waits for its default ServiceAccount (pods need it).
func createNamespaces(ctx context.Context, t *testing.T, cp *framework.ControlPlane, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitServiceAccount(ctx, t, cp.Kube, n)
	}
}
