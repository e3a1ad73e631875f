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
// serves it, and puts its CA in the webhook configuration.
func (m *CertManager) Sync(ctx context.Context) error {
	secrets := m.Kube.CoreV1().Secrets(m.Secret.Namespace)
	s, err := secrets.Get(ctx, m.Secret.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// No raysync.dev/managed-by label: that marks copies, which raysync prunes.
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: m.Secret.Name, Namespace: m.Secret.Namespace,
			Annotations: map[string]string{names.KindAnnotation: names.KindWebhookCertificate}}, Type: corev1.SecretTypeTLS}
		if err := m.issue(s); err != nil {
			return err
		}
		if s, err = secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create Secret %s: %w", m.Secret, err) // another replica's won: the next pass reads it
		}
		m.Log.Info("issued the webhook's CA and serving certificate", zap.String("secret", m.Secret.String()))
	case err != nil:
		return fmt.Errorf("read Secret %s: %w", m.Secret, err)
	case s.Annotations[names.KindAnnotation] != names.KindWebhookCertificate:
		// Someone else's Secret: never overwritten, never served (the webhook fails open meanwhile).
		return fmt.Errorf("Secret %s exists and is not raysync's webhook certificate (annotation %s=%s): leaving it untouched; "+
			"choose another --webhook-cert-secret", m.Secret, names.KindAnnotation, names.KindWebhookCertificate)
	case m.needsRenewal(s):
		s = s.DeepCopy()
		if err := m.issue(s); err != nil {
			return err
		}
		if s, err = secrets.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("renew the certificate in Secret %s: %w", m.Secret, err)
		}
		m.Log.Info("renewed the webhook's serving certificate", zap.String("secret", m.Secret.String()))
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

// needsRenewal: the serving certificate is missing, unreadable, not for these names, not signed by the
// first CA, or in the last third of its life.
func (m *CertManager) needsRenewal(s *corev1.Secret) bool {
	leaf, err := parseCert(s.Data[corev1.TLSCertKey])
	if err != nil {
		return true
	}
	if _, err := tls.X509KeyPair(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
		return true
	}
	ca, err := parseCert(s.Data[caCertKey])
	if err != nil || leaf.CheckSignatureFrom(ca) != nil {
		return true
	}
	if !slices.Equal(leaf.DNSNames, m.DNSNames) || !slices.EqualFunc(leaf.IPAddresses, m.IPs, func(a, b net.IP) bool { return a.Equal(b) }) {
		return true
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return m.now().After(leaf.NotAfter.Add(-life / 3))
}

// issue puts a new serving certificate into s, signed by its CA while the CA outlives it (else by a
// new CA, with the old one kept in ca.crt until it expires so the caBundle trusts both meanwhile).
func (m *CertManager) issue(s *corev1.Secret) error {
	now := m.now()
	ca, caKey, err := parseCA(s.Data[caCertKey], s.Data[caKeyKey])
	bundle := s.Data[caCertKey]
	if err != nil || ca.NotAfter.Before(now.Add(2*m.Validity)) {
		var caPEM []byte
		if ca, caKey, caPEM, err = newCA(now, 10*m.Validity); err != nil {
			return err
		}
		bundle = append(caPEM, stillValid(bundle, now)...)
		keyDER, err := x509.MarshalECPrivateKey(caKey)
		if err != nil {
			return err
		}
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		s.Data[caKeyKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "raysync-webhook"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(m.Validity), DNSNames: m.DNSNames, IPAddresses: m.IPs,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	s.Data[caCertKey] = bundle
	s.Data[corev1.TLSCertKey] = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	s.Data[corev1.TLSPrivateKeyKey] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return nil
}

func newCA(now time.Time, validity time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "raysync-webhook-ca"},
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

// injectCABundle puts bundle into every webhook of the configuration that does not have it.
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
		if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
			cfg.Webhooks[i].ClientConfig.CABundle = bundle
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
