package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/projection"
)

const dockerConfig = `{"auths":{"registry.example.internal":{"auth":"cmF5OnMzY3JldC1yZWdpc3RyeS1wYXNz"}}}`

// PutSecret creates or replaces a Secret of the given type.
func (e *Env) PutSecret(ns, name string, typ corev1.SecretType, data map[string][]byte) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		cur, err := e.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = e.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Type: typ, Data: data}, metav1.CreateOptions{})
			return err == nil, nil
		}
		if err != nil {
			return false, nil
		}
		if cur.Type != typ { // type is immutable
			_ = e.Kube.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{})
			return false, nil
		}
		cur.Data = data
		_, err = e.Kube.CoreV1().Secrets(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		e.t.Fatalf("put Secret %s/%s: %v", ns, name, err)
	}
}

// ClientCert returns a PEM certificate and key valid between the given times (key registered as secret).
func (e *Env) ClientCert(notBefore, notAfter time.Time) (crt, key []byte) {
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "ray-autoscaler"},
		NotBefore: notBefore, NotAfter: notAfter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		e.t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
	e.Secret(strings.Split(string(keyPEM), "\n")[1]) // a line of the key body must never be printed
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}

func (e *Env) GetRayCluster(ns, name string) *unstructured.Unstructured {
	e.t.Helper()
	rc, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return rc
}

// WaitAllPods waits until the cluster has at least n pods and every one satisfies ok.
func (e *Env) WaitAllPods(ns, cluster string, n int, timeout time.Duration, what string, ok func(corev1.Pod) bool) []corev1.Pod {
	e.t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + cluster})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		if len(pods) < n {
			return false, nil
		}
		for _, p := range pods {
			if !ok(p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		e.t.Fatalf("cluster %s/%s: pods never all %s (%d pods)", ns, cluster, what, len(pods))
	}
	return pods
}

func listsPullSecret(name string) func(corev1.Pod) bool {
	return func(p corev1.Pod) bool {
		for _, r := range p.Spec.ImagePullSecrets {
			if r.Name == name {
				return true
			}
		}
		return false
	}
}

func TestPullSecretReachesEveryRayPod(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		srcNS, ns := env.Namespace(), env.Namespace()
		env.PutSource(srcNS, "ray-token", tokenData(env.NewToken()))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
		// The RayService exists before raysync: KubeRay's first pods lack the pull secret, so the
		// kubelet cannot pull their private image.
		svc := rayService(ns, "private", "v1")
		withPrivateImage(svc.Object["spec"].(map[string]any)["rayClusterConfig"].(map[string]any))
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		rc := env.WaitServiceClusters(ns, "private", 1, nil)[0]
		before := env.WaitPods(ns, rc.GetName(), 2, 30*time.Second)
		if env.ControlPlane.Ray != nil {
			for _, p := range before {
				env.WaitPod(ns, p.Name, 30*time.Second, "failing to pull its image", pullFailing)
			}
		}

		s := env.StartSyncer("--auth-source="+srcNS+"/ray-token", "--namespaces="+ns, "--pull-secret="+srcNS+"/regcred")
		copySecret := env.WaitSecret(ns, "regcred", 30*time.Second, func(s *corev1.Secret) bool {
			return string(s.Data[".dockerconfigjson"]) == dockerConfig && s.Type == corev1.SecretTypeDockerConfigJson
		})
		if copySecret.Labels["raysync.dev/managed-by"] != "raysync" || copySecret.Annotations["raysync.dev/source"] != srcNS+"/regcred" {
			t.Errorf("copy metadata: %v %v", copySecret.Labels, copySecret.Annotations)
		}
		// Templates list it; the pods KubeRay made before the patch were recycled and replaced.
		pods := env.WaitAllPods(ns, rc.GetName(), 2, 90*time.Second, "listing the pull secret", listsPullSecret("regcred"))
		old := map[string]bool{}
		for _, p := range before {
			old[string(p.UID)] = true
		}
		for _, p := range pods {
			if old[string(p.UID)] {
				t.Errorf("pod %s was not recycled", p.Name)
			}
		}
		cur := env.GetRayCluster(ns, rc.GetName())
		for _, path := range [][]string{{"spec", "headGroupSpec", "template", "spec", "imagePullSecrets"}} {
			if l, _, _ := unstructured.NestedSlice(cur.Object, path...); len(l) != 1 {
				t.Errorf("head template imagePullSecrets = %v", l)
			}
		}
		if v, _ := s.Metric("raysync_pods_recycled_total", map[string]string{"reason": "pull_secret"}); v < 2 {
			t.Errorf("raysync_pods_recycled_total{reason=pull_secret} = %v, want >= 2 (head and worker)", v)
		}
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": rc.GetName(), "kind": "pull_secret"}, 1, 10*time.Second)
		env.WaitEvent(ns, rc.GetName(), "PodRecycled", 10*time.Second)
		if env.ControlPlane.Ray != nil {
			// The replacements pull the image with the copy's credentials and run.
			env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+rc.GetName(), 2, 60*time.Second)
		}

		// The source changes (ESO refreshed it): the copy follows.
		newCfg := strings.Replace(dockerConfig, "cmF5", "bmV3", 1)
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(newCfg))})
		env.WaitSecret(ns, "regcred", 30*time.Second, func(s *corev1.Secret) bool { return string(s.Data[".dockerconfigjson"]) == newCfg })
	})
}

