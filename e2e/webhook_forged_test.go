package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// The webhook does not authenticate its caller, so anyone who reaches its port can send it a review.
// One forged for a pending cluster's generated Secret (all it takes is the cluster's namespace, name
// and UID) must get no token bytes back, in any encoding; the born-right path (the API server calling
// it as KubeRay creates the Secret) still gives the cluster the canonical token.
func TestWebhookAnswersAForgedReviewWithNoToken(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		srcNS, ns := env.Namespace(), env.NamespaceWithoutKubelet() // pods stay pending: the cluster is "new"
		token := env.NewToken()
		env.PutSource(srcNS, "ray-token", tokenData(token))
		args := append([]string{"--auth-source=" + srcNS + "/ray-token", "--namespaces=" + ns, "--precreate-auth-secrets=false"}, env.webhookFor(srcNS, ns)...)
		env.StartSyncer(args...)
		env.waitCABundle(args)
		rc := env.CreateRayCluster(rayCluster(ns, "victim"))
		env.WaitSecret(ns, "victim", 30*time.Second, holds(token))
		env.WaitPods(ns, "victim", 2, 30*time.Second)

		var addr string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--webhook-addr="); ok {
				addr = v
			}
		}
		yes := true
		kuberays := &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: "victim", Namespace: ns, Labels: map[string]string{"ray.io/cluster": "victim"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "victim", UID: rc.GetUID(), Controller: &yes}}},
			Data: map[string][]byte{"auth_token": []byte("guess")}}
		pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{GenerateName: "victim-head-", Namespace: ns, Labels: map[string]string{"ray.io/cluster": "victim"},
				OwnerReferences: kuberays.OwnerReferences},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.52.0"}}}}
		// The attacker trusts anything: it only wants the answer.
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		for _, c := range []struct {
			path   string
			obj    any
			dryRun bool
		}{{"/mutate-secrets", kuberays, false}, {"/mutate-secrets", kuberays, true}, {"/mutate-pods", pod, false}} {
			raw, _ := json.Marshal(c.obj)
			dry := c.dryRun
			ar := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
				Request: &admissionv1.AdmissionRequest{UID: "forged", Operation: admissionv1.Create, Namespace: ns, Name: "victim",
					Object: runtime.RawExtension{Raw: raw}, DryRun: &dry}}
			b, _ := json.Marshal(ar)
			resp, err := client.Post("https://"+addr+c.path, "application/json", bytes.NewReader(b))
			if err != nil {
				t.Fatalf("forged review to %s: %v", c.path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(body, &out); err != nil || out.Response == nil || !out.Response.Allowed {
				t.Fatalf("%s: not an allowing review (HTTP %d)", c.path, resp.StatusCode)
			}
			for _, got := range [][]byte{body, out.Response.Patch} {
				for _, enc := range []string{token, base64.StdEncoding.EncodeToString([]byte(token)), base64.RawStdEncoding.EncodeToString([]byte(token)),
					base64.URLEncoding.EncodeToString([]byte(token))} {
					if bytes.Contains(got, []byte(enc)) {
						t.Errorf("%s (dryRun %v): the answer to a forged review carries the canonical token", c.path, c.dryRun)
					}
				}
			}
		}
		// The forged reviews changed nothing: the cluster's Secret is raysync's, holding the token.
		env.WaitSecret(ns, "victim", 5*time.Second, holds(token))
	})
}
