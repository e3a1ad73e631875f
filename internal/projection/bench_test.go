package projection

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

// Benchmarks of the hot pure functions (go test -bench . ./internal/projection).

func BenchmarkValidateToken(b *testing.B) {
	s := sourceSecret(strings.Repeat("t", 44))
	for b.Loop() {
		if _, err := ValidateToken(s, "auth_token"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkTokenTargetFor(b *testing.B) {
	rc := rayCluster("ml-inference-abcde")
	for b.Loop() {
		if _, ok, _ := TokenTargetFor(rc, source); !ok {
			b.Fatal("not a target")
		}
	}
}

func BenchmarkDesiredTemplates(b *testing.B) {
	rc := templatedCluster("c", autoscaling)
	cfg := TemplateConfig{PullSecrets: []string{"regcred"}, TLS: &TLSTemplate{SecretName: "tls", MountPath: DefaultTLSMountPath, HasCA: true}}
	for b.Loop() {
		if _, changed, err := desiredTemplates(rc, cfg); err != nil || !changed {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidateAutoscalerTLS(b *testing.B) {
	crt, key := testCert(b, time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	s := &corev1.Secret{Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	for b.Loop() {
		if _, err := ValidateAutoscalerTLS(s, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStatus1000 is one scrape's worth of state over 1,000 in-sync clusters.
func BenchmarkStatus1000(b *testing.B) {
	var clusters []*unstructured.Unstructured
	objs := []runtime.Object{sourceSecret(token)}
	for i := range 1000 {
		name := fmt.Sprintf("c%04d", i)
		clusters = append(clusters, rayCluster(name))
		objs = append(objs, secret(ns, name, map[string]string{"auth_token": token}, ownedBy(name)))
	}
	h := newHarnessWith(b, Options{Source: source, Pods: PodOptions{PullSecrets: []types.NamespacedName{}}}, clusters, objs...)
	b.ResetTimer()
	for b.Loop() {
		if _, st := h.ctrl.Status(nil); len(st) != 1000 {
			b.Fatalf("%d clusters", len(st))
		}
	}
}