func TestAutoscalerGetsClientTLS(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		// Pods never start here: the test follows a head pod KubeRay made before the template was
		// patched until raysync recycles it, which only never-started pods are.
		srcNS, ns := env.Namespace(), env.NamespaceWithoutKubelet()
		env.PutSource(srcNS, "ray-token", tokenData(env.NewToken()))
		crt, key := env.ClientCert(time.Now().Add(-time.Hour), time.Now().Add(30*24*time.Hour))
		ca, _ := env.ClientCert(time.Now().Add(-time.Hour), time.Now().Add(365*24*time.Hour))
		env.PutSecret(srcNS, "autoscaler-tls", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca})
		s := env.StartSyncer("--auth-source="+srcNS+"/ray-token", "--namespaces="+ns, "--autoscaler-tls-secret="+srcNS+"/autoscaler-tls",
			"--autoscaler-api-server=https://k8s-proxy.example.internal:6443")
		env.CreateRayCluster(rayCluster(ns, "scaler", func(spec map[string]any) { spec["enableInTreeAutoscaling"] = true }))
		env.WaitSecret(ns, "autoscaler-tls", 30*time.Second, func(s *corev1.Secret) bool { return string(s.Data["tls.crt"]) == string(crt) })

		var head corev1.Pod
		err := wait.PollUntilContextTimeout(env.ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
			l, err := env.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=scaler,ray.io/node-type=head"})
			if err != nil {
				return false, nil
			}
			for _, p := range l.Items {
				for _, v := range p.Spec.Volumes {
					if p.DeletionTimestamp == nil && v.Name == "raysync-autoscaler-tls" && v.Secret != nil && v.Secret.SecretName == "autoscaler-tls" {
						head = p
						return true, nil
					}
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatal("no head pod with the autoscaler TLS volume")
		}
		wantEnv := map[string]string{
			"RAY_KUBERAY_CLIENT_CERT_PATH":  "/etc/raysync/autoscaler-tls/tls.crt",
			"RAY_KUBERAY_CLIENT_KEY_PATH":   "/etc/raysync/autoscaler-tls/tls.key",
			"RAY_KUBERAY_CA_CERT_PATH":      "/etc/raysync/autoscaler-tls/ca.crt",
			"KUBERNETES_SERVICE_HOST":       "k8s-proxy.example.internal",
			"KUBERNETES_SERVICE_PORT_HTTPS": "6443",
		}
		found := false
		for _, c := range head.Spec.Containers {
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			if c.Name != "autoscaler" {
				for k := range wantEnv {
					if _, ok := env[k]; ok {
						t.Errorf("Ray container %s got %s", c.Name, k)
					}
				}
				for _, m := range c.VolumeMounts {
					if m.Name == "raysync-autoscaler-tls" {
						t.Errorf("Ray container %s mounts the client certificate", c.Name)
					}
				}
				continue
			}
			found = true
			for k, v := range wantEnv {
				if env[k] != v {
					t.Errorf("autoscaler env %s = %q, want %q", k, env[k], v)
				}
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == "raysync-autoscaler-tls" && m.MountPath == "/etc/raysync/autoscaler-tls" && m.ReadOnly && m.SubPath == "" {
					mounted = true
				}
			}
			if !mounted {
				t.Errorf("autoscaler mounts = %+v", c.VolumeMounts)
			}
		}
		if !found {
			t.Fatal("head pod has no autoscaler container")
		}
		notAfter, _ := s.Metric("raysync_autoscaler_client_cert_expiry_timestamp_seconds", map[string]string{"source": srcNS + "/autoscaler-tls"})
		if d := time.Until(time.Unix(int64(notAfter), 0)); d < 29*24*time.Hour || d > 31*24*time.Hour {
			t.Errorf("cert expiry metric = %v", notAfter)
		}
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": "scaler", "kind": "autoscaler_tls"}, 1, 10*time.Second)

		// A simulated KubeRay wipe (operator upgrade, worker group appended): raysync puts its entries back.
		if err := retryOnConflict(env, func() error {
			wiped := env.GetRayCluster(ns, "scaler")
			wiped.Object["spec"] = rayCluster(ns, "scaler", func(spec map[string]any) { spec["enableInTreeAutoscaling"] = true }).Object["spec"]
			_, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Update(env.ctx, wiped, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		s.WaitMetric("raysync_template_reapplied_total", nil, 1, 30*time.Second)
		err = wait.PollUntilContextTimeout(env.ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			vols, _, _ := unstructured.NestedSlice(env.GetRayCluster(ns, "scaler").Object, "spec", "headGroupSpec", "template", "spec", "volumes")
			return len(vols) == 1, nil
		})
		if err != nil {
			t.Fatal("entries not re-applied after the wipe")
		}
	})
}

func TestInvalidPodSourcesWriteNothing(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		srcNS, ns := env.Namespace(), env.Namespace()
		env.PutSource(srcNS, "ray-token", tokenData(env.NewToken()))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(`{}`)})
		crt, key := env.ClientCert(time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
		otherCrt, _ := env.ClientCert(time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
		env.PutSecret(srcNS, "client-tls", corev1.SecretTypeOpaque, map[string][]byte{"tls.crt": otherCrt, "tls.key": key})
		// The window: from raysync's start to the fix, no copy is written and no template patched (every
		// Secret change in ns replayed from here; the cluster's generation, 1 at its creation, which every
		// spec change moves).
		windowRV := env.secretListRV(ns)
		s := env.StartSyncer("--auth-source="+srcNS+"/ray-token", "--namespaces="+ns,
			"--pull-secret="+srcNS+"/regcred", "--autoscaler-tls-secret="+srcNS+"/client-tls")
		env.CreateRayCluster(rayCluster(ns, "guarded", func(spec map[string]any) { spec["enableInTreeAutoscaling"] = true }))
		const generation = 1
		env.WaitPods(ns, "guarded", 2, 30*time.Second)

		expiredCrt, expiredKey := env.ClientCert(time.Now().Add(-48*time.Hour), time.Now().Add(-time.Hour))
		pullCases := []struct {
			name string
			typ  corev1.SecretType
			data map[string][]byte
			hint string
		}{
			{"no auths", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(`{}`)}, `no "auths"`},
			{"wrong type", corev1.SecretTypeOpaque, map[string][]byte{".dockerconfigjson": []byte(dockerConfig)}, "Secret type"},
			{"bad JSON in an Opaque Secret", corev1.SecretTypeOpaque, map[string][]byte{".dockerconfigjson": []byte(`{"auths":`)}, "Secret type"},
		}
		// Bad JSON in a typed Secret never reaches raysync: the API server refuses it.
		if _, err := env.Kube.CoreV1().Secrets(srcNS).Create(env.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bad-json"},
			Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":`)}}, metav1.CreateOptions{}); err == nil {
			t.Error("the API server accepted a dockerconfigjson Secret with invalid JSON; raysync's table tests cover it, add an e2e case")
		}
		for _, c := range pullCases {
			env.PutSecret(srcNS, "regcred", c.typ, c.data)
			s.WaitMetric("raysync_source_valid", map[string]string{"source": srcNS + "/regcred"}, 0, 10*time.Second)
			env.WaitEventMessage(srcNS, "regcred", "SourceInvalid", 10*time.Second, c.hint)
		}
		tlsCases := []struct {
			name string
			data map[string][]byte
			hint string
		}{
			{"mismatched pair", map[string][]byte{"tls.crt": otherCrt, "tls.key": key}, "not a matching"},
			{"expired", map[string][]byte{"tls.crt": expiredCrt, "tls.key": expiredKey}, "expired"},
			{"garbage PEM", map[string][]byte{"tls.crt": []byte("garbage"), "tls.key": key}, "not a matching"},
			{"lone cert", map[string][]byte{"tls.crt": crt}, "without its key"},
			{"CA does not parse", map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": []byte("nope")}, "ca.crt"},
		}
		for _, c := range tlsCases {
			env.PutSecret(srcNS, "client-tls", corev1.SecretTypeOpaque, c.data)
			s.WaitMetric("raysync_source_valid", map[string]string{"source": srcNS + "/client-tls"}, 0, 10*time.Second)
			env.WaitEventMessage(srcNS, "client-tls", "SourceInvalid", 10*time.Second, c.hint)
		}
		s.WaitMetric("raysync_targets", map[string]string{"kind": "pull_secret", "state": "source_invalid"}, 1, 10*time.Second)
		// Nothing was written for them over the whole window: no copy, no template patch.
		if changes := env.secretChangesSince(ns, windowRV, "regcred", "client-tls"); len(changes) > 0 {
			t.Errorf("copies written from invalid sources: %v", changes)
		}
		rc := env.GetRayCluster(ns, "guarded")
		if rc.GetGeneration() != generation {
			t.Errorf("the RayCluster's spec changed (generation %d → %d) while every pod source was invalid", generation, rc.GetGeneration())
		}
		if l, _, _ := unstructured.NestedSlice(rc.Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets"); len(l) > 0 {
			t.Errorf("template patched from an invalid source")
		}

		// Fixed: everything converges without a restart.
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(dockerConfig)})
		env.PutSecret(srcNS, "client-tls", corev1.SecretTypeOpaque, map[string][]byte{"tls.crt": crt, "tls.key": key})
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": "guarded", "kind": "pull_secret"}, 1, 30*time.Second)
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": "guarded", "kind": "autoscaler_tls"}, 1, 30*time.Second)
	})
}

