package standin

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRegistryHost(t *testing.T) {
	for image, want := range map[string]string{
		"rayproject/ray:2.52.0": "docker.io",
		"ray":                   "docker.io",
		"registry.example.internal/ml/ray:2.52.0":  "registry.example.internal",
		"registry.example.internal:5000/ray":       "registry.example.internal:5000",
		"localhost/ray":                            "localhost",
		"ghcr.io/raysync/syncer@sha256:0123456789": "ghcr.io",
	} {
		if got := registryHost(image); got != want {
			t.Errorf("registryHost(%q) = %q, want %q", image, got, want)
		}
	}
}

func TestPullNeedsCredentialsForThePrivateRegistryOnly(t *testing.T) {
	const private = "registry.example.internal"
	pullSecret := func(typ corev1.SecretType, key, body string) *corev1.Secret {
		return &corev1.Secret{Type: typ, Data: map[string][]byte{key: []byte(body)}}
	}
	objects := fakeObjects{secrets: map[string]*corev1.Secret{
		"regcred":   pullSecret(corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey, `{"auths":{"registry.example.internal":{"auth":"eDp5"}}}`),
		"url-form":  pullSecret(corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey, `{"auths":{"https://registry.example.internal/v1/":{"auth":"eDp5"}}}`),
		"dockercfg": pullSecret(corev1.SecretTypeDockercfg, corev1.DockerConfigKey, `{"registry.example.internal":{"auth":"eDp5"}}`),
		"elsewhere": pullSecret(corev1.SecretTypeDockerConfigJson, corev1.DockerConfigJsonKey, `{"auths":{"ghcr.io":{"auth":"eDp5"}}}`),
		"opaque":    pullSecret(corev1.SecretTypeOpaque, corev1.DockerConfigJsonKey, `{"auths":{"registry.example.internal":{}}}`),
	}}
	tests := map[string]struct {
		image   string
		secrets []string
		pulls   bool
	}{
		"public image, no secrets":           {"rayproject/ray:2.52.0", nil, true},
		"private image, no secrets":          {private + "/ml/ray:2.52.0", nil, false},
		"private image, its credentials":     {private + "/ml/ray:2.52.0", []string{"regcred"}, true},
		"credentials keyed by URL":           {private + "/ml/ray:2.52.0", []string{"url-form"}, true},
		"legacy dockercfg":                   {private + "/ml/ray:2.52.0", []string{"dockercfg"}, true},
		"credentials for another registry":   {private + "/ml/ray:2.52.0", []string{"elsewhere"}, false},
		"an Opaque Secret is no pull secret": {private + "/ml/ray:2.52.0", []string{"opaque"}, false},
		"missing Secret, then a good one":    {private + "/ml/ray:2.52.0", []string{"gone", "regcred"}, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}}
			for _, s := range tc.secrets {
				pod.Spec.ImagePullSecrets = append(pod.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
			}
			_, err := pullImage(context.Background(), objects, pod, tc.image, private)
			if (err == nil) != tc.pulls {
				t.Fatalf("pullImage = %v, want pulled=%v", err, tc.pulls)
			}
			if err != nil && !strings.Contains(err.Error(), "no basic auth credentials") {
				t.Errorf("error %q does not read like a registry's refusal", err)
			}
		})
	}
}
