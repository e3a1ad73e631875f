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
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
)

// The serving certificate. Self-managed (the default), raysync keeps a CA and a serving certificate in
// one Secret that every replica serves from, renews the serving certificate a third of its life ahead
// (the CA stays, so the caBundle does not change), and keeps the webhook configuration's caBundle
// current. With a certificate directory (cert-manager), it only serves what the directory holds.

// Keys of the certificate Secret.
const (
	caCertKey = "ca.crt" // the CAs the webhook configuration trusts: the current one first
	caKeyKey  = "ca.key"
)

// caCommonName names the CA raysync issues (and recognises as its own in an unmarked Secret).
const caCommonName = "raysync-webhook-ca"

// CertManager keeps the webhook's serving certificate.
type CertManager struct {
	Kube kubernetes.Interface
	// Secret holds the CA and the serving certificate.
	Secret types.NamespacedName
	// Configuration is the MutatingWebhookConfiguration whose caBundle raysync keeps ("": none).
	Configuration string
	DNSNames      []string
	IPs           []net.IP
	// Validity of a serving certificate; the CA lives ten times as long.
	Validity time.Duration
	Metrics  *metrics.Metrics
	Log      *zap.Logger
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	current atomic.Pointer[tls.Certificate]
}

// GetCertificate serves the current certificate (tls.Config.GetCertificate).
func (m *CertManager) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := m.current.Load(); c != nil {
		return c, nil
	}
	return nil, errors.New("no serving certificate yet")
}

func (m *CertManager) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Run keeps the certificate and the caBundle current until ctx ends, checking every interval.
func (m *CertManager) Run(ctx context.Context, interval time.Duration) {
	for {
		if err := m.Sync(ctx); err != nil && ctx.Err() == nil {
			m.Log.Error("webhook certificate", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// Sync makes the Secret hold a serving certificate good for a while yet (creating or renewing it),
// serves it, and makes the webhook configuration trust its CAs. A new CA is rolled in two steps, each
// decided from the objects alone, so that no replica ever serves a certificate the caBundle does not
// trust: first the Secret gets the new CA (trusted with the old one) while the old certificate is
// still served; once the configuration trusts the new CA, a certificate it signed replaces the old one.
func (m *CertManager) Sync(ctx context.Context) error {
	secrets := m.Kube.CoreV1().Secrets(m.Secret.Namespace)
	s, err := secrets.Get(ctx, m.Secret.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// No raysync.dev/managed-by label: that marks copies, which raysync prunes.
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: m.Secret.Name, Namespace: m.Secret.Namespace,
			Annotations: map[string]string{names.KindAnnotation: names.KindWebhookCertificate}}, Type: corev1.SecretTypeTLS}
		if _, err := m.issue(s, true); err != nil {
			return err
		}
		created, err := secrets.Create(ctx, s, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			m.Log.Info("another replica issued the webhook's certificate first; serving its", zap.String("secret", m.Secret.String()))
			return nil // the next pass reads and serves it
		} else if err != nil {
			return fmt.Errorf("create Secret %s: %w", m.Secret, err)
		}
		s = created
		m.Log.Info("issued the webhook's CA and serving certificate", zap.String("secret", m.Secret.String()))
	case err != nil:
		return fmt.Errorf("read Secret %s: %w", m.Secret, err)
	case s.Annotations[names.KindAnnotation] != names.KindWebhookCertificate:
		if why := notAdoptable(s); why != "" {
			// Someone else's Secret: never overwritten, never served (the webhook fails open meanwhile).
			return fmt.Errorf("Secret %s exists and is not raysync's webhook certificate (annotation %s=%s; %s): leaving it untouched; "+
				"choose another --webhook-cert-secret", m.Secret, names.KindAnnotation, names.KindWebhookCertificate, why)
		}
		// Written by a raysync from before the mark (its own CA, key and certificate, nothing else): mark it.
		s = s.DeepCopy()
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[names.KindAnnotation] = names.KindWebhookCertificate
		if s, err = secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("mark Secret %s as raysync's webhook certificate: %w", m.Secret, err)
		}
		m.Log.Info("adopted the webhook certificate Secret an earlier raysync wrote", zap.String("secret", m.Secret.String()))
	}
	trusted, err := m.trusts(ctx, s.Data[caCertKey])
	if err != nil {
		return err
	}
	if reason := m.renewalReason(s, trusted); reason != "" {
		next := s.DeepCopy()
		changed, err := m.issue(next, trusted)
		if err != nil {
			return err
		}
		if changed {
			if s, err = secrets.Update(ctx, next, metav1.UpdateOptions{}); err != nil {
				return fmt.Errorf("renew the certificate in Secret %s (%s): %w", m.Secret, reason, err)
			}
			m.Log.Info("renewed the webhook's serving certificate", zap.String("secret", m.Secret.String()), zap.String("reason", reason))
		}
	}
	if err := m.serve(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return err
	}
	return m.injectCABundle(ctx, s.Data[caCertKey])
}

func (m *CertManager) serve(certPEM, keyPEM []byte) error {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("serving certificate in Secret %s: %w", m.Secret, err)
	}
	if cur := m.current.Load(); cur == nil || !bytes.Equal(cur.Certificate[0], c.Certificate[0]) {
		m.current.Store(&c)
		if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil && m.Metrics != nil {
			m.Metrics.WebhookCertExpiry.Set(float64(leaf.NotAfter.Unix()))
		}
	}
	return nil
}

