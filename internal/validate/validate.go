// Package validate checks the source Secrets (and the API server flag) before raysync uses them: a
// source that fails here is never copied anywhere; every target keeps what it has and the source is
// reported (SourceInvalid, raysync_source_valid 0).
package validate

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	corev1 "k8s.io/api/core/v1"
)

// MaxTokenBytes bounds the canonical token: Ray sends it in an HTTP header on every request.
const MaxTokenBytes = 4096

// InvalidSourceError says why a source cannot be used. Its message never contains the value.
type InvalidSourceError struct{ Reason string }

func (e *InvalidSourceError) Error() string { return e.Reason }

func invalid(format string, args ...any) error {
	return &InvalidSourceError{Reason: fmt.Sprintf(format, args...)}
}

// Token returns the canonical token held in key of the source Secret, or why it is unusable.
// secret is nil when the Secret does not exist. A token must be non-empty, at most 4 KiB, valid UTF-8,
// without control characters and without leading or trailing whitespace (a trailing newline from
// `kubectl create secret --from-file` is the classic mistake: Ray compares tokens byte for byte).
func Token(secret *corev1.Secret, key string) ([]byte, error) {
	if secret == nil {
		return nil, invalid("Secret does not exist")
	}
	if secret.Type != "" && secret.Type != corev1.SecretTypeOpaque {
		return nil, invalid("Secret type is %q, want %q", secret.Type, corev1.SecretTypeOpaque)
	}
	v, ok := secret.Data[key]
	if !ok {
		return nil, invalid("key %q missing (keys present: %s)", key, keyList(secret.Data))
	}
	switch {
	case len(v) == 0:
		return nil, invalid("key %q is empty", key)
	case len(v) > MaxTokenBytes:
		return nil, invalid("key %q holds %d bytes, more than %d", key, len(v), MaxTokenBytes)
	case !utf8.Valid(v):
		return nil, invalid("key %q is not valid UTF-8", key)
	}
	s := string(v)
	if strings.TrimSpace(s) != s {
		return nil, invalid("key %q has leading or trailing whitespace", key)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return nil, invalid("key %q contains control characters", key)
		}
	}
	return v, nil
}

func keyList(data map[string][]byte) string {
	if len(data) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(data))
	for _, k := range slices.Sorted(maps.Keys(data)) {
		keys = append(keys, strconv.Quote(k))
	}
	return strings.Join(keys, ", ")
}

// PullSecret accepts a kubernetes.io/dockerconfigjson Secret whose .dockerconfigjson has an
// "auths" object, or a kubernetes.io/dockercfg Secret whose .dockercfg is a JSON object.
func PullSecret(s *corev1.Secret) error {
	if s == nil {
		return invalid("Secret does not exist")
	}
	switch s.Type {
	case corev1.SecretTypeDockerConfigJson:
		raw, ok := s.Data[corev1.DockerConfigJsonKey]
		if !ok {
			return invalid("key %q missing", corev1.DockerConfigJsonKey)
		}
		var cfg struct {
			Auths map[string]json.RawMessage `json:"auths"`
		}
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return invalid("key %q is not valid JSON", corev1.DockerConfigJsonKey)
		}
		if cfg.Auths == nil {
			return invalid("key %q has no \"auths\" object", corev1.DockerConfigJsonKey)
		}
	case corev1.SecretTypeDockercfg:
		raw, ok := s.Data[corev1.DockerConfigKey]
		if !ok {
			return invalid("key %q missing", corev1.DockerConfigKey)
		}
		var cfg map[string]json.RawMessage
		if err := json.Unmarshal(raw, &cfg); err != nil || cfg == nil {
			return invalid("key %q is not a JSON object", corev1.DockerConfigKey)
		}
	default:
		return invalid("Secret type is %q, want %q or %q", s.Type, corev1.SecretTypeDockerConfigJson, corev1.SecretTypeDockercfg)
	}
	return nil
}

// TLS keys of an autoscaler client-certificate Secret (cert-manager's layout).
const (
	TLSCertKey = corev1.TLSCertKey       // tls.crt
	TLSKeyKey  = corev1.TLSPrivateKeyKey // tls.key
	TLSCAKey   = "ca.crt"
)

// Cert is what raysync learned from a valid client-certificate source.
type Cert struct {
	NotAfter time.Time
	HasCA    bool
}

