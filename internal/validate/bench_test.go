package validate

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Validation runs on every reconcile and every scrape (go test -bench . ./internal/validate).

func BenchmarkValidateToken(b *testing.B) {
	s := &corev1.Secret{Data: map[string][]byte{"auth_token": []byte(strings.Repeat("t", 44))}}
	for b.Loop() {
		if _, err := Token(s, "auth_token"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidateAutoscalerTLS(b *testing.B) {
	crt, key := testCert(b)
	s := &corev1.Secret{Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	for b.Loop() {
		if _, err := AutoscalerTLS(s, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}
