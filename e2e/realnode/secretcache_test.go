package realnode

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeSecretCacheStaleness measures what raysync's restart rule rests on: after a Secret's
// write returns, does a container the real kubelet starts next read the new value? The kubelet
// resolves secretKeyRef through its Watch-based secret manager; with a reflector for that Secret
// already running on the node (other pods reference it) it reads its store without a freshness
// check, so a container can start with the previous value (kubernetes#129645). Each round writes
// the Secret and at once creates a pod reading it, as a restart writes the token and then lets
// KubeRay create the pods; a second series does the same for a Secret no pod on the node has read
// yet (a first reference lists it afresh). The counts are printed (MEASURE); the test fails only if
// a container read no value at all or one never written.
func TestRealNodeSecretCacheStaleness(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	const ns, rounds = "realnode-secrets", 8
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	podReading := func(name, secret string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "c", Image: framework.TinyImage, ImagePullPolicy: corev1.PullNever, Args: []string{"env", "VALUE"},
				Env: []corev1.EnvVar{{Name: "VALUE", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: "v"}}}},
			}}}}
	}
	readValue := func(name string) string {
		t.Helper()
		waitPodRunning(ctx, t, cp.Kube, ns, name)
		var logs string
		_ = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			b, err := cp.Kube.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			logs = string(b)
			return err == nil && strings.Contains(logs, "VALUE="), nil
		})
		_, v, ok := strings.Cut(strings.TrimSpace(logs), "VALUE=")
		if !ok {
			t.Fatalf("pod %s printed no VALUE: %q", name, logs)
		}
		return strings.TrimSpace(strings.SplitN(v, "\n", 2)[0])
	}

	// Watched: two long-running readers keep the kubelet's reflector for "shared" running.
	shared := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shared"}, StringData: map[string]string{"v": "gen-0"}}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, shared, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		name := fmt.Sprintf("reader-%d", i)
		if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, podReading(name, "shared"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if v := readValue(name); v != "gen-0" {
			t.Fatalf("reader %s read %q, want gen-0", name, v)
		}
	}
	stale := 0
	for r := 1; r <= rounds; r++ {
		want := fmt.Sprintf("gen-%d", r)
		s, err := cp.Kube.CoreV1().Secrets(ns).Get(ctx, "shared", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data = map[string][]byte{"v": []byte(want)}
		if _, err := cp.Kube.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("after-write-%d", r)
		if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, podReading(name, "shared"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		switch got := readValue(name); {
		case got == want:
		case strings.HasPrefix(got, "gen-"):
			stale++
			t.Logf("round %d: the container started with %s, written before %s", r, got, want)
		default:
			t.Fatalf("round %d: the container read %q, never written", r, got)
		}
	}
	t.Logf("MEASURE kubelet secret cache, a Secret other pods on the node read: %d of %d containers created right after a write started with the previous value", stale, rounds)

	// First reference: a Secret no pod on the node has read, written and read at once.
	staleFirst := 0
	for r := 1; r <= rounds; r++ {
		name, want := fmt.Sprintf("fresh-%d", r), fmt.Sprintf("fresh-gen-%d", r)
		if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			StringData: map[string]string{"v": "fresh-gen-0"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		s, err := cp.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data = map[string][]byte{"v": []byte(want)}
		if _, err := cp.Kube.CoreV1().Secrets(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, podReading(name, name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		switch got := readValue(name); got {
		case want:
		case "fresh-gen-0":
			staleFirst++
			t.Logf("first reference %d: the container started with the value before the write", r)
		default:
			t.Fatalf("first reference %d: the container read %q, never written", r, got)
		}
	}
	t.Logf("MEASURE kubelet secret cache, a Secret first read on the node: %d of %d containers started with the previous value", staleFirst, rounds)
}
