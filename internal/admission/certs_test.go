package admission

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/names"
)

// certWorld is a webhook configuration, the certificate Secret and replicas serving from them, on a
// clock the test moves.
type certWorld struct {
	t    *testing.T
	kube *fake.Clientset
	now  time.Time
}

var certSecret = types.NamespacedName{Namespace: "raysync", Name: "raysync-webhook-tls"}

func newCertWorld(t *testing.T, objs ...runtime.Object) *certWorld {
	fail := admissionregistrationv1.Ignore
	cfg := &admissionregistrationv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "raysync", ResourceVersion: "1"},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "pods.raysync.dev", FailurePolicy: &fail}, {Name: "secrets.raysync.dev", FailurePolicy: &fail}}}
	return &certWorld{t: t, kube: fake.NewClientset(append([]runtime.Object{cfg}, objs...)...), now: time.Now()}
}

func (w *certWorld) replica() *CertManager {
	return &CertManager{Kube: w.kube, Secret: certSecret, Configuration: "raysync", DNSNames: []string{"raysync-webhook.raysync.svc"},
		Validity: time.Hour, Log: zap.NewNop(), Now: func() time.Time { return w.now }}
}

func (w *certWorld) secret() *corev1.Secret {
	s, err := w.kube.CoreV1().Secrets(certSecret.Namespace).Get(context.Background(), certSecret.Name, metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return s
}

func (w *certWorld) bundle() []byte {
	c, err := w.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(context.Background(), "raysync", metav1.GetOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	return c.Webhooks[0].ClientConfig.CABundle
}

// handshake dials m's certificate with the caBundle as the API server has it now.
func (w *certWorld) handshake(m *CertManager) error {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{GetCertificate: m.GetCertificate}
	srv.StartTLS()
	defer srv.Close()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(w.bundle()) {
		return errors.New("the caBundle holds no certificate")
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "raysync-webhook.raysync.svc", Time: func() time.Time { return w.now }}}}
	resp, err := c.Get(srv.URL)
	if err == nil {
		resp.Body.Close()
	}
	return err
}

func (w *certWorld) sync(m *CertManager) {
	w.t.Helper()
	if err := m.Sync(context.Background()); err != nil {
		w.t.Fatal(err)
	}
}

// A CA roll-over never serves a certificate the caBundle does not trust yet: the new CA is published
// first, and the certificate it signs is served only once the configuration shows it. A replica that
// read the Secret before another replica rolled it never takes the new CA back out of the caBundle.
func TestCARollOverPublishesTheNewCAFirst(t *testing.T) {
	w := newCertWorld(t)
	a, b := w.replica(), w.replica()
	start := w.now
	w.sync(a)
	w.sync(b)
	// Renew the serving certificate until the CA (10 h) comes within two serving lifetimes of its end.
	for w.now = start.Add(45 * time.Minute); w.now.Before(start.Add(7*time.Hour + 58*time.Minute)); w.now = w.now.Add(40 * time.Minute) {
		w.sync(a)
	}
	w.now = start.Add(7*time.Hour + 58*time.Minute)
	w.sync(a)
	w.sync(b)
	before := w.secret()
	oldBundle := w.bundle()

	// The CA is within two serving lifetimes of its end and the serving certificate in its last third.
	// While the configuration cannot be written, a rolls the CA into the Secret and keeps serving the
	// certificate the API server trusts.
	w.kube.PrependReactor("update", "mutatingwebhookconfigurations", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("not now")
	})
	w.now = start.Add(8*time.Hour + 10*time.Minute)
	_ = a.Sync(context.Background())
	_ = a.Sync(context.Background())
	rolled := w.secret()
	if bytes.Equal(rolled.Data["ca.key"], before.Data["ca.key"]) {
		t.Fatal("the CA was not rolled over")
	}
	if !bytes.Equal(rolled.Data["tls.crt"], before.Data["tls.crt"]) {
		t.Fatal("switched the serving certificate before the configuration trusted the new CA")
	}
	if err := w.handshake(a); err != nil {
		t.Fatalf("a serves a certificate the caBundle does not trust: %v", err)
	}
	w.kube.ReactionChain = w.kube.ReactionChain[1:] // the configuration can be written again
	w.sync(a)
	if !bytes.Equal(w.secret().Data["tls.crt"], before.Data["tls.crt"]) || !bytes.Contains(w.bundle(), oldBundle) || countCerts(w.bundle()) != 2 {
		t.Fatal("the caBundle must trust both CAs while the old certificate is served")
	}
	// b read the Secret before a rolled the CA, and writes the caBundle after: it must not take the new CA out.
	if err := b.injectCABundle(context.Background(), before.Data["ca.crt"]); err != nil {
		t.Fatal(err)
	}
	if got := countCerts(w.bundle()); got != 2 {
		t.Fatalf("a replica with a stale Secret left %d CAs in the caBundle, want both", got)
	}
	w.sync(a) // the configuration trusts the new CA: now a certificate it signed is served
	w.sync(b)
	after := w.secret()
	if bytes.Equal(after.Data["tls.crt"], before.Data["tls.crt"]) {
		t.Fatal("never switched to a certificate of the new CA")
	}
	leaf, _ := parseCert(after.Data["tls.crt"])
	newCA, _ := parseCert(after.Data["ca.crt"])
	if leaf.CheckSignatureFrom(newCA) != nil {
		t.Error("the serving certificate is not signed by the new CA")
	}
	for name, m := range map[string]*CertManager{"a": a, "b": b} {
		if err := w.handshake(m); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// An unmarked Secret that an earlier raysync wrote (its own CA, key and certificate) is adopted and
// served, so an upgrade across the ownership check completes; anything else stays refused.
func TestCertificateSecretFromAnEarlierReleaseIsAdopted(t *testing.T) {
	w := newCertWorld(t)
	w.sync(w.replica())
	earlier := w.secret()
	earlier.Annotations = nil // as raysync wrote it before the mark
	w = newCertWorld(t, earlier)
	m := w.replica()
	w.sync(m)
	if got := w.secret(); got.Annotations[names.KindAnnotation] != names.KindWebhookCertificate || !bytes.Equal(got.Data["ca.key"], earlier.Data["ca.key"]) {
		t.Fatalf("not adopted as it was: annotations %v", got.Annotations)
	}
	if err := w.handshake(m); err != nil {
		t.Fatalf("the adopted certificate is not served and trusted: %v", err)
	}

	other := func(f func(*corev1.Secret)) *corev1.Secret { s := earlier.DeepCopy(); f(s); return s }
	otherCA := w.secret().DeepCopy()
	for name, s := range map[string]*corev1.Secret{
		"another key besides":  other(func(s *corev1.Secret) { s.Data["password"] = []byte("x") }),
		"not a TLS Secret":     other(func(s *corev1.Secret) { s.Type = corev1.SecretTypeOpaque }),
		"a CA without its key": other(func(s *corev1.Secret) { s.Data["ca.key"] = otherCA.Data["tls.key"] }),
		"someone else's CA":    foreignCA(t),
	} {
		t.Run(name, func(t *testing.T) {
			w := newCertWorld(t, s)
			err := w.replica().Sync(context.Background())
			if err == nil || !strings.Contains(err.Error(), "not raysync's webhook certificate") {
				t.Fatalf("Sync = %v, want a refusal", err)
			}
			if got := w.secret(); len(got.Annotations) != 0 || !bytes.Equal(got.Data["tls.crt"], s.Data["tls.crt"]) {
				t.Error("changed a Secret raysync does not own")
			}
		})
	}
}

// foreignCA is a TLS Secret of the same shape whose CA (with its key) another tool issued.
func foreignCA(t *testing.T) *corev1.Secret {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "someone-elses-ca"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: certSecret.Namespace, Name: certSecret.Name}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"ca.crt": caPEM, "ca.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), "tls.crt": caPEM, "tls.key": []byte("x")}}
}