// renewalReason says why the Secret needs a new CA or serving certificate ("" when it does not).
// trusted: the webhook configuration trusts the Secret's first (newest) CA.
func (m *CertManager) renewalReason(s *corev1.Secret, trusted bool) string {
	ca, _, err := parseCA(s.Data[caCertKey], s.Data[caKeyKey])
	if err != nil {
		return "no usable CA: " + err.Error()
	}
	if ca.NotAfter.Before(m.now().Add(2 * m.Validity)) {
		return "the CA expires " + ca.NotAfter.UTC().Format(time.RFC3339) + ", within two serving lifetimes"
	}
	leaf, err := parseCert(s.Data[corev1.TLSCertKey])
	if err != nil {
		return "no serving certificate"
	}
	if _, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return "the serving certificate and key do not match"
	}
	if !m.covers(leaf) {
		return "the serving certificate is not for every name and address of this replica"
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	if m.now().After(leaf.NotAfter.Add(-life / 3)) {
		return "the serving certificate expires " + leaf.NotAfter.UTC().Format(time.RFC3339)
	}
	if leaf.CheckSignatureFrom(ca) != nil && trusted {
		return "the webhook configuration trusts the new CA: serving a certificate it signed"
	}
	return ""
}

// issue renews what s needs: a new CA when its CA is unusable or runs out (kept first in ca.crt, the
// old ones after it until they expire), and a serving certificate signed by the first CA, unless a
// new CA is not trusted yet and the certificate s holds still serves: then that one stays.
func (m *CertManager) issue(s *corev1.Secret, trusted bool) (changed bool, err error) {
	now := m.now()
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	ca, caKey, err := parseCA(s.Data[caCertKey], s.Data[caKeyKey])
	if err != nil || ca.NotAfter.Before(now.Add(2*m.Validity)) {
		var caPEM []byte
		if ca, caKey, caPEM, err = newCA(now, 10*m.Validity); err != nil {
			return false, err
		}
		keyDER, err := x509.MarshalECPrivateKey(caKey)
		if err != nil {
			return false, err
		}
		s.Data[caCertKey] = append(caPEM, stillValid(s.Data[caCertKey], now)...)
		s.Data[caKeyKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		changed, trusted = true, m.Configuration == ""
	}
	if !trusted && m.servesStill(s) {
		return changed, nil // the configuration does not trust the new CA yet: keep serving the old certificate
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return false, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "raysync-webhook"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(m.Validity), DNSNames: m.DNSNames, IPAddresses: m.IPs,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return false, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return false, err
	}
	s.Data[corev1.TLSCertKey] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	s.Data[corev1.TLSPrivateKeyKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return true, nil
}

// servesStill: s holds a serving certificate for these names, with its key, signed by one of its CAs,
// and valid for another minute at least (its renewal can wait for the caBundle).
func (m *CertManager) servesStill(s *corev1.Secret) bool {
	leaf, err := parseCert(s.Data[corev1.TLSCertKey])
	if err != nil || !m.now().Add(time.Minute).Before(leaf.NotAfter) {
		return false
	}
	if _, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return false
	}
	signed := false
	for _, ca := range certs(s.Data[caCertKey]) {
		signed = signed || leaf.CheckSignatureFrom(ca) == nil
	}
	return signed && m.covers(leaf)
}

// covers reports whether leaf is for every DNS name and IP address this replica serves as, in any
// order (replicas configured alike may list them in another order; DNS names are case-insensitive).
// A certificate for more names serves too: mid-rollout, replicas with the old and the new names do not
// re-issue each other's certificate back and forth (the new names are issued once; a dropped name
// leaves at the next renewal).
func (m *CertManager) covers(leaf *x509.Certificate) bool {
	for _, d := range m.DNSNames {
		if !slices.ContainsFunc(leaf.DNSNames, func(n string) bool { return strings.EqualFold(n, d) }) {
			return false
		}
	}
	for _, ip := range m.IPs {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// notAdoptable says why a Secret without raysync's mark is not one an earlier raysync wrote ("": it
// is): a TLS Secret holding only ca.crt, ca.key, tls.crt and tls.key, whose first CA is raysync's
// self-signed webhook CA with its key, and whose serving certificate that CA signed.
func notAdoptable(s *corev1.Secret) string {
	if s.Type != corev1.SecretTypeTLS {
		return "type " + string(s.Type)
	}
	for k := range s.Data {
		if !slices.Contains([]string{caCertKey, caKeyKey, corev1.TLSCertKey, corev1.TLSPrivateKeyKey}, k) {
			return "it holds key " + k
		}
	}
	ca, _, err := parseCA(s.Data[caCertKey], s.Data[caKeyKey])
	if err != nil {
		return "no CA with its key"
	}
	if ca.Subject.CommonName != caCommonName || !ca.IsCA || ca.CheckSignatureFrom(ca) != nil {
		return "its CA is not raysync's"
	}
	leaf, err := parseCert(s.Data[corev1.TLSCertKey])
	if err != nil || leaf.CheckSignatureFrom(ca) != nil {
		return "its certificate is not signed by its CA"
	}
	return ""
}

// trusts reports whether every webhook of the configuration trusts the first CA of bundle (true
// when raysync keeps no configuration).
func (m *CertManager) trusts(ctx context.Context, bundle []byte) (bool, error) {
	if m.Configuration == "" {
		return true, nil
	}
	first := certs(bundle)
	if len(first) == 0 {
		return false, nil
	}
	cfg, err := m.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, m.Configuration, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("read MutatingWebhookConfiguration %s: %w", m.Configuration, err)
	}
	for _, w := range cfg.Webhooks {
		if !slices.ContainsFunc(certs(w.ClientConfig.CABundle), first[0].Equal) {
			return false, nil
		}
	}
	return true, nil
}

func newCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: caCommonName},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(der)
	return ca, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), err
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// parseCert reads the first certificate of a PEM bundle.
func parseCert(b []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(block.Bytes)
}

