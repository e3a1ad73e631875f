package podtemplate

import (
	"encoding/json"
	"testing"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/validate"
)

var fuzzConfig = Config{PullSecrets: []string{"regcred", "mirror"}, TLS: (&TLS{SecretName: "client-tls",
	MountPath: "/etc/raysync/autoscaler-tls", HasCA: true, APIServer: &validate.APIServer{Host: "proxy.example", Port: 6443}}).Prepared()}

// FuzzDesired feeds any JSON as a RayCluster's spec to the template code: it never panics, and what
// Desired returns is a fixed point (planning it again changes nothing and finds nothing missing).
func FuzzDesired(f *testing.F) {
	for _, seed := range []string{
		`{"headGroupSpec":{"template":{"spec":{"containers":[{"name":"ray-head"}]}}}}`,
		`{"enableInTreeAutoscaling":true,"headGroupSpec":{"template":{"spec":{"containers":[{"name":"ray-head"},{"name":"autoscaler","env":[{"name":"X","value":"1"}]}],"imagePullSecrets":[{"name":"other"}]}}},"workerGroupSpecs":[{"template":{"spec":{"containers":[{"name":"w"}]}}}]}`,
		`{"headGroupSpec":{"template":{"spec":{"containers":"nope"}}}}`,
		`{"headGroupSpec":{"template":{"spec":{"imagePullSecrets":[{"name":"regcred"},null,7]}}},"workerGroupSpecs":[null,{"template":[]}]}`,
		`{"enableInTreeAutoscaling":"yes","headGroupSpec":{"template":{"spec":{"volumes":[{"name":"raysync-autoscaler-tls","secret":{"secretName":"x"}}],"containers":[{"name":"autoscaler","volumeMounts":7}]}}}}`,
		`{"workerGroupSpecs":{}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, specJSON []byte) {
		var spec map[string]any
		if json.Unmarshal(specJSON, &spec) != nil {
			return
		}
		rc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
			"metadata": map[string]any{"name": "c", "namespace": "ray"}, "spec": spec}}
		_, _ = Drift(rc, fuzzConfig)
		_ = SecretRefs(rc)
		desired, changed, err := Desired(rc, fuzzConfig)
		if err != nil || !changed {
			return
		}
		if _, err := MergePatch(rc, desired); err != nil {
			t.Fatalf("MergePatch of a Desired result: %v", err)
		}
		again, changedAgain, err := Desired(desired, fuzzConfig)
		if err != nil || changedAgain {
			t.Fatalf("Desired is not a fixed point: changed %v, err %v\nfirst:  %v\nsecond: %v", changedAgain, err, desired.Object, again.Object)
		}
		if missing, err := Drift(desired, fuzzConfig); err != nil || missing.Any() {
			t.Fatalf("Drift after Desired: %+v, %v", missing, err)
		}
	})
}

// FuzzPodPatch feeds any JSON as a pod to the webhook's patch code: it never panics, its patch
// applies to the pod, and the patched pod needs no further patch.
func FuzzPodPatch(f *testing.F) {
	for _, seed := range []string{
		`{"spec":{"containers":[{"name":"ray-head"}]}}`,
		`{"spec":{"containers":[{"name":"ray-head"},{"name":"autoscaler","env":[{"name":"KUBERNETES_SERVICE_HOST","value":"10.0.0.1"}],"volumeMounts":[]}],"imagePullSecrets":[{"name":"other"}],"volumes":[]}}`,
		`{"spec":{"containers":[{"name":"autoscaler","env":"x"}]}}`,
		`{"spec":{"imagePullSecrets":[null,{"name":"regcred"}],"containers":[]}}`,
		`{"spec":7}`,
	} {
		f.Add([]byte(seed), true)
	}
	f.Fuzz(func(t *testing.T, podJSON []byte, autoscaling bool) {
		var pod map[string]any
		if json.Unmarshal(podJSON, &pod) != nil {
			return
		}
		ops, err := PodPatch(pod, fuzzConfig, autoscaling)
		if err != nil || len(ops) == 0 {
			return
		}
		raw, err := json.Marshal(ops)
		if err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatch.DecodePatch(raw)
		if err != nil {
			t.Fatalf("patch does not decode: %v", err)
		}
		before, _ := json.Marshal(pod)
		after, err := patch.Apply(before)
		if err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", raw, before, err)
		}
		var patched map[string]any
		if err := json.Unmarshal(after, &patched); err != nil {
			t.Fatal(err)
		}
		if again, err := PodPatch(patched, fuzzConfig, autoscaling); err != nil || len(again) > 0 {
			t.Fatalf("patched pod still needs %v (err %v)", again, err)
		}
	})
}
