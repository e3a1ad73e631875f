package standin

import (
	"context"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// fakeObjects is an objectSource over fixed Secrets and ConfigMaps.
type fakeObjects struct {
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
}

func (f fakeObjects) Secret(_ context.Context, ns, name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (f fakeObjects) ConfigMap(_ context.Context, ns, name string) (*corev1.ConfigMap, error) {
	if c, ok := f.configMaps[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func secretEnv(name, secret, key string, optional bool) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key, Optional: &optional}}}
}

func TestResolveEnvLikeTheKubelet(t *testing.T) {
	objects := fakeObjects{
		secrets: map[string]*corev1.Secret{
			"auth": {Data: map[string][]byte{"auth_token": []byte("tok")}},
			"bulk": {Data: map[string][]byte{"A": []byte("from-secret"), "B": []byte("b")}},
		},
		configMaps: map[string]*corev1.ConfigMap{"cfg": {Data: map[string]string{"mode": "token", "A": "from-configmap"}}},
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"ray.io/cluster": "c"}}}
	tests := map[string]struct {
		c       corev1.Container
		want    map[string]string
		wantErr string
	}{
		"secretKeyRef": {c: corev1.Container{Env: []corev1.EnvVar{secretEnv("RAY_AUTH_TOKEN", "auth", "auth_token", false)}},
			want: map[string]string{"RAY_AUTH_TOKEN": "tok"}},
		"missing Secret blocks the container": {c: corev1.Container{Env: []corev1.EnvVar{secretEnv("T", "nope", "auth_token", false)}},
			wantErr: `secrets "nope" not found`},
		"missing key blocks the container": {c: corev1.Container{Env: []corev1.EnvVar{secretEnv("T", "auth", "token", false)}},
			wantErr: "couldn't find key token in Secret ns/auth"},
		"optional missing Secret is unset": {c: corev1.Container{Env: []corev1.EnvVar{secretEnv("T", "nope", "k", true), {Name: "X", Value: "1"}}},
			want: map[string]string{"X": "1"}},
		"optional missing key is unset": {c: corev1.Container{Env: []corev1.EnvVar{secretEnv("T", "auth", "k", true)}},
			want: map[string]string{}},
		"configMapKeyRef": {c: corev1.Container{Env: []corev1.EnvVar{{Name: "RAY_AUTH_MODE", ValueFrom: &corev1.EnvVarSource{
			ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}, Key: "mode"}}}}},
			want: map[string]string{"RAY_AUTH_MODE": "token"}},
		"envFrom in order, env wins": {c: corev1.Container{
			EnvFrom: []corev1.EnvFromSource{
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}},
				{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "bulk"}}},
				{Prefix: "P_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "bulk"}}},
			},
			Env: []corev1.EnvVar{{Name: "B", Value: "literal"}}},
			want: map[string]string{"mode": "token", "A": "from-secret", "B": "literal", "P_A": "from-secret", "P_B": "b"}},
		"envFrom a missing Secret blocks": {c: corev1.Container{EnvFrom: []corev1.EnvFromSource{
			{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}}}}},
			wantErr: `secrets "nope" not found`},
		"envFrom an optional missing ConfigMap": {c: corev1.Container{EnvFrom: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Optional: new(true)}}}},
			want: map[string]string{}},
		"downward API": {c: corev1.Container{Env: []corev1.EnvVar{
			{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "CLUSTER", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['ray.io/cluster']"}}},
		}}, want: map[string]string{"POD": "p", "IP": "198.19.0.1", "CLUSTER": "c"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := resolveEnv(context.Background(), objects, pod, &tc.c, podNetwork{podIP: "198.19.0.1", hostIP: nodeIP})
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("env = %v, want %v", got, tc.want)
			}
		})
	}
}
