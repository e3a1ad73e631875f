package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
)

// bornPods records every pod of a namespace as it was created (a pod's imagePullSecrets, volumes and
// env never change after that).
type bornPods struct {
	mu   sync.Mutex
	pods map[types.UID]*corev1.Pod
}

func (e *Env) watchPodsBorn(ns string) *bornPods {
	e.t.Helper()
	w, err := e.Kube.CoreV1().Pods(ns).Watch(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(w.Stop)
	b := &bornPods{pods: map[types.UID]*corev1.Pod{}}
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				b.mu.Lock()
				b.pods[p.UID] = p
				b.mu.Unlock()
			}
		}
	}()
	return b
}

// missing lists, for every pod born in cluster, what of raysync's entries it lacked at creation.
func (b *bornPods) missing(cluster string) (pods int, missing []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.pods {
		if p.Labels["ray.io/cluster"] != cluster {
			continue
		}
		pods++
		if !listsPullSecret("regcred")(*p) {
			missing = append(missing, p.Name+": pull secret")
		}
		if p.Labels["ray.io/node-type"] == "head" && !hasAutoscalerTLS(p) {
			missing = append(missing, p.Name+": autoscaler TLS")
		}
	}
	return pods, missing
}

func managers(fs []metav1.ManagedFieldsEntry) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Manager+"/"+string(f.Operation))
	}
	return out
}

func hasAutoscalerTLS(p *corev1.Pod) bool {
	i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "autoscaler" })
	return i >= 0 && slices.ContainsFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "raysync-autoscaler-tls" }) &&
		slices.ContainsFunc(p.Spec.Containers[i].Env, func(e corev1.EnvVar) bool { return e.Name == "RAY_KUBERAY_CLIENT_CERT_PATH" })
}

func privateAutoscalingCluster(ns, name string) *unstructured.Unstructured {
	return rayCluster(ns, name, func(spec map[string]any) {
		spec["enableInTreeAutoscaling"] = true
		withPrivateImage(spec)
	})
}

// With the webhook, a new cluster is born right: its pods with the pull secret and the autoscaler's
// client certificate, its auth Secret with the canonical token (raysync's pre-creation switched off),
// so nothing is recycled and every container starts on the canonical token. The serving certificate
// renews while clusters are being created without one pod missing the webhook. With raysync down,
// pods are created at once without its entries (fail-open) and raysync repairs them when it is back.
func TestWebhookEveryPodBornRight(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		srcNS, ns := env.Namespace(), env.Namespace()
		token := env.NewToken()
		env.PutSource(srcNS, "ray-token", tokenData(token))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
		crt, key := env.ClientCert(time.Now().Add(-time.Hour), time.Now().Add(30*24*time.Hour))
		env.PutSecret(srcNS, "autoscaler-tls", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": crt, "tls.key": key})
		args := append([]string{"--auth-source=" + srcNS + "/ray-token", "--namespaces=" + ns, "--pull-secret=" + srcNS + "/regcred",
			"--autoscaler-tls-secret=" + srcNS + "/autoscaler-tls", "--precreate-auth-secrets=false", "--webhook-cert-validity=1m"},
			env.webhookFor(srcNS, ns)...)
		s := env.StartSyncer(args...)
		env.waitCABundle(args)
		born := env.watchPodsBorn(ns)

		// Clusters created over 50 s: the 1-minute certificate renews meanwhile (with 20 s left).
		var clusters []string
		for i := range 5 {
			name := fmt.Sprintf("born-%d", i)
			env.CreateRayCluster(privateAutoscalingCluster(ns, name))
			clusters = append(clusters, name)
			time.Sleep(10 * time.Second)
		}
		for _, c := range clusters {
			env.WaitPodsReady(ns, "ray.io/cluster="+c, 2, 90*time.Second)
			n, missing := born.missing(c)
			if n < 2 || len(missing) > 0 {
				t.Errorf("cluster %s: %d pods born, lacking at birth: %v", c, n, missing)
			}
			sec, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, c, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if string(sec.Data["auth_token"]) != token {
				t.Errorf("cluster %s: auth Secret does not hold the canonical token", c)
			}
			// Born with it: raysync's webhook created it (KubeRay's own create then failed with
			// AlreadyExists, and KubeRay adopted it), and nobody wrote it since.
			if len(sec.ManagedFields) != 1 || sec.ManagedFields[0].Manager != "raysync" {
				t.Errorf("cluster %s: auth Secret written by %v, want raysync's create only", c, managers(sec.ManagedFields))
			}
		}
		env.AssertStartedWith(ns, token, clusters...)
		for _, reason := range []string{"pull_secret", "autoscaler_tls"} {
			if v, _ := s.Metric("raysync_pods_recycled_total", map[string]string{"reason": reason}); v != 0 {
				t.Errorf("%v pods recycled for a missing %s", v, reason)
			}
		}
		// Every pod went through the webhook: mutated, or unchanged when raysync had patched the
		// template before KubeRay created the pods (then they were born right from it). Since KubeRay's
		// own create of the auth Secret fails (raysync's webhook created it), KubeRay creates the pods one
		// pass later, and by then the templates are mostly patched: no pod needs to have been mutated.
		mutated, _ := s.Metric("raysync_admission_requests_total", map[string]string{"resource": "pods", "result": "mutated"})
		unchanged, _ := s.Metric("raysync_admission_requests_total", map[string]string{"resource": "pods", "result": "unchanged"})
		if mutated+unchanged < 10 {
			t.Errorf("webhook answered %v pods mutated and %v unchanged, want all 10 pods", mutated, unchanged)
		}
		t.Logf("MEASURE webhook-pods kuberay=%s mutated=%v unchanged=%v", env.KubeRayVersion, mutated, unchanged)
		if v, _ := s.Metric("raysync_admission_requests_total", map[string]string{"resource": "secrets", "result": "created"}); v != 5 {
			t.Errorf("webhook created %v auth Secrets with the token, want 5", v)
		}
		if !strings.Contains(s.Output(), "renewed the webhook's serving certificate") {
			t.Error("the serving certificate was not renewed while clusters were created")
		}

		// raysync down: the API server admits pods at once, without raysync's entries.
		s.Kill()
		created := time.Now()
		env.CreateRayCluster(privateAutoscalingCluster(ns, "down"))
		env.WaitPods(ns, "down", 2, 20*time.Second)
		if d := time.Since(created); d > 10*time.Second {
			t.Errorf("pods took %s to be created with the webhook down", d)
		}
		if _, missing := born.missing("down"); len(missing) == 0 {
			t.Error("pods created while raysync was down carry its entries: the webhook was not bypassed")
		}
		// Back: the templates are patched and the pods recycled, as without a webhook.
		s2 := env.StartSyncer(args...)
		env.WaitAllPods(ns, "down", 2, 90*time.Second, "listing the pull secret", listsPullSecret("regcred"))
		env.WaitPodsReady(ns, "ray.io/cluster=down", 2, 90*time.Second)
		if v, _ := s2.Metric("raysync_pods_recycled_total", map[string]string{"reason": "pull_secret"}); v < 1 {
			t.Errorf("pods created while raysync was down were not recycled (%v)", v)
		}
	})
}

