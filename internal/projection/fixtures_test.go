package projection

import (
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/cert"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// Fixture builders shared by the package's tests.

const (
	ns       = "ray"
	token    = "canonical-token-value"
	oldToken = "kuberay-random-token"
)

var tokenSrc = types.NamespacedName{Namespace: "raysync-system", Name: "ray-token"}

// ---- fixture builders ----

func rayCluster(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	rc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": "uid-" + name, "generation": int64(1)},
		"spec":     map[string]any{"authOptions": map[string]any{"mode": "token"}},
	}}
	for _, o := range opts {
		o(rc)
	}
	return rc
}

func withAuth(auth any) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { rc.Object["spec"].(map[string]any)["authOptions"] = auth }
}

func withAnnotation(k, v string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { rc.SetAnnotations(map[string]string{k: v}) }
}

func deleting(rc *unstructured.Unstructured) {
	now := metav1.Now()
	rc.SetDeletionTimestamp(&now)
	rc.SetFinalizers([]string{"example.com/hold"})
}

func secret(namespace, name string, data map[string]string, opts ...func(*corev1.Secret)) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, ResourceVersion: "1", UID: types.UID("s-" + name)},
		Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func sourceSecret(value string) *corev1.Secret {
	return secret(tokenSrc.Namespace, tokenSrc.Name, map[string]string{"auth_token": value})
}

// ownedBy gives a Secret KubeRay's shape: label ray.io/cluster and the cluster as controller.
func ownedBy(cluster string) func(*corev1.Secret) {
	return func(s *corev1.Secret) {
		yes := true
		s.Labels = map[string]string{kuberay.ClusterLabel: cluster}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: cluster,
			UID: types.UID("uid-" + cluster), Controller: &yes, BlockOwnerDeletion: &yes}}
	}
}

func managed(s *corev1.Secret) {
	s.Labels = map[string]string{names.ManagedByLabel: names.ManagedByValue}
	s.Annotations = map[string]string{names.SourceAnnotation: tokenSrc.String(), names.KindAnnotation: string(names.KindAuthToken)}
}

func withSecretAnnotation(k, v string) func(*corev1.Secret) {
	return func(s *corev1.Secret) {
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[k] = v
	}
}

func mustSelector(t testing.TB, s string) labels.Selector {
	t.Helper()
	sel, err := labels.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func templatedCluster(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	rc := rayCluster(name)
	rc.Object["spec"].(map[string]any)["headGroupSpec"] = map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "ray-head", "image": "registry.example/ray:1"}},
	}}}
	rc.Object["spec"].(map[string]any)["workerGroupSpecs"] = []any{map[string]any{"groupName": "gpu", "template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "ray-worker", "image": "registry.example/ray:1"}},
	}}}}
	for _, o := range opts {
		o(rc)
	}
	return rc
}

func autoscaling(rc *unstructured.Unstructured) {
	rc.Object["spec"].(map[string]any)["enableInTreeAutoscaling"] = true
}

func setPath(v any, path ...string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { _ = unstructured.SetNestedField(rc.Object, v, path...) }
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

var pullSource = types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "regcred"}

func pullSecretSource() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: tokenSrc.Namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"registry.example":{"auth":"dTpw"}}}`)}}
}

// pullCopy is raysync's copy of the pull secret source in the cluster namespace, as stored (UID and
// resourceVersion set).
func pullCopy(opts ...func(*corev1.Secret)) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns, UID: "u-regcred", ResourceVersion: "3",
		Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
		Annotations: map[string]string{names.SourceAnnotation: pullSource.String(), names.KindAnnotation: string(names.KindPullSecret)}},
		Type: corev1.SecretTypeDockerConfigJson, Data: pullSecretSource().Data}
	for _, o := range opts {
		o(s)
	}
	return s
}

// unstored clears what the API server sets (for objects a fake clientset is seeded with).
func unstored(s *corev1.Secret) { s.UID, s.ResourceVersion = "", "" }

func withRV(rv string) func(*corev1.Secret) { return func(s *corev1.Secret) { s.ResourceVersion = rv } }

func rayPod(name, cluster string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), ResourceVersion: "1",
		CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Minute)),
		Labels:            map[string]string{kuberay.ClusterLabel: cluster, kuberay.NodeTypeLabel: "worker"},
		OwnerReferences:   []metav1.OwnerReference{*metav1.NewControllerRef(rayCluster(cluster), kuberay.RayClusterGVK)}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-worker"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for _, o := range opts {
		o(p)
	}
	return p
}

func running(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now())}}}}
}

func withPullSecret(p *corev1.Pod) {
	p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
}

func withLabel(k, v string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) {
		l := rc.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l[k] = v
		rc.SetLabels(l)
	}
}

func podOwnedBy(cluster string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		yes := true
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: cluster,
			UID: types.UID("uid-" + cluster), Controller: &yes, BlockOwnerDeletion: &yes}}
	}
}

func ptrTo[T any](v T) *T { return &v }

// testCert returns a PEM certificate (chain) and key valid from an hour ago for a day, made with
// client-go's certificate helpers.
func testCert(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKeyWithOptions(cert.SelfSignedCertKeyOptions{Host: "ray-autoscaler", MaxAge: 25 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}