// With cert-manager, the controller runs before the certificate exists; the webhook serves once the
// mounted files appear (the chart mounts the Secret optional).
func TestCertificateDirectoryServesOnceFilesAppear(t *testing.T) {
	dir := t.TempDir()
	d := &DirCertificate{Dir: dir}
	if c, err := d.GetCertificate(nil); err == nil || c != nil {
		t.Fatal("served a certificate from an empty directory")
	}
	w := newCertWorld(t)
	w.sync(w.replica())
	s := w.secret()
	for _, k := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, k), s.Data[k], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := d.GetCertificate(nil); err != nil || c == nil {
		t.Fatalf("no certificate once the files exist: %v", err)
	}
}

func countCerts(bundle []byte) int {
	n := 0
	for rest := bundle; ; n++ {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return n
		}
	}
}

// TestReplicasAgreeOnTheNamesOfTheCertificate: replicas configured with the same DNS names and IPs in
// another order, or (mid-rollout) with fewer, serve each other's certificate instead of re-issuing it
// back and forth; a certificate lacking a replica's IP address is re-issued.
func TestReplicasAgreeOnTheNamesOfTheCertificate(t *testing.T) {
	w := newCertWorld(t)
	a := w.replica()
	a.DNSNames = []string{"raysync-webhook.raysync.svc", "raysync-webhook.raysync.svc.cluster.local"}
	a.IPs = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	w.sync(a)
	issued := w.secret().Data[corev1.TLSCertKey]
	same := func(what string, m *CertManager) {
		t.Helper()
		w.sync(m)
		if !bytes.Equal(w.secret().Data[corev1.TLSCertKey], issued) {
			t.Errorf("%s re-issued the certificate", what)
			issued = w.secret().Data[corev1.TLSCertKey]
		}
	}
	b := w.replica()
	b.DNSNames = []string{"RAYSYNC-WEBHOOK.raysync.svc.cluster.local", "raysync-webhook.raysync.svc"}
	b.IPs = []net.IP{net.ParseIP("::1"), net.ParseIP("127.0.0.1").To4()}
	same("a replica listing the names and IPs in another order", b)
	old := w.replica() // the previous release: one name, no IP
	same("a replica needing fewer names", old)
	same("the first replica again", a)
	c := w.replica()
	c.DNSNames = a.DNSNames
	c.IPs = []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("198.18.0.9")}
	w.sync(c)
	leaf, err := parseCert(w.secret().Data[corev1.TLSCertKey])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(leaf.IPAddresses, net.ParseIP("198.18.0.9").Equal) {
		t.Errorf("a replica needing another IP address serves a certificate without it: %v", leaf.IPAddresses)
	}
	if reason := c.renewalReason(w.secret(), true); reason != "" {
		t.Errorf("after it re-issued: %q", reason)
	}
}
