package admission

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

type stub struct {
	ops    []podtemplate.PatchOp
	dryRun *bool // what the last Secret review said
}

func (s stub) Pod(context.Context, string, []byte) ([]podtemplate.PatchOp, string, string) {
	if len(s.ops) == 0 {
		return nil, names.AdmitUnchanged, ""
	}
	return s.ops, names.AdmitMutated, ""
}
func (s stub) Secret(_ context.Context, _ string, _ []byte, dryRun bool) (string, string) {
	*s.dryRun = dryRun
	return names.AdmitSkipped, "x"
}

func TestHandlerAlwaysAllows(t *testing.T) {
	ops := []podtemplate.PatchOp{{Op: "add", Path: "/spec/imagePullSecrets", Value: []any{map[string]any{"name": "regcred"}}}}
	m := metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} })
	var dryRun bool
	h := Handler(stub{ops: ops, dryRun: &dryRun}, m, zap.NewNop())
	yes := true
	review := func(path string, op admissionv1.Operation) (*http.Response, admissionv1.AdmissionReview) {
		ar := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "u1", Operation: op, Namespace: "ray", Object: runtime.RawExtension{Raw: []byte(`{}`)}, DryRun: &yes}}
		b, _ := json.Marshal(ar)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(b)))
		var out admissionv1.AdmissionReview
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		return rec.Result(), out
	}
	_, out := review(PodsPath, admissionv1.Create)
	if r := out.Response; r == nil || !r.Allowed || r.UID != "u1" || r.PatchType == nil || *r.PatchType != admissionv1.PatchTypeJSONPatch ||
		string(r.Patch) != `[{"op":"add","path":"/spec/imagePullSecrets","value":[{"name":"regcred"}]}]` {
		t.Errorf("pod CREATE: %+v", out.Response)
	}
	if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" {
		t.Errorf("response type %v", out.TypeMeta)
	}
	if _, out = review(PodsPath, admissionv1.Update); !out.Response.Allowed || out.Response.Patch != nil {
		t.Errorf("pod UPDATE patched: %+v", out.Response)
	}
	if _, out = review(SecretsPath, admissionv1.Create); !out.Response.Allowed || out.Response.Patch != nil || !dryRun {
		t.Errorf("skipped Secret patched (or the review's dryRun not passed on: %v): %+v", dryRun, out.Response)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, PodsPath, bytes.NewReader([]byte("not a review"))))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("unreadable review: HTTP %d", rec.Code)
	}
	for result, want := range map[string]float64{"mutated": 1, "unchanged": 1, "invalid": 1} {
		if got := testutil.ToFloat64(m.Admission.WithLabelValues("pods", result)); got != want {
			t.Errorf("pods %s: %v, want %v", result, got, want)
		}
	}
	if got := testutil.ToFloat64(m.Admission.WithLabelValues("secrets", "skipped")); got != 1 {
		t.Errorf("secrets skipped: %v", got)
	}
}

