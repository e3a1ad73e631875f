package podtemplate

import (
	"encoding/json"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Fixture builders shared by the package's tests.

func templatedCluster(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	rc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": "ray", "uid": "uid-" + name, "generation": int64(1)},
		"spec": map[string]any{"authOptions": map[string]any{"mode": "token"},
			"headGroupSpec": map[string]any{"template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "ray-head", "image": "registry.example/ray:1"}},
			}}},
			"workerGroupSpecs": []any{map[string]any{"groupName": "gpu", "template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "ray-worker", "image": "registry.example/ray:1"}},
			}}}},
		},
	}}
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
