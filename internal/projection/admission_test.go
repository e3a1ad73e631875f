package projection

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// admissionHarness: a controller's caches holding c1 (autoscaling), with a pull secret and the
// autoscaler's client certificate configured, plus objs.
func admissionHarness(t *testing.T, clusters []*unstructured.Unstructured, objs ...runtime.Object) *Admitter {
	t.Helper()
	crt, key := testCert(t)
	tlsSrc := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "client-tls"}
	tlsSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tlsSrc.Name, Namespace: tlsSrc.Namespace}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	cfg := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}, AutoscalerTLS: &tlsSrc, MountPath: podtemplate.DefaultTLSMountPath}}
	h := newDryRunHarness(t, false, cfg, clusters, append([]runtime.Object{pullSecretSource(), tlsSecret}, objs...)...)
	a := h.ctrl.Admitter()
	a.Wait = 50 * time.Millisecond
	return a
}

func podJSON(t *testing.T, cluster string, containers ...map[string]any) []byte {
	t.Helper()
	p := map[string]any{"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"generateName": cluster + "-head-", "labels": map[string]any{"ray.io/cluster": cluster},
			"ownerReferences": []any{map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster", "name": cluster, "uid": "uid-" + cluster, "controller": true}}},
		"spec": map[string]any{"containers": toAny(containers), "imagePullSecrets": []any{map[string]any{"name": "theirs"}}}}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func toAny(ms []map[string]any) []any {
	out := make([]any, len(ms))
	for i, m := range ms {
		out[i] = m
	}
	return out
}

func TestAdmitPod(t *testing.T) {
	head := map[string]any{"name": "ray-head", "image": "registry.example/ray:1"}
	auto := map[string]any{"name": "autoscaler", "image": "registry.example/ray:1", "env": []any{map[string]any{"name": "THEIRS", "value": "x"}}}
	tlsEnv := []any{map[string]any{"name": "THEIRS", "value": "x"},
		map[string]any{"name": podtemplate.EnvClientCertPath, "value": podtemplate.DefaultTLSMountPath + "/tls.crt"},
		map[string]any{"name": podtemplate.EnvClientKeyPath, "value": podtemplate.DefaultTLSMountPath + "/tls.key"}}
	pull := podtemplate.PatchOp{Op: "add", Path: "/spec/imagePullSecrets", Value: []any{map[string]any{"name": "theirs"}, map[string]any{"name": "regcred"}}}
	tests := map[string]struct {
		clusters   []*unstructured.Unstructured
		pod        []byte
		want       []podtemplate.PatchOp
		result     string
		wantReason string
	}{
		"autoscaling head: pull secret, volume, mount and env, theirs kept": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", autoscaling)},
			pod:      podJSON(t, "c1", head, auto),
			want: []podtemplate.PatchOp{
				{Op: "add", Path: "/spec/containers/1/env", Value: tlsEnv},
				{Op: "add", Path: "/spec/containers/1/volumeMounts", Value: []any{map[string]any{"name": names.TLSVolumeName, "mountPath": podtemplate.DefaultTLSMountPath, "readOnly": true}}},
				pull,
				{Op: "add", Path: "/spec/volumes", Value: []any{map[string]any{"name": names.TLSVolumeName, "secret": map[string]any{"secretName": "client-tls"}}}},
			},
			result: names.AdmitMutated,
		},
		"worker of a cluster without autoscaling: pull secret only": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			pod:      podJSON(t, "c1", map[string]any{"name": "ray-worker"}),
			want:     []podtemplate.PatchOp{pull}, result: names.AdmitMutated,
		},
		"cluster raysync does not know: unchanged, and why": {
			pod: podJSON(t, "gone", head), result: names.AdmitSkipped, wantReason: "RayCluster not in raysync's cache",
		},
		"cluster outside the selector's scope: left alone": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", func(u *unstructured.Unstructured) { u.SetNamespace("elsewhere") })},
			pod:      podJSON(t, "c1", head), result: names.AdmitSkipped, wantReason: "RayCluster not in raysync's cache",
		},
		"malformed pod: allowed unchanged": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			pod: []byte(`{"metadata":{"labels":{"ray.io/cluster":"c1"},"ownerReferences":[{"kind":"RayCluster","name":"c1","uid":"uid-c1","controller":true}]},
				"spec":{"containers":"nope"}}`), result: names.AdmitInvalid, wantReason: "containers is not a list",
		},
		"a pod another controller owns: left alone": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			pod:      []byte(`{"metadata":{"labels":{"ray.io/cluster":"c1"}},"spec":{"containers":[]}}`), result: names.AdmitSkipped, wantReason: "pod not controlled by its RayCluster",
		},
		"not JSON: allowed unchanged": {pod: []byte(`[`), result: names.AdmitInvalid, wantReason: "pod is not a JSON object"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := admissionHarness(t, tc.clusters)
			ops, result, reason := a.Pod(context.Background(), ns, tc.pod)
			if diff := cmp.Diff(tc.want, ops); diff != "" {
				t.Errorf("patch (-want +got):\n%s", diff)
			}
			if result != tc.result || reason != tc.wantReason {
				t.Errorf("result %s %q, want %s %q", result, reason, tc.result, tc.wantReason)
			}
		})
	}
}