// AutoscalerTLS checks that tls.crt and tls.key form a matching pair whose leaf certificate is
// valid now, and that ca.crt (optional) holds at least one certificate.
func AutoscalerTLS(s *corev1.Secret, now time.Time) (Cert, error) {
	return ParseAutoscalerTLS(s).At(now)
}

// ParsedTLS is what AutoscalerTLS reads from a Secret before it looks at the clock: parsing a key
// pair is the costly part, and a cached Secret's content never changes, so it can be kept.
type ParsedTLS struct {
	err                 error // the pair is unusable whatever the time
	notBefore, notAfter time.Time
	caErr               error
	hasCA               bool
}

// ParseAutoscalerTLS parses s's certificate, key and CA bundle (s nil: the Secret does not exist).
func ParseAutoscalerTLS(s *corev1.Secret) ParsedTLS {
	var out ParsedTLS
	if s == nil {
		out.err = invalid("Secret does not exist")
		return out
	}
	crt, hasCrt := s.Data[TLSCertKey]
	key, hasKey := s.Data[TLSKeyKey]
	switch {
	case !hasCrt && !hasKey:
		out.err = invalid("keys %q and %q missing", TLSCertKey, TLSKeyKey)
	case !hasCrt:
		out.err = invalid("key %q missing (a key without its certificate)", TLSCertKey)
	case !hasKey:
		out.err = invalid("key %q missing (a certificate without its key)", TLSKeyKey)
	}
	if out.err != nil {
		return out
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		out.err = invalid("%q and %q are not a matching PEM certificate and key", TLSCertKey, TLSKeyKey)
		return out
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		out.err = invalid("%q does not parse as an X.509 certificate", TLSCertKey)
		return out
	}
	out.notBefore, out.notAfter = leaf.NotBefore, leaf.NotAfter
	if ca, ok := s.Data[TLSCAKey]; ok {
		out.hasCA = true
		if !parsesAsCertificates(ca) {
			out.caErr = invalid("%q holds no parsable PEM certificate", TLSCAKey)
		}
	}
	return out
}

// At is AutoscalerTLS's answer at now.
func (p ParsedTLS) At(now time.Time) (Cert, error) {
	var out Cert
	switch {
	case p.err != nil:
		return out, p.err
	case now.Before(p.notBefore):
		return out, invalid("certificate is not valid before %s", p.notBefore.UTC().Format(time.RFC3339))
	case now.After(p.notAfter):
		return out, invalid("certificate expired at %s", p.notAfter.UTC().Format(time.RFC3339))
	}
	out.NotAfter = p.notAfter
	if p.caErr != nil {
		return out, p.caErr
	}
	out.HasCA = p.hasCA
	return out, nil
}

func parsesAsCertificates(b []byte) bool {
	n := 0
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return false
		}
		if _, err := x509.ParseCertificate(block.Bytes); err != nil {
			return false
		}
		n++
	}
	return n > 0 && len(strings.TrimSpace(string(b))) == 0
}

// APIServer is where the autoscaler should reach the Kubernetes API (through an authenticating proxy).
type APIServer struct {
	Host string // without scheme, as Kubernetes itself sets KUBERNETES_SERVICE_HOST
	Port int
}

// ParseAPIServer parses https://HOST[:PORT]. http:// is refused, as Ray refuses it.
func ParseAPIServer(v string) (APIServer, error) {
	u, err := url.Parse(v)
	if err != nil || u.Host == "" {
		return APIServer{}, fmt.Errorf("%q is not https://HOST[:PORT]", v)
	}
	if u.Scheme != "https" {
		return APIServer{}, fmt.Errorf("%q: scheme must be https (Ray refuses plain http)", v)
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return APIServer{}, fmt.Errorf("%q must be https://HOST[:PORT] without path, query or credentials", v)
	}
	host, portStr := u.Hostname(), u.Port()
	port := 443
	if portStr != "" {
		if port, err = strconv.Atoi(portStr); err != nil || port < 1 || port > 65535 {
			return APIServer{}, fmt.Errorf("%q: invalid port", v)
		}
	}
	if host == "" || (net.ParseIP(host) == nil && strings.ContainsAny(host, "/ \t")) {
		return APIServer{}, fmt.Errorf("%q: invalid host", v)
	}
	return APIServer{Host: host, Port: port}, nil
}
