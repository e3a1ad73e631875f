package podtemplate

import "testing"

// The template check runs for every cluster on every reconcile and scrape (go test -bench . ./internal/podtemplate).

func BenchmarkDesiredTemplates(b *testing.B) {
	rc := templatedCluster("c", autoscaling)
	cfg := Config{PullSecrets: []string{"regcred"}, TLS: &TLS{SecretName: "tls", MountPath: DefaultTLSMountPath, HasCA: true}}
	for b.Loop() {
		if _, changed, err := Desired(rc, cfg); err != nil || !changed {
			b.Fatal(err)
		}
	}
}