// Applying the patch gives exactly what the template patch gives a template: a pod patched once is
// unchanged the second time.
func TestAdmitPodIsIdempotent(t *testing.T) {
	a := admissionHarness(t, []*unstructured.Unstructured{rayCluster("c1", autoscaling)})
	raw := podJSON(t, "c1", map[string]any{"name": "ray-head"}, map[string]any{"name": "autoscaler"})
	ops, _, _ := a.Pod(context.Background(), ns, raw)
	var pod map[string]any
	_ = json.Unmarshal(raw, &pod)
	spec := pod["spec"].(map[string]any)
	for _, op := range ops {
		switch op.Path {
		case "/spec/imagePullSecrets", "/spec/volumes":
			spec[op.Path[len("/spec/"):]] = op.Value
		default:
			spec["containers"].([]any)[1].(map[string]any)[op.Path[len("/spec/containers/1/"):]] = op.Value
		}
	}
	again, _ := json.Marshal(pod)
	if ops, result, _ := a.Pod(context.Background(), ns, again); len(ops) != 0 || result != names.AdmitUnchanged {
		t.Errorf("second admission: %v %s, want nothing", ops, result)
	}
}

func TestAdmitSecret(t *testing.T) {
	kuberays := func(cluster string) []byte {
		s := secret(ns, cluster, map[string]string{"auth_token": oldToken}, ownedBy(cluster))
		b, _ := json.Marshal(s)
		return b
	}
	tests := map[string]struct {
		clusters   []*unstructured.Unstructured
		objs       []runtime.Object
		secret     []byte
		result     string
		wantReason string
	}{
		"a new cluster's Secret: born with the canonical token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token)},
			secret: kuberays("c1"), result: names.AdmitMutated,
		},
		"re-created under pods on a node: left to KubeRay's token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token), rayPod("c1-head", "c1", onNode)},
			secret: kuberays("c1"), result: names.AdmitSkipped, wantReason: "pods reading this Secret may run on another token",
		},
		"pods created, none on a node: born with the canonical token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token), rayPod("c1-head", "c1")},
			secret: kuberays("c1"), result: names.AdmitMutated,
		},
		"source missing: KubeRay's token stays": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, secret: kuberays("c1"), result: names.AdmitSkipped, wantReason: "canonical source invalid",
		},
		"a cluster naming its own Secret: not raysync's to fill": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "c1"}))},
			objs:     []runtime.Object{sourceSecret(token)}, secret: kuberays("c1"), result: names.AdmitSkipped, wantReason: "not the cluster's generated auth Secret",
		},
		"another Secret: left alone": {
			objs: []runtime.Object{sourceSecret(token)}, secret: []byte(`{"metadata":{"name":"x"}}`), result: names.AdmitSkipped, wantReason: "not controlled by a RayCluster",
		},
		"unreadable: allowed unchanged": {secret: []byte(`{"data":7}`), result: names.AdmitInvalid, wantReason: "Secret unreadable"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := admissionHarness(t, tc.clusters, tc.objs...)
			ops, result, reason := a.Secret(context.Background(), ns, tc.secret)
			if result != tc.result || reason != tc.wantReason {
				t.Fatalf("result %s %q, want %s %q", result, reason, tc.result, tc.wantReason)
			}
			if result != names.AdmitMutated {
				if len(ops) != 0 {
					t.Errorf("patched %v", ops)
				}
				return
			}
			b, _ := json.Marshal(ops)
			var got []map[string]any
			_ = json.Unmarshal(b, &got)
			if len(got) != 2 || got[0]["path"] != "/data/auth_token" || got[1]["path"] != "/metadata/annotations" {
				t.Fatalf("patch paths: %v", got)
			}
			if v, _ := got[0]["value"].(string); v != b64(token) {
				t.Error("the patch does not carry the canonical token")
			}
			if ann := got[1]["value"].(map[string]any); ann[names.SourceAnnotation] != tokenSrc.String() {
				t.Errorf("annotations %v", ann)
			}
		})
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