func parseCA(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	ca, err := parseCert(certPEM)
	if err != nil {
		return nil, nil, err
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, nil, errors.New("no CA key")
	}
	key, err := x509.ParseECPrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, err
	}
	if !key.PublicKey.Equal(ca.PublicKey) {
		return nil, nil, errors.New("CA key does not match")
	}
	return ca, key, nil
}

// stillValid keeps the certificates of a PEM bundle that have not expired.
func stillValid(bundle []byte, now time.Time) []byte {
	var out []byte
	for rest := bundle; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return out
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil && now.Before(c.NotAfter) {
			out = append(out, pem.EncodeToMemory(block)...)
		}
	}
}

// injectCABundle makes every webhook of the configuration trust the CAs of bundle. It only ever adds
// CAs (and drops expired ones): a replica that read the Secret before another replica rolled the CA
// must not take the new CA out again. The update carries the resourceVersion it read.
func (m *CertManager) injectCABundle(ctx context.Context, bundle []byte) error {
	if m.Configuration == "" {
		return nil
	}
	api := m.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cfg, err := api.Get(ctx, m.Configuration, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read MutatingWebhookConfiguration %s: %w", m.Configuration, err)
	}
	changed := false
	for i := range cfg.Webhooks {
		cur := cfg.Webhooks[i].ClientConfig.CABundle
		if want := dedupe(append(stillValid(bundle, m.now()), stillValid(cur, m.now())...)); !sameCerts(want, cur) {
			cfg.Webhooks[i].ClientConfig.CABundle = want
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if _, err := api.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update the caBundle of MutatingWebhookConfiguration %s: %w", m.Configuration, err)
	}
	m.Log.Info("webhook configuration trusts the current CA", zap.String("configuration", m.Configuration))
	return nil
}

// certs parses every certificate of a PEM bundle.
func certs(bundle []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for rest := bundle; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return out
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

// sameCerts: two PEM bundles hold the same certificates, in any order.
func sameCerts(a, b []byte) bool {
	x, y := certs(a), certs(b)
	return len(x) == len(y) && !slices.ContainsFunc(x, func(c *x509.Certificate) bool { return !slices.ContainsFunc(y, c.Equal) })
}

// dedupe drops repeated certificates of a PEM bundle, keeping the first of each.
func dedupe(bundle []byte) []byte {
	var out []byte
	var seen []*x509.Certificate
	for _, c := range certs(bundle) {
		if !slices.ContainsFunc(seen, c.Equal) {
			seen = append(seen, c)
			out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
	}
	return out
}

// DirCertificate serves tls.crt and tls.key from a directory (a mounted cert-manager Secret), reading
// them again when they change.
type DirCertificate struct {
	Dir     string
	Metrics *metrics.Metrics

	loaded  atomic.Pointer[tls.Certificate]
	modTime atomic.Int64
}

// GetCertificate serves the directory's certificate (tls.Config.GetCertificate).
func (d *DirCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	certFile, keyFile := filepath.Join(d.Dir, corev1.TLSCertKey), filepath.Join(d.Dir, corev1.TLSPrivateKeyKey)
	st, err := os.Stat(certFile)
	if err != nil {
		return nil, err
	}
	if c := d.loaded.Load(); c != nil && d.modTime.Load() == st.ModTime().UnixNano() {
		return c, nil
	}
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		if old := d.loaded.Load(); old != nil {
			return old, nil // mid-update: keep serving the last good pair
		}
		return nil, err
	}
	d.loaded.Store(&c)
	d.modTime.Store(st.ModTime().UnixNano())
	if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil && d.Metrics != nil {
		d.Metrics.WebhookCertExpiry.Set(float64(leaf.NotAfter.Unix()))
	}
	return &c, nil
}
