package validate

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/cert"
)

// testCert returns a PEM certificate (chain) and key valid from an hour ago for a day, made with
// client-go's certificate helpers. Tests of validity windows move the validation time instead.
func testCert(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKeyWithOptions(cert.SelfSignedCertKeyOptions{Host: "ray-autoscaler", MaxAge: 25 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

func TestValidatePullSecret(t *testing.T) {
	s := func(typ corev1.SecretType, key, v string) *corev1.Secret {
		return &corev1.Secret{Type: typ, Data: map[string][]byte{key: []byte(v)}}
	}
	tests := map[string]struct {
		secret  *corev1.Secret
		wantErr string
	}{
		"dockerconfigjson":           {secret: s(corev1.SecretTypeDockerConfigJson, ".dockerconfigjson", `{"auths":{"registry.example":{"auth":"dTpw"}}}`)},
		"empty auths is still valid": {secret: s(corev1.SecretTypeDockerConfigJson, ".dockerconfigjson", `{"auths":{}}`)},
		"dockercfg":                  {secret: s(corev1.SecretTypeDockercfg, ".dockercfg", `{"registry.example":{"auth":"dTpw"}}`)},
		"missing":                    {secret: nil, wantErr: "does not exist"},
		"invalid JSON":               {secret: s(corev1.SecretTypeDockerConfigJson, ".dockerconfigjson", `{"auths":`), wantErr: "not valid JSON"},
		"no auths":                   {secret: s(corev1.SecretTypeDockerConfigJson, ".dockerconfigjson", `{"credsStore":"x"}`), wantErr: `no "auths"`},
		"auths is null":              {secret: s(corev1.SecretTypeDockerConfigJson, ".dockerconfigjson", `{"auths":null}`), wantErr: `no "auths"`},
		"auths not an object":        {secret: s(corev1.SecretTypeDockerConfigJson, ".dockerconfigjson", `{"auths":[1]}`), wantErr: "not valid JSON"},
		"key missing":                {secret: s(corev1.SecretTypeDockerConfigJson, "config.json", `{"auths":{}}`), wantErr: "missing"},
		"wrong type":                 {secret: s(corev1.SecretTypeOpaque, ".dockerconfigjson", `{"auths":{}}`), wantErr: "Secret type"},
		"dockercfg not an object":    {secret: s(corev1.SecretTypeDockercfg, ".dockercfg", `"x"`), wantErr: "not a JSON object"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := PullSecret(tc.secret)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "dTpw") {
				t.Fatal("reason leaks the credential")
			}
		})
	}
}

func TestValidateAutoscalerTLS(t *testing.T) {
	now := time.Now()
	crt, key := testCert(t)
	otherCrt, _ := testCert(t)
	s := func(kv ...[]byte) *corev1.Secret {
		d := map[string][]byte{}
		for i := 0; i+1 < len(kv); i += 2 {
			d[string(kv[i])] = kv[i+1]
		}
		return &corev1.Secret{Type: corev1.SecretTypeTLS, Data: d}
	}
	b := func(s string) []byte { return []byte(s) }
	tests := map[string]struct {
		secret  *corev1.Secret
		at      time.Time // validation time; zero: now
		wantErr string
		wantCA  bool
	}{
		"pair":                  {secret: s(b("tls.crt"), crt, b("tls.key"), key)},
		"pair and CA":           {secret: s(b("tls.crt"), crt, b("tls.key"), key, b("ca.crt"), otherCrt), wantCA: true},
		"missing":               {secret: nil, wantErr: "does not exist"},
		"neither":               {secret: s(b("ca.crt"), crt), wantErr: "missing"},
		"lone cert":             {secret: s(b("tls.crt"), crt), wantErr: "without its key"},
		"lone key":              {secret: s(b("tls.key"), key), wantErr: "without its certificate"},
		"mismatched pair":       {secret: s(b("tls.crt"), otherCrt, b("tls.key"), key), wantErr: "not a matching"},
		"garbage PEM":           {secret: s(b("tls.crt"), b("-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"), b("tls.key"), key), wantErr: "not a matching"},
		"expired":               {secret: s(b("tls.crt"), crt, b("tls.key"), key), at: now.Add(48 * time.Hour), wantErr: "expired"},
		"not yet valid":         {secret: s(b("tls.crt"), crt, b("tls.key"), key), at: now.Add(-2 * time.Hour), wantErr: "not valid before"},
		"CA does not parse":     {secret: s(b("tls.crt"), crt, b("tls.key"), key, b("ca.crt"), b("garbage")), wantErr: "ca.crt"},
		"CA is a key":           {secret: s(b("tls.crt"), crt, b("tls.key"), key, b("ca.crt"), key), wantErr: "ca.crt"},
		"CA with trailing junk": {secret: s(b("tls.crt"), crt, b("tls.key"), key, b("ca.crt"), append(append([]byte{}, otherCrt...), "junk"...)), wantErr: "ca.crt"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			at := tc.at
			if at.IsZero() {
				at = now
			}
			info, err := AutoscalerTLS(tc.secret, at)
			if tc.wantErr == "" {
				if err != nil || info.HasCA != tc.wantCA || info.NotAfter.IsZero() {
					t.Fatalf("got %+v, %v", info, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Fatal("reason leaks the key")
			}
		})
	}
}

func TestParseAPIServer(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    APIServer
		wantErr bool
	}{
		"host":           {in: "https://k8s-proxy.example.internal", want: APIServer{Host: "k8s-proxy.example.internal", Port: 443}},
		"host and port":  {in: "https://k8s-proxy.example.internal:6443", want: APIServer{Host: "k8s-proxy.example.internal", Port: 6443}},
		"trailing slash": {in: "https://proxy/", want: APIServer{Host: "proxy", Port: 443}},
		"ipv6":           {in: "https://[fd00::1]:8443", want: APIServer{Host: "fd00::1", Port: 8443}},
		"http refused":   {in: "http://proxy", wantErr: true},
		"no scheme":      {in: "proxy:443", wantErr: true},
		"path":           {in: "https://proxy/api", wantErr: true},
		"credentials":    {in: "https://u:p@proxy", wantErr: true},
		"bad port":       {in: "https://proxy:99999", wantErr: true},
		"empty":          {in: "", wantErr: true},
		"query":          {in: "https://proxy?x=1", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseAPIServer(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseAPIServer(%q) = %+v, %v", tc.in, got, err)
			}
		})
	}
}

