package validate

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestValidateToken(t *testing.T) {
	secret := func(typ corev1.SecretType, data map[string][]byte) *corev1.Secret {
		return &corev1.Secret{Type: typ, Data: data}
	}
	tests := map[string]struct {
		secret  *corev1.Secret
		key     string
		wantErr string // substring of the reason; "" means valid
	}{
		"valid":                   {secret: secret("", map[string][]byte{"auth_token": []byte("s3cr3t-Token_=")}), key: "auth_token"},
		"valid opaque other key":  {secret: secret(corev1.SecretTypeOpaque, map[string][]byte{"token": []byte("abc")}), key: "token"},
		"missing secret":          {secret: nil, key: "auth_token", wantErr: "does not exist"},
		"missing key":             {secret: secret("", map[string][]byte{"token": []byte("abc")}), key: "auth_token", wantErr: `key "auth_token" missing (keys present: "token")`},
		"no data":                 {secret: secret("", nil), key: "auth_token", wantErr: "keys present: none"},
		"empty":                   {secret: secret("", map[string][]byte{"auth_token": {}}), key: "auth_token", wantErr: "is empty"},
		"trailing newline":        {secret: secret("", map[string][]byte{"auth_token": []byte("abc\n")}), key: "auth_token", wantErr: "whitespace"},
		"leading space":           {secret: secret("", map[string][]byte{"auth_token": []byte(" abc")}), key: "auth_token", wantErr: "whitespace"},
		"control character":       {secret: secret("", map[string][]byte{"auth_token": []byte("ab\x00c")}), key: "auth_token", wantErr: "control characters"},
		"inner tab":               {secret: secret("", map[string][]byte{"auth_token": []byte("ab\tc")}), key: "auth_token", wantErr: "control characters"},
		"not utf-8":               {secret: secret("", map[string][]byte{"auth_token": {0xff, 0xfe, 'a'}}), key: "auth_token", wantErr: "UTF-8"},
		"exactly 4 KiB":           {secret: secret("", map[string][]byte{"auth_token": []byte(strings.Repeat("a", 4096))}), key: "auth_token"},
		"over 4 KiB":              {secret: secret("", map[string][]byte{"auth_token": []byte(strings.Repeat("a", 4097))}), key: "auth_token", wantErr: "4097 bytes"},
		"1 MiB":                   {secret: secret("", map[string][]byte{"auth_token": []byte(strings.Repeat("a", 1<<20))}), key: "auth_token", wantErr: "more than 4096"},
		"wrong type tls":          {secret: secret(corev1.SecretTypeTLS, map[string][]byte{"auth_token": []byte("abc")}), key: "auth_token", wantErr: "kubernetes.io/tls"},
		"wrong type dockerconfig": {secret: secret(corev1.SecretTypeDockerConfigJson, map[string][]byte{"auth_token": []byte("abc")}), key: "auth_token", wantErr: "dockerconfigjson"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tok, err := Token(tc.secret, tc.key)
			if tc.wantErr == "" {
				if err != nil || len(tok) == 0 {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var ise *InvalidSourceError
			if !errors.As(err, &ise) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("want InvalidSourceError containing %q, got %v", tc.wantErr, err)
			}
			if tc.secret != nil {
				if v := tc.secret.Data[tc.key]; len(v) > 0 && strings.Contains(err.Error(), string(v)) {
					t.Fatalf("reason leaks the value: %v", err)
				}
			}
		})
	}
}

// FuzzValidateToken: a token is accepted only if it round-trips byte for byte into an HTTP header
// (what Ray compares), and no rejection reason ever contains the value.
func FuzzValidateToken(f *testing.F) {
	for _, s := range []string{"abc", "", " a", "a\n", "\x00", "\xff", strings.Repeat("z", 5000)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		tok, err := Token(&corev1.Secret{Data: map[string][]byte{"k": v}}, "k")
		if err != nil {
			if len(v) >= 4 && strings.Contains(err.Error(), string(v)) {
				t.Fatalf("reason contains the value")
			}
			return
		}
		if len(tok) == 0 || len(tok) > MaxTokenBytes || strings.TrimSpace(string(tok)) != string(tok) {
			t.Fatalf("accepted an invalid token of %d bytes", len(tok))
		}
		for _, b := range tok {
			if b < 0x20 || b == 0x7f {
				t.Fatalf("accepted a control byte")
			}
		}
	})
}
