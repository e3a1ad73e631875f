package admission_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"github.com/raysync/raysync/internal/admission"
	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/projection"
)

// BenchmarkHandlerPod is one whole admission request for a KubeRay head pod (decode the review and the
// pod, decide from the caches, encode the patch), with a pull secret configured: raysync's CPU per pod
// apart from TLS.
func BenchmarkHandlerPod(b *testing.B) {
	h, _ := realHandler(b)
	body := headPodReview("uid-c1")
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, admission.PodsPath, bytes.NewReader(body)))
		if rec.Code != http.StatusOK || !bytes.Contains(rec.Body.Bytes(), []byte(`"patch"`)) {
			b.Fatalf("%d %s", rec.Code, rec.Body.String())
		}
	}
}

// realHandler is the webhook's handler over a real controller's caches (fake clients), holding
// RayCluster ray/c1 (UID uid-c1) with token auth and autoscaling, and a pull secret configured.
func realHandler(tb testing.TB) (http.Handler, *metrics.Metrics) {
	src := types.NamespacedName{Namespace: "ray", Name: "ray-token"}
	pull := types.NamespacedName{Namespace: "ray", Name: "regcred"}
	kube := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ray", Name: "ray-token"}, Data: map[string][]byte{"auth_token": []byte("0123456789abcdef0123456789abcdef")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ray", Name: "regcred"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"r.example":{"auth":"dTpw"}}}`)}})
	rc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": "c1", "namespace": "ray", "uid": "uid-c1"},
		"spec":     map[string]any{"authOptions": map[string]any{"mode": "token"}, "enableInTreeAutoscaling": true}}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kuberay.ListKinds, rc)
	cfg := projection.Config{Source: src, SourceKey: "auth_token", Pods: projection.PodOptions{PullSecrets: []types.NamespacedName{pull}}}
	caches := informer.New(kube, dyn, nil, informer.Config{Namespaces: []string{"ray"}, Sources: cfg.Sources()})
	m := metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} })
	ctrl, err := projection.New(kube, dyn, caches, record.NewFakeRecorder(10), m, zap.NewNop(), cfg, false)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	caches.Start(ctx.Done())
	caches.WaitForSync(ctx.Done())
	return admission.Handler(ctrl.Admitter(), m, zap.NewNop()), m
}

// headPodReview is the review of a KubeRay head pod of ray/c1, controlled by the RayCluster of UID uid.
func headPodReview(uid types.UID) []byte {
	return podReview(headPod(uid))
}

func podReview(pod any) []byte {
	raw, _ := json.Marshal(pod)
	body, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u", Operation: admissionv1.Create, Namespace: "ray", Object: runtime.RawExtension{Raw: raw}}})
	return body
}

func headPod(uid types.UID) *corev1.Pod {
	yes := true
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{GenerateName: "c1-head-", Namespace: "ray",
		Labels:          map[string]string{"ray.io/cluster": "c1", "ray.io/node-type": "head", "app.kubernetes.io/created-by": "kuberay-operator", "ray.io/identifier": "c1-head"},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: "c1", UID: uid, Controller: &yes}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.52.0", Args: []string{"ulimit -n 65536; ray start --head --block"},
			Env: []corev1.EnvVar{{Name: "RAY_AUTH_MODE", Value: "token"}, {Name: "RAY_AUTH_TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "c1"}, Key: "auth_token"}}}}},
			{Name: "autoscaler", Image: "rayproject/ray:2.52.0"}}}}
	return pod
}