func FuzzValidatePullSecret(f *testing.F) {
	f.Add([]byte(`{"auths":{}}`))
	f.Add([]byte(`{"auths":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, v []byte) {
		_ = PullSecret(&corev1.Secret{Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": v}})
		_ = PullSecret(&corev1.Secret{Type: corev1.SecretTypeDockercfg, Data: map[string][]byte{".dockercfg": v}})
	})
}

func FuzzValidateAutoscalerTLS(f *testing.F) {
	crt, key := testCert(f)
	f.Add(crt, key, crt)
	f.Add([]byte("x"), []byte("y"), []byte(""))
	f.Fuzz(func(t *testing.T, c, k, ca []byte) {
		_, err := AutoscalerTLS(&corev1.Secret{Data: map[string][]byte{"tls.crt": c, "tls.key": k, "ca.crt": ca}}, time.Now())
		if err != nil && len(k) > 8 && strings.Contains(err.Error(), string(k)) {
			t.Fatal("reason contains the key")
		}
	})
}

func FuzzParseAPIServer(f *testing.F) {
	f.Add("https://proxy:6443")
	f.Add("http://x")
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseAPIServer(v)
		if err == nil && (got.Host == "" || got.Port < 1 || got.Port > 65535 || strings.HasPrefix(v, "http://")) {
			t.Fatalf("accepted %q as %+v", v, got)
		}
	})
}