func TestHTTPAutoscalerAPIServerRefused(t *testing.T) {
	path, err := buildSyncer()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(path, "--auth-source=a/b", "--all-namespaces", "--leader-elect=false",
		"--autoscaler-tls-secret=a/tls", "--autoscaler-api-server=http://proxy:8080").CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), "https") {
		t.Fatalf("want exit 2 with one line about https, got %v: %q", err, out)
	}
}

func TestRecreateClustersAreDeferred(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if !env.SupportsUpgradeStrategy() {
			t.Skip("spec.upgradeStrategy needs KubeRay v1.6+")
		}
		srcNS, ns := env.Namespace(), env.Namespace()
		env.PutSource(srcNS, "ray-token", tokenData(env.NewToken()))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(dockerConfig)})
		recreate := func(spec map[string]any) { spec["upgradeStrategy"] = map[string]any{"type": "Recreate"} }
		env.CreateRayCluster(rayCluster(ns, "running", recreate))
		pods := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=running", 2, 60*time.Second)
		s := env.StartSyncer("--auth-source="+srcNS+"/ray-token", "--namespaces="+ns, "--pull-secret="+srcNS+"/regcred")
		env.WaitEvent(ns, "running", "TemplatePatchDeferred", 30*time.Second)
		s.WaitMetric("raysync_template_deferred", map[string]string{"namespace": ns, "raycluster": "running"}, 1, 10*time.Second)
		if l, _, _ := unstructured.NestedSlice(env.GetRayCluster(ns, "running").Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets"); len(l) > 0 {
			t.Error("Recreate cluster with running pods was patched")
		}
		// Running pods lacking the pull secret are never deleted; they are reported.
		s.WaitMetric("raysync_stale_pods", map[string]string{"namespace": ns, "raycluster": "running", "reason": "pull_secret"}, 2, 10*time.Second)
		env.WaitEvent(ns, "running", "StalePodConfig", 10*time.Second)
		for _, p := range pods {
			if _, err := env.Kube.CoreV1().Pods(ns).Get(env.ctx, p.Name, metav1.GetOptions{}); err != nil {
				t.Errorf("running pod %s: %v", p.Name, err)
			}
		}
		// A Recreate cluster with no running pods yet (its private image does not pull without the
		// pull secret) is patched at once; KubeRay recreates its pods, which then pull and run.
		env.CreateRayCluster(rayCluster(ns, "fresh", recreate, withPrivateImage))
		env.WaitAllPods(ns, "fresh", 2, 60*time.Second, "listing the pull secret", listsPullSecret("regcred"))
		if env.ControlPlane.Ray != nil { // a real cluster cannot reach registry.example.internal
			env.WaitPodsReady(ns, kuberay.ClusterLabel+"=fresh", 2, 60*time.Second)
		}
	})
}

