package standin

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
)

// The stand-in reads a namespace's Secrets as the real kubelet's Watch-based manager does when the
// namespace asks (AnnotationSecretCache): a first reference reads the Secret as it is; afterwards a
// container gets what the reflector holds, so with a slow watch a write that just returned is not
// seen yet, and is once the event arrives. Other namespaces read live.
func TestSecretCacheLagsAsTheKubeletsWatch(t *testing.T) {
	ns := func(name, cache string) *corev1.Namespace {
		n := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if cache != "" {
			n.Annotations = map[string]string{AnnotationSecretCache: cache}
		}
		return n
	}
	secret := func(ns, v string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: ns}, Data: map[string][]byte{"v": []byte(v)}}
	}
	kube := fake.NewClientset(ns("slow", "400ms"), ns("fast", "watch"), ns("live", ""), secret("slow", "old"), secret("fast", "old"), secret("live", "old"),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "slow"}})
	factory := informers.NewSharedInformerFactory(kube, 0)
	nsl := factory.Core().V1().Namespaces().Lister()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop) })
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	w := newWatchedSecrets(kube, nsl, stop)
	ctx := context.Background()
	read := func(ns string) string {
		t.Helper()
		s, err := w.Secret(ctx, ns, "s")
		if apierrors.IsNotFound(err) {
			return "<none>"
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data["v"])
	}
	for _, n := range []string{"slow", "fast", "live"} {
		if got := read(n); got != "old" {
			t.Fatalf("%s: the first reference read %q, want the Secret as it is", n, got)
		}
	}
	for _, n := range []string{"slow", "fast", "live"} {
		if _, err := kube.CoreV1().Secrets(n).Update(ctx, secret(n, "new"), metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := read("live"); got != "new" {
		t.Errorf("live: %q after the write returned, want new", got)
	}
	if got := read("slow"); got != "old" {
		t.Errorf("slow watch: %q right after the write, want the previous value (the event is 400 ms late)", got)
	}
	eventually := func(ns, want string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for read(ns) != want && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if got := read(ns); got != want {
			t.Errorf("%s: %q, want %q once the watch event arrived", ns, got, want)
		}
	}
	eventually("slow", "new")
	eventually("fast", "new")
	// Another Secret of the namespace going does not touch this one's reflector.
	if err := kube.CoreV1().Secrets("slow").Delete(ctx, "other", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kube.CoreV1().Secrets("slow").Delete(ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually("slow", "<none>")
}
