package realnode

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodePrivateImage: the Ray image in the node's private registry (htpasswd, TLS) does not
// pull without credentials — the registry answers containerd with 401, the kubelet's own event says
// "authorization failed" and the pod sits in ImagePullBackOff — and runs with a dockerconfigjson pull
// secret: Ray 2.60.0 imports inside the container, as the image's non-root user ray.
func TestRealNodePrivateImage(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	t0 := time.Now()
	image, err := cp.PushRayImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Ray image built or found in the cache and pushed to the registry as %s in %s", image, time.Since(t0).Round(time.Millisecond))
	ns := "realnode-registry"
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	pod := func(name string, secrets ...string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "ray", Image: image, ImagePullPolicy: corev1.PullAlways,
				Command: []string{"/bin/bash", "-c", `python -c 'import ray; print("ray", ray.__version__)' && echo "uid $(id -u) home $HOME" && exec sleep infinity`}}}}}
		for _, s := range secrets {
			p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
		}
		return p
	}

	if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, pod("no-secret"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var event, reason string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Kube.CoreV1().Pods(ns).Get(ctx, "no-secret", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return false, nil
		}
		reason = p.Status.ContainerStatuses[0].State.Waiting.Reason
		evs, err := cp.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=no-secret,reason=Failed"})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			// containerd 2 words the registry's 401 as "authorization failed: no basic auth credentials".
			if e.Source.Component == "kubelet" && strings.Contains(e.Message, "authorization failed") {
				event = e.Message
			}
		}
		return event != "" && reason == "ImagePullBackOff", nil
	})
	if err != nil {
		t.Fatalf("no ImagePullBackOff with the kubelet's 401 event (waiting reason %q, event %q): %v\nevents:\n%s", reason, event, err, events(ctx, cp.Kube, ns))
	}
	t.Logf("without a pull secret: %s; kubelet event: %s", reason, event)
	// The registry itself answered containerd's anonymous request with 401.
	regLog, err := os.ReadFile(cp.NodeLogPath("registry"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`"HEAD /v2/ray/ray/manifests/` + regexp.QuoteMeta(framework.RayVersion) + ` HTTP/1.1" 401 .*"containerd/v2`).Match(regLog) {
		t.Errorf("the registry's access log shows no 401 to containerd for %s", framework.RayImageRepoTag)
	}

	secret, err := cp.RegistryPullSecret(ns, "regcred")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Kube.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Cold: the node has never pulled the image (download and unpack); warm: it has the layers and
	// only resolves the manifest again (PullAlways, with the credentials).
	for _, name := range []string{"cold", "warm"} {
		t0 := time.Now()
		if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, pod(name, "regcred"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodRunning(ctx, t, cp.Kube, ns, name)
		t.Logf("MEASURE Ray image pod %q with regcred: Running %s after creation (pull included)", name, time.Since(t0).Round(time.Millisecond))
		var logs string
		_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			b, err := cp.Kube.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			logs = string(b)
			return err == nil && strings.Contains(logs, "home "), nil
		})
		if want := "ray " + framework.RayVersion + "\nuid 1000 home /home/ray\n"; logs != want {
			t.Errorf("pod %s logs: %q, want %q", name, logs, want)
		}
	}
}