func TestPodCopiesPrunedAndForeignNeverTouched(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		srcNS, ns, foreignNS := env.Namespace(), env.Namespace(), env.Namespace()
		env.PutSource(srcNS, "ray-token", tokenData(env.NewToken()))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(dockerConfig)})
		foreign, err := env.Kube.CoreV1().Secrets(foreignNS).Create(env.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: foreignNS},
			Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{}}`)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := env.StartSyncer("--auth-source="+srcNS+"/ray-token", "--namespaces="+ns+","+foreignNS, "--pull-secret="+srcNS+"/regcred")
		env.CreateRayCluster(rayCluster(ns, "a"))
		env.CreateRayCluster(rayCluster(ns, "b"))
		env.CreateRayCluster(rayCluster(foreignNS, "c"))
		env.WaitSecret(ns, "regcred", 30*time.Second, nil)
		env.WaitEvent(foreignNS, "c", "TargetNotOwned", 30*time.Second)
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": foreignNS, "raycluster": "c", "kind": "pull_secret"}, 0, 10*time.Second)
		s.WaitMetric("raysync_targets", map[string]string{"kind": "pull_secret", "state": "not_owned"}, 1, 10*time.Second)

		env.DeleteRayCluster(ns, "a")
		time.Sleep(2 * time.Second)
		env.WaitSecret(ns, "regcred", time.Second, nil) // b still uses it
		env.DeleteRayCluster(ns, "b")
		env.WaitSecretGone(ns, "regcred", 30*time.Second)

		env.DeleteRayCluster(foreignNS, "c")
		// Its last cluster gone, the Secret raysync never owned stays as it was (looked at for 10 s: a
		// prune runs within milliseconds of the deletion; a write at any time changes its resourceVersion).
		env.Consistently(10*time.Second, func() error {
			cur, err := env.Kube.CoreV1().Secrets(foreignNS).Get(env.ctx, "regcred", metav1.GetOptions{})
			if err != nil || cur.ResourceVersion != foreign.ResourceVersion {
				return fmt.Errorf("foreign Secret touched (err %v)", err)
			}
			return nil
		})
	})
}

func TestRunningPodsAreNeverRecycled(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		srcNS, ns := env.Namespace(), env.Namespace()
		env.PutSource(srcNS, "ray-token", tokenData(env.NewToken()))
		env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(dockerConfig)})
		env.CreateRayCluster(rayCluster(ns, "busy"))
		pods := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=busy", 2, 60*time.Second)
		s := env.StartSyncer("--auth-source="+srcNS+"/ray-token", "--namespaces="+ns, "--pull-secret="+srcNS+"/regcred")
		// The template is fixed for future pods...
		err := wait.PollUntilContextTimeout(env.ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			l, _, _ := unstructured.NestedSlice(env.GetRayCluster(ns, "busy").Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")
			return len(l) == 1, nil
		})
		if err != nil {
			t.Fatal("template not patched")
		}
		// ...but the running pods stay, reported as stale.
		s.WaitMetric("raysync_stale_pods", map[string]string{"namespace": ns, "raycluster": "busy", "reason": "pull_secret"}, 2, 30*time.Second)
		env.WaitEvent(ns, "busy", "StalePodConfig", 10*time.Second)
		// Looked at until both pods are past the age raysync recycles at (and a requeue after), not once.
		var youngest time.Time
		for _, p := range pods {
			if p.CreationTimestamp.After(youngest) {
				youngest = p.CreationTimestamp.Time
			}
		}
		env.Consistently(time.Until(youngest.Add(projection.RecycleGrace+10*time.Second)), func() error {
			for _, p := range pods {
				cur, err := env.Kube.CoreV1().Pods(ns).Get(env.ctx, p.Name, metav1.GetOptions{})
				if err != nil || cur.UID != p.UID || cur.DeletionTimestamp != nil {
					return fmt.Errorf("running pod %s was deleted", p.Name)
				}
			}
			return nil
		})
		if v, _ := s.Metric("raysync_pods_recycled_total", map[string]string{"reason": "pull_secret"}); v != 0 {
			t.Errorf("raysync_pods_recycled_total = %v", v)
		}
	})
}
