package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
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

// Anyone who reaches the webhook's port can send it reviews, and the webhook shares its process with the
// controller. 100 hostile reviews at once (the black-box finding's 7.5 MiB of nested empty objects,
// 3.4 MiB ones that pass every check on their metadata, deep nesting, and clients that trickle their
// body) must leave raysync's peak RSS under the chart's 256 MiB memory limit and the controller
// working: a cluster created right after still gets the canonical token. The operator's code decides
// nothing here: one KubeRay version.
func TestWebhookHostileReviewsLeaveRaysyncUnderItsMemoryLimit(t *testing.T) {
	cp := newestKubeRay()
	if cp == nil || cp.External {
		t.Skip("needs the local control plane")
	}
	t.Parallel()
	env := newEnv(t, cp)
	srcNS, ns := env.Namespace(), env.NamespaceWithoutKubelet()
	token := env.NewToken()
	env.PutSource(srcNS, "ray-token", tokenData(token))
	args := append([]string{"--auth-source=" + srcNS + "/ray-token", "--namespaces=" + ns, "--precreate-auth-secrets=false"}, env.webhookFor(srcNS, ns)...)
	s := env.StartSyncer(args...)
	env.waitCABundle(args)
	rc := env.CreateRayCluster(rayCluster(ns, "victim"))
	env.WaitSecret(ns, "victim", 30*time.Second, holds(token))
	var addr string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--webhook-addr="); ok {
			addr = v
		}
	}
	meta := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"victim-head-","namespace":%q,"labels":{"ray.io/cluster":"victim"},`+
		`"ownerReferences":[{"apiVersion":"ray.io/v1","kind":"RayCluster","name":"victim","uid":%q,"controller":true}]},"spec":{"containers":[{"name":"ray-head","image":"r"}],"x":`, ns, rc.GetUID())
	review := func(size int, open, sep, close string) []byte {
		var b bytes.Buffer
		fmt.Fprintf(&b, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","namespace":%q,"object":%s`, ns, meta)
		b.WriteString(open)
		for b.Len() < size {
			b.WriteString(sep)
		}
		b.WriteString(close + "}}}}")
		return b.Bytes()
	}
	depth := 1_700_000
	bodies := [][]byte{
		review(7_500_000, "[{}", ",{}", "]"), // the black-box finding
		review(3_400_000, "[{}", ",{}", "]"), // passes every check on its metadata
		review(3_400_000, "{", `"k":{},`, `"z":0}`),
		[]byte(`{"request":{"uid":"u","operation":"CREATE","object":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + "}}"),
	}
	rss := func(field string) int64 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				kb, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
				return kb << 10
			}
		}
		t.Fatalf("no %s in /proc/<pid>/status", field)
		return 0
	}
	before := rss("VmRSS")
	client := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 100}}
	var wg sync.WaitGroup
	codes := make([]int, 100)
	start := time.Now()
	for i := range 100 {
		wg.Go(func() {
			body := io.Reader(bytes.NewReader(bodies[i%len(bodies)]))
			n := int64(len(bodies[i%len(bodies)]))
			if i%10 == 9 {
				body, n = &trickle{b: bodies[1], every: 100 * time.Millisecond}, int64(len(bodies[1])) // a slow client
			}
			req, _ := http.NewRequest(http.MethodPost, "https://"+addr+"/mutate-pods", body)
			req.ContentLength = n
			resp, err := client.Do(req)
			if err != nil {
				return // cut off: a slow client past its body's deadline
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	peak := rss("VmHWM")
	counts := map[int]int{}
	for _, c := range codes {
		counts[c]++
	}
	t.Logf("100 hostile reviews in %s: answers %v (0: cut off); RSS %d MiB before, peak %d MiB", time.Since(start).Round(time.Millisecond), counts, before>>20, peak>>20)
	if counts[http.StatusOK] > 0 {
		t.Errorf("%d hostile reviews were decided (HTTP 200): each must be refused on its length or shape", counts[http.StatusOK])
	}
	if limit := int64(256 << 20); peak >= limit {
		t.Errorf("raysync's peak RSS was %d MiB: at or over the chart's memory limit of %d MiB", peak>>20, limit>>20)
	}
	select {
	case <-s.done:
		t.Fatalf("raysync exited under the hostile reviews: %s", lastLines(s.Output(), 20))
	default:
	}
	env.CreateRayCluster(rayCluster(ns, "after"))
	env.WaitSecret(ns, "after", 30*time.Second, holds(token))
	env.WaitSecret(ns, "victim", 5*time.Second, holds(token))
}

// trickle sends b a few bytes at a time: a client that holds its connection open without finishing.
type trickle struct {
	b     []byte
	every time.Duration
}

func (r *trickle) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	time.Sleep(r.every)
	n := copy(p[:min(len(p), 64)], r.b)
	r.b = r.b[n:]
	return n, nil
}