// The certificate raysync issues: served, trusted through the caBundle it injects, renewed a third of
// its life ahead under the same CA (so the caBundle stays and no handshake fails meanwhile), and a new
// CA only when the old one runs out, trusted alongside it.
func TestCertManager(t *testing.T) {
	fail := admissionregistrationv1.Ignore
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "raysync"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "pods.raysync.dev", FailurePolicy: &fail}, {Name: "secrets.raysync.dev", FailurePolicy: &fail}}}
	kube := fake.NewClientset(cfg)
	now := time.Now()
	m := &CertManager{Kube: kube, Secret: types.NamespacedName{Namespace: "raysync", Name: "raysync-webhook-tls"}, Configuration: "raysync",
		DNSNames: []string{"raysync-webhook.raysync.svc"}, IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour,
		Metrics: metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} }), Log: zap.NewNop(), Now: func() time.Time { return now }}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.TLS = &tls.Config{GetCertificate: m.GetCertificate}
	srv.StartTLS()
	defer srv.Close()
	ctx := context.Background()

	handshake := func(bundle []byte) error {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(bundle) {
			t.Fatal("caBundle holds no certificate")
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "raysync-webhook.raysync.svc", Time: func() time.Time { return now }}}}
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	state := func() (*corev1.Secret, []byte) {
		s, err := kube.CoreV1().Secrets("raysync").Get(ctx, "raysync-webhook-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		c, _ := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "raysync", metav1.GetOptions{})
		if !bytes.Equal(c.Webhooks[0].ClientConfig.CABundle, c.Webhooks[1].ClientConfig.CABundle) {
			t.Fatal("the webhooks trust different CAs")
		}
		return s, c.Webhooks[0].ClientConfig.CABundle
	}

	if err := m.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	s1, bundle1 := state()
	if !bytes.Equal(bundle1, s1.Data["ca.crt"]) || handshake(bundle1) != nil {
		t.Fatalf("first certificate not served or not trusted: %v", handshake(bundle1))
	}
	if got := testutil.ToFloat64(m.Metrics.WebhookCertExpiry); got != float64(now.Add(time.Hour).Unix()) {
		t.Errorf("expiry metric %v", got)
	}

	now = now.Add(30 * time.Minute) // two thirds of its life left: kept
	_ = m.Sync(ctx)
	if s, _ := state(); !bytes.Equal(s.Data["tls.crt"], s1.Data["tls.crt"]) {
		t.Error("renewed too early")
	}
	now = now.Add(15 * time.Minute) // a quarter left: renewed, same CA
	_ = m.Sync(ctx)
	s2, bundle2 := state()
	if bytes.Equal(s2.Data["tls.crt"], s1.Data["tls.crt"]) || !bytes.Equal(bundle2, bundle1) {
		t.Fatal("not renewed under the same CA")
	}
	if err := handshake(bundle1); err != nil {
		t.Errorf("the renewed certificate is not trusted by the caBundle the API server has: %v", err)
	}

	now = now.Add(9 * time.Hour) // the CA (10 h) is within two serving lifetimes of its end: a new CA, both trusted
	_ = m.Sync(ctx)
	s3, bundle3 := state()
	if bytes.Equal(s3.Data["ca.key"], s2.Data["ca.key"]) || !bytes.Contains(bundle3, bundle1) || len(bundle3) <= len(bundle1) {
		t.Fatal("CA not replaced, or the old one no longer trusted")
	}
	if err := handshake(bundle3); err != nil {
		t.Errorf("new CA's certificate not trusted: %v", err)
	}
	for _, s := range []*corev1.Secret{s1, s2, s3} {
		if s.Labels["raysync.dev/managed-by"] != "" {
			t.Error("the certificate Secret carries the managed-copy label (raysync would prune it)")
		}
	}
}

// A Secret of that name raysync did not create is never overwritten, and nothing is served from it.
func TestCertManagerLeavesForeignSecretAlone(t *testing.T) {
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "raysync", Name: "raysync-webhook-tls"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": []byte("theirs"), "tls.key": []byte("theirs")}}
	kube := fake.NewClientset(foreign)
	m := &CertManager{Kube: kube, Secret: types.NamespacedName{Namespace: "raysync", Name: "raysync-webhook-tls"},
		IPs: []net.IP{net.ParseIP("127.0.0.1")}, Validity: time.Hour, Log: zap.NewNop()}
	if err := m.Sync(context.Background()); err == nil || !strings.Contains(err.Error(), "not raysync's webhook certificate") {
		t.Errorf("Sync = %v, want a refusal", err)
	}
	s, _ := kube.CoreV1().Secrets("raysync").Get(context.Background(), "raysync-webhook-tls", metav1.GetOptions{})
	if string(s.Data["tls.crt"]) != "theirs" || len(s.Annotations) != 0 {
		t.Error("overwrote a Secret raysync does not own")
	}
	if c, err := m.GetCertificate(nil); err == nil || c != nil {
		t.Error("serves a certificate it does not own")
	}
}
