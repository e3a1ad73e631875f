package projection

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/admission"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/metrics"
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
			pod: podJSON(t, "gone", head), result: names.AdmitSkipped, wantReason: "not controlled by a RayCluster in raysync's cache",
		},
		"cluster outside the selector's scope: left alone": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", func(u *unstructured.Unstructured) { u.SetNamespace("elsewhere") })},
			pod:      podJSON(t, "c1", head), result: names.AdmitSkipped, wantReason: "not controlled by a RayCluster in raysync's cache",
		},
		"malformed pod: allowed unchanged": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			pod: []byte(`{"metadata":{"labels":{"ray.io/cluster":"c1"},"ownerReferences":[{"kind":"RayCluster","name":"c1","uid":"uid-c1","controller":true}]},
				"spec":{"containers":"nope"}}`), result: names.AdmitInvalid, wantReason: "containers is not a list",
		},
		"a pod another controller owns: left alone": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			pod:      []byte(`{"metadata":{"labels":{"ray.io/cluster":"c1"}},"spec":{"containers":[]}}`), result: names.AdmitSkipped, wantReason: "pod not controlled by a RayCluster",
		},
		"a pod controlled by another RayCluster than its label names: left alone": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			pod:      []byte(`{"metadata":{"labels":{"ray.io/cluster":"c1"},"ownerReferences":[{"kind":"RayCluster","name":"c2","uid":"uid-c1","controller":true}]},"spec":{"containers":[]}}`),
			result:   names.AdmitSkipped, wantReason: "pod not controlled by its RayCluster",
		},
		"not JSON: allowed unchanged": {pod: []byte(`[`), result: names.AdmitInvalid, wantReason: "pod is not a JSON object with readable metadata"},
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
	written := planNow.Add(-2 * time.Hour)
	recordedCurrent := func(u *unstructured.Unstructured) {
		annotated(names.TokenRotationAnnotation, "1")(u)
		annotated(names.TokenWrittenAtAnnotation, written.Format(time.RFC3339Nano))(u)
	}
	ledgerOf := func(tokens ...string) *corev1.Secret {
		l := ledger.Ledger{}
		for _, tok := range tokens {
			l, _ = l.Observed(tokenDigest([]byte(tok)), "", planNow.Add(-3*time.Hour))
		}
		return ledger.Desired(types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "raysync-rotations"}, nil, l)
	}
	running := startedPod("c1-head", "c1", written.Add(time.Hour), headPod)
	tests := map[string]struct {
		clusters   []*unstructured.Unstructured
		objs       []runtime.Object
		secret     []byte
		dryRun     bool
		result     string
		wantReason string
		// wantAt: the created Secret's synced-at (zero: planNow's second at the latest)
		wantAt time.Time
	}{
		"a new cluster's Secret: raysync's own is created with the canonical token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token)},
			secret: kuberays("c1"), result: names.AdmitCreated,
		},
		"re-created under pods on a node: left to KubeRay's token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token), rayPod("c1-head", "c1", onNode)},
			secret: kuberays("c1"), result: names.AdmitSkipped, wantReason: "pods reading this Secret may run on another token",
		},
		"re-created under containers the RayCluster records on the current token: raysync's, with that token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", recordedCurrent)}, objs: []runtime.Object{sourceSecret(token), ledgerOf(token), running},
			secret: kuberays("c1"), result: names.AdmitCreated, wantAt: written,
		},
		"re-created under containers the RayCluster records on an earlier token: left to KubeRay's token": {
			clusters: []*unstructured.Unstructured{rayCluster("c1", recordedCurrent)}, objs: []runtime.Object{sourceSecret(token), ledgerOf(oldToken, token), running},
			secret: kuberays("c1"), result: names.AdmitSkipped, wantReason: "pods reading this Secret may run on another token",
		},
		"pods created, none on a node: raysync's own is created": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token), rayPod("c1-head", "c1")},
			secret: kuberays("c1"), result: names.AdmitCreated,
		},
		"raysync's own create passing through the webhook: nothing more (a create would call the webhook again)": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token)},
			secret: func() []byte {
				b, _ := json.Marshal(desiredGeneratedSecret(rayCluster("c1"), "c1", []byte(token), tokenSrc, planNow))
				return b
			}(), result: names.AdmitUnchanged, wantReason: "raysync's own Secret",
		},
		"raysync's pre-creation was first: nothing more": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")},
			objs:     []runtime.Object{sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"))},
			secret:   kuberays("c1"), result: names.AdmitUnchanged, wantReason: "the Secret exists already",
		},
		"a dry-run request: nothing created": {
			clusters: []*unstructured.Unstructured{rayCluster("c1")}, objs: []runtime.Object{sourceSecret(token)},
			secret: kuberays("c1"), dryRun: true, result: names.AdmitSkipped, wantReason: "dry run: raysync creates nothing",
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
			a, kube := admissionHarnessWithLedger(t, tc.clusters, tc.objs...)
			result, reason := a.Secret(context.Background(), ns, tc.secret, tc.dryRun)
			if result != tc.result || reason != tc.wantReason {
				t.Fatalf("result %s %q, want %s %q", result, reason, tc.result, tc.wantReason)
			}
			var creates []*corev1.Secret
			for _, act := range kube.Actions() {
				if c, ok := act.(clienttesting.CreateAction); ok && act.GetResource().Resource == "secrets" {
					creates = append(creates, c.GetObject().(*corev1.Secret))
				}
			}
			if tc.result != names.AdmitCreated && tc.wantReason != "the Secret exists already" {
				if len(creates) != 0 {
					t.Errorf("created %d Secrets", len(creates))
				}
				return
			}
			if len(creates) != 1 {
				t.Fatalf("%d creates, want raysync's one", len(creates))
			}
			c := creates[0]
			if !holdsToken(c, []byte(token)) || metav1.GetControllerOf(c) == nil || metav1.GetControllerOf(c).UID != "uid-c1" || c.Labels["ray.io/cluster"] != "c1" {
				t.Errorf("created %s/%s: not KubeRay's shape with the canonical token (labels %v)", c.Namespace, c.Name, c.Labels)
			}
			at := syncedAt(c)
			if tc.wantAt.IsZero() && at.Before(planNow.Add(-time.Second)) || !tc.wantAt.IsZero() && !at.Equal(tc.wantAt) {
				t.Errorf("synced-at %s, want %s", at, tc.wantAt)
			}
		})
	}
}