// An upgrade across the certificate Secret's ownership mark: the Secret an earlier raysync wrote (no
// raysync.dev/kind annotation) is adopted, /readyz passes and the webhook serves with the CA the API
// server already trusts; a Secret of that name raysync did not write stays refused.
func TestWebhookUpgradeAdoptsTheEarlierCertificate(t *testing.T) {
	if len(controlPlanes) == 0 {
		t.Skip("no control plane")
	}
	env := newEnv(t, controlPlanes[0])
	srcNS, ns := env.Namespace(), env.Namespace()
	token := env.NewToken()
	env.PutSource(srcNS, "ray-token", tokenData(token))
	args := append([]string{"--auth-source=" + srcNS + "/ray-token", "--namespaces=" + ns, "--precreate-auth-secrets=false"},
		env.webhookFor(srcNS, ns)...)
	env.StartSyncer(args...).Stop()
	// As the earlier release left it: the same Secret without the mark.
	sec, err := env.Kube.CoreV1().Secrets(srcNS).Get(env.ctx, "webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Annotations = nil
	if sec, err = env.Kube.CoreV1().Secrets(srcNS).Update(env.ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := env.StartSyncer(args...) // waits for /readyz: a refused certificate never gets there
	adopted, err := env.Kube.CoreV1().Secrets(srcNS).Get(env.ctx, "webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if adopted.Annotations["raysync.dev/kind"] != "webhook_certificate" || string(adopted.Data["ca.key"]) != string(sec.Data["ca.key"]) {
		t.Errorf("the earlier certificate Secret was not adopted as it was (annotations %v)", adopted.Annotations)
	}
	env.CreateRayCluster(rayCluster(ns, "after-upgrade"))
	env.WaitSecret(ns, "after-upgrade", 30*time.Second, holds(token))
	if v, _ := s.Metric("raysync_admission_requests_total", map[string]string{"resource": "secrets", "result": "created"}); v != 1 {
		t.Errorf("the webhook created %v auth Secrets with the token after the upgrade, want 1", v)
	}
	s.Stop()

	// Someone else's Secret of that name: never served, never changed.
	other := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "theirs-tls", Namespace: srcNS}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": []byte("theirs"), "tls.key": []byte("theirs")}}
	if _, err := env.Kube.CoreV1().Secrets(srcNS).Create(env.ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused := env.StartSyncerUnready(append(args[:len(args)-1], "--webhook-cert-secret="+srcNS+"/theirs-tls")...)
	time.Sleep(3 * time.Second)
	if refused.Ready() {
		t.Error("ready while serving no certificate")
	}
	if got, _ := env.Kube.CoreV1().Secrets(srcNS).Get(env.ctx, "theirs-tls", metav1.GetOptions{}); string(got.Data["tls.crt"]) != "theirs" || len(got.Annotations) != 0 {
		t.Error("changed a Secret raysync does not own")
	}
}

// webhookFor creates a URL-form webhook configuration for namespaces (the API server calls raysync
// on 127.0.0.1) and returns the syncer flags that serve it, with the certificate in srcNS.
func (e *Env) webhookFor(srcNS string, namespaces ...string) []string {
	e.t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		e.t.Fatal(err)
	}
	cfgName := "raysync-" + namespaces[0]
	api := e.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := api.Create(e.ctx, framework.WebhookConfiguration(cfgName, port, namespaces), metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = api.Delete(context.Background(), cfgName, metav1.DeleteOptions{}) })
	return []string{fmt.Sprintf("--webhook-addr=127.0.0.1:%d", port), "--webhook-ips=127.0.0.1", "--webhook-configuration=" + cfgName,
		"--webhook-cert-secret=" + srcNS + "/webhook-tls"}
}

// waitCABundle waits until raysync put its CA into the webhook configuration its flags name.
func (e *Env) waitCABundle(args []string) {
	e.t.Helper()
	var name string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--webhook-configuration="); ok {
			name = v
		}
	}
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := e.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, name, metav1.GetOptions{})
		return err == nil && len(c.Webhooks[0].ClientConfig.CABundle) > 0 && len(c.Webhooks[1].ClientConfig.CABundle) > 0, nil
	})
	if err != nil {
		e.t.Fatal("raysync never put its CA into the webhook configuration")
	}
}
