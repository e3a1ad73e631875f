package framework

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the set of files one control plane needs, all under dir.
type pki struct {
	dir                     string
	caCert, caKey           string
	servingCert, servingKey string
	saKey, saPub            string
	adminCert, adminKey     string
	kcmCert, kcmKey         string
	// kubeletClientCert is the API server's identity towards kubelets (logs, exec, port-forward).
	kubeletClientCert, kubeletClientKey string
	caTemplate                          *x509.Certificate
	caSigner                            *ecdsa.PrivateKey
}

func newPKI(dir string) (*pki, error) {
	p := &pki{dir: dir}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "raysync-e2e-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(7 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ = x509.ParseCertificate(der)
	p.caTemplate, p.caSigner = ca, caKey
	if p.caCert, p.caKey, err = p.write("ca", der, caKey); err != nil {
		return nil, err
	}
	if p.servingCert, p.servingKey, err = p.issue("apiserver", "kube-apiserver", nil, true,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(KubernetesServiceIP), net.ParseIP(RealNodeHostIP)}); err != nil {
		return nil, err
	}
	if p.adminCert, p.adminKey, err = p.issue("admin", "raysync-e2e-admin", []string{"system:masters"}, false, nil, nil); err != nil {
		return nil, err
	}
	if p.kubeletClientCert, p.kubeletClientKey, err = p.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, false, nil, nil); err != nil {
		return nil, err
	}
	if p.kcmCert, p.kcmKey, err = p.issue("kcm", "system:kube-controller-manager", nil, false, nil, nil); err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	p.saKey = filepath.Join(dir, "sa.key")
	if err := writePEM(p.saKey, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(saKey)); err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return nil, err
	}
	p.saPub = filepath.Join(dir, "sa.pub")
	if err := writePEM(p.saPub, "PUBLIC KEY", pub); err != nil {
		return nil, err
	}
	return p, nil
}

var serial int64 = 1

func (p *pki) issue(name, cn string, orgs []string, server bool, dns []string, ips []net.IP) (string, string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial++
	now := time.Now()
	t := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(7 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	if server {
		t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, t, p.caTemplate, &key.PublicKey, p.caSigner)
	if err != nil {
		return "", "", err
	}
	return p.write(name, der, key)
}

func (p *pki) write(name string, der []byte, key *ecdsa.PrivateKey) (string, string, error) {
	certPath, keyPath := filepath.Join(p.dir, name+".crt"), filepath.Join(p.dir, name+".key")
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	return certPath, keyPath, writePEM(keyPath, "EC PRIVATE KEY", kb)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// writeKubeconfig writes a self-contained kubeconfig (certificates inlined) for a client certificate.
func writeKubeconfig(path, server, caPath, certPath, keyPath string) error {
	var data [3]string
	for i, f := range []string{caPath, certPath, keyPath} {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		data[i] = base64.StdEncoding.EncodeToString(b)
	}
	ca, cert, key := data[0], data[1], data[2]
	return os.WriteFile(path, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: raysync-e2e
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: user
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: raysync-e2e
  context:
    cluster: raysync-e2e
    user: user
current-context: raysync-e2e
`, server, ca, cert, key)), 0o600)
}

// IssueClientCert issues a client certificate for user cn (with groups orgs) from the control plane's
// CA, which the API server trusts for client authentication, and returns it with its key and the CA
// (which also signed the API server's serving certificate). Not for a cluster the harness did not start.
func (c *ControlPlane) IssueClientCert(cn string, orgs []string) (crt, key, ca []byte, err error) {
	if c.External {
		return nil, nil, nil, fmt.Errorf("the harness has no CA of a cluster it did not start")
	}
	caPEM, err := os.ReadFile(filepath.Join(c.Dir, "ca.crt"))
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(c.Dir, "ca.key"))
	if err != nil {
		return nil, nil, nil, err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, nil, fmt.Errorf("no CA in %s", c.Dir)
	}
	caCert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, nil, err
	}
	caKey, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return nil, nil, nil, err
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &k.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), caPEM, nil
}