// admissionHarnessWithLedger is admissionHarness with the rotation ledger configured, and the fake clientset.
func admissionHarnessWithLedger(t *testing.T, clusters []*unstructured.Unstructured, objs ...runtime.Object) (*Admitter, *fake.Clientset) {
	t.Helper()
	cfg := Config{Source: tokenSrc, Ledger: types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "raysync-rotations"}}
	h := newDryRunHarness(t, false, cfg, clusters, objs...)
	a := h.ctrl.Admitter()
	a.Wait = 50 * time.Millisecond
	return a, h.kube
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// Anyone who reaches the webhook can send it a review: one forged for a pending cluster's generated
// Secret (namespace, name and UID are all a caller needs to know) gets no token bytes back, in any
// encoding, on either path.
func TestForgedReviewGetsNoToken(t *testing.T) {
	a := admissionHarness(t, []*unstructured.Unstructured{rayCluster("c1", autoscaling)}, sourceSecret(token))
	h := admission.Handler(a, metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} }), zap.NewNop())
	forged := func(path string, obj any) []byte {
		raw, _ := json.Marshal(obj)
		ar := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: "forged", Operation: admissionv1.Create, Namespace: ns, Name: "c1", Object: runtime.RawExtension{Raw: raw}}}
		b, _ := json.Marshal(ar)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(b)))
		return rec.Body.Bytes()
	}
	kuberays := secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))
	for path, obj := range map[string]any{admission.SecretsPath: kuberays, admission.PodsPath: json.RawMessage(podJSON(t, "c1", map[string]any{"name": "ray-head"}))} {
		body := forged(path, obj)
		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &out); err != nil || out.Response == nil || !out.Response.Allowed {
			t.Fatalf("%s: not an allowing review: %s", path, body)
		}
		for _, b := range [][]byte{body, out.Response.Patch} {
			for _, enc := range []string{token, b64(token), base64.RawStdEncoding.EncodeToString([]byte(token)), base64.URLEncoding.EncodeToString([]byte(token)), tokenDigest([]byte(token))} {
				if bytes.Contains(b, []byte(enc)) {
					t.Errorf("%s: the answer to a forged review carries the token (or its digest)", path)
				}
			}
		}
	}
}

// A RayJob's submitter in K8sJobMode (the default) runs the Ray image in a Job's pod that KubeRay
// names after the RayJob and gives no pull secret: the webhook gives it the pull secrets of the RayJob's
// cluster, never the autoscaler's certificate; a Job no in-scope RayJob explains, and a RayJob in
// another mode (no submitter pod), are left alone.
func TestAdmitSubmitterPod(t *testing.T) {
	job := func(name, mode string) *unstructured.Unstructured {
		spec := map[string]any{"entrypoint": "python x.py"}
		if mode != "" {
			spec["submissionMode"] = mode
		}
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayJob",
			"metadata": map[string]any{"name": name, "namespace": ns, "uid": "uid-" + name}, "spec": spec,
			"status": map[string]any{"rayClusterName": "c1"}}}
	}
	submitter := func(jobName string) []byte {
		b, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"generateName": jobName + "-", "labels": map[string]any{"batch.kubernetes.io/job-name": jobName},
				"ownerReferences": []any{map[string]any{"apiVersion": "batch/v1", "kind": "Job", "name": jobName, "uid": "uid-job", "controller": true}}},
			"spec": map[string]any{"containers": []any{map[string]any{"name": "ray-job-submitter", "image": "registry.example/ray:1"}}}})
		return b
	}
	pull := []podtemplate.PatchOp{{Op: "add", Path: "/spec/imagePullSecrets", Value: []any{map[string]any{"name": "regcred"}}}}
	for name, tc := range map[string]struct {
		job    *unstructured.Unstructured
		pod    []byte
		want   []podtemplate.PatchOp
		result string
	}{
		"the default mode: pull secrets, no certificate": {job: job("j1", ""), pod: submitter("j1"), want: pull, result: names.AdmitMutated},
		"K8sJobMode":                 {job: job("j1", "K8sJobMode"), pod: submitter("j1"), want: pull, result: names.AdmitMutated},
		"a Job no RayJob explains":   {job: job("j1", ""), pod: submitter("other"), result: names.AdmitSkipped},
		"HTTPMode: no submitter pod": {job: job("j1", "HTTPMode"), pod: submitter("j1"), result: names.AdmitSkipped},
	} {
		t.Run(name, func(t *testing.T) {
			a := admissionHarness(t, []*unstructured.Unstructured{rayCluster("c1", autoscaling), tc.job})
			ops, result, reason := a.Pod(context.Background(), ns, tc.pod)
			if diff := cmp.Diff(tc.want, ops); diff != "" || result != tc.result {
				t.Errorf("result %s (%s), patch (-want +got):\n%s", result, reason, diff)
			}
		})
	}
}
