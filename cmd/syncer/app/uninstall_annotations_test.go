package app

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
)

// Uninstalling takes every annotation raysync writes off a RayCluster: the rotation marks, an abandoned
// restart's mark and the record of the token its containers run on.
func TestUninstallRemovesEveryRaysyncAnnotation(t *testing.T) {
	for _, a := range []string{"raysync.dev/rotation-abandoned", "raysync.dev/token-rotation", "raysync.dev/token-written-at"} {
		rc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
			"metadata": map[string]any{"name": "c", "namespace": "ml", "resourceVersion": "5", "annotations": map[string]any{a: "7", "theirs": "x"}}}}
		step := annotationStep(nil, kuberay.RayClusterGVR, rc, true)
		if step == nil || !strings.Contains(step.what, a) || strings.Contains(step.what, "theirs") {
			t.Errorf("%s: step %+v", a, step)
		}
	}
}
