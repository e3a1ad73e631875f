package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/internal/kuberay"
)

// The reported case (KubeRay v1.6+, spec.authOptions.secretName): two standalone clusters, held by
// default, share a managed copy; after a rotation `syncer rotate` on one of them must refuse before
// marking anything (a restart could never give it the new token while the other runs on the copy), a
// hand-written request is removed, and a cluster left suspended by such a restart (as raysync before
// this fix left it) is resumed on its token with a Warning and the metric, freeing the wave.
func TestRotateNeverStrandsASharedCluster(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if !env.SupportsSecretName() {
			t.Skip("authOptions.secretName needs KubeRay v1.6+")
		}
		env.StandIn()
		ns, t1 := env.NamespaceWithToken()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "share-a", withSecretName("shared")))
		env.CreateRayCluster(rayCluster(ns, "share-b", withSecretName("shared")))
		var pods []corev1.Pod
		for _, c := range []string{"share-a", "share-b"} {
			pods = append(pods, env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+c, 2, 60*time.Second)...)
		}
		env.WaitSecret(ns, "shared", 10*time.Second, holds(t1))
		env.waitForNextSecond(pods)
		env.PutSource(ns, "ray-token", tokenData(env.NewToken()))
		s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "behind"}, 2, 30*time.Second)

		// `syncer rotate` refuses before it marks anything.
		out, code := env.rotate("--auth-source="+ns+"/ray-token", "--namespaces="+ns, ns+"/share-a")
		if code != 1 || !strings.Contains(out, "refused: raysync cannot move it: it shares the managed Secret shared") {
			t.Errorf("syncer rotate on a cluster sharing a managed copy: exit %d\n%s", code, out)
		}
		unmarked := func(c string) {
			t.Helper()
			rc := env.rayClusterNow(ns, c)
			if suspend, _, _ := unstructured.NestedBool(rc.Object, "spec", "suspend"); suspend || rc.GetAnnotations()["raysync.dev/rotate"] != "" ||
				rc.GetAnnotations()["raysync.dev/rotation-started"] != "" {
				t.Errorf("%s: suspended %v, annotations %v: a cluster raysync cannot move was marked", c, suspend, rc.GetAnnotations())
			}
		}
		time.Sleep(3 * time.Second) // a restart would start within the wave's next passes
		unmarked("share-a")
		// A request written by hand is removed, saying why.
		env.annotate(ns, "share-b", map[string]any{"raysync.dev/rotate": "by-hand"})
		env.WaitEventMessage(ns, "share-b", "RotationNotNeeded", 30*time.Second, "raysync cannot move this cluster: it shares the managed Secret shared")
		time.Sleep(3 * time.Second)
		unmarked("share-a")
		unmarked("share-b")

		// A restart raysync cannot finish (as the unfixed `syncer rotate` left share-a): once its pods
		// are gone it is resumed on the copy's token, and its slot of the wave is free again.
		env.annotateSpec(ns, "share-a", map[string]any{"raysync.dev/rotation-started": time.Now().UTC().Format(time.RFC3339),
			"raysync.dev/rotation-target": "2"}, map[string]any{"suspend": true})
		env.WaitEventMessage(ns, "share-a", "RotationAbandoned", 90*time.Second, "every pod is gone, but it shares the managed Secret shared")
		s.WaitMetric("raysync_rotations_abandoned_total", map[string]string{"reason": "cannot_move"}, 1, 10*time.Second)
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=share-a", 2, 90*time.Second)
		rc := env.rayClusterNow(ns, "share-a")
		if suspend, _, _ := unstructured.NestedBool(rc.Object, "spec", "suspend"); suspend || rc.GetAnnotations()["raysync.dev/rotation-started"] != "" ||
			rc.GetAnnotations()["raysync.dev/rotation-abandoned"] != "2" {
			t.Errorf("share-a after the abandoned restart: suspended %v, annotations %v", suspend, rc.GetAnnotations())
		}
		env.AssertStartedWith(ns, t1, "share-a", "share-b")
		for _, c := range []string{"share-a", "share-b"} {
			st, err := env.StandIn().Stats(env.ctx, ns, c)
			if err != nil {
				t.Fatal(err)
			}
			if st.JoinFailures != 0 {
				t.Errorf("%s: %d GCS join failures", c, st.JoinFailures)
			}
		}
		if v, _ := s.Metric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "rotating"}); v != 0 {
			t.Errorf("%v clusters still rotating after the restart was abandoned", v)
		}
	})
}

// annotate merges annotations into a RayCluster.
func (e *Env) annotate(ns, name string, annotations map[string]any) {
	e.annotateSpec(ns, name, annotations, nil)
}

// annotateSpec merges annotations and spec fields into a RayCluster.
func (e *Env) annotateSpec(ns, name string, annotations, spec map[string]any) {
	e.t.Helper()
	p := map[string]any{"metadata": map[string]any{"annotations": annotations}}
	if spec != nil {
		p["spec"] = spec
	}
	b, _ := json.Marshal(p)
	if _, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Patch(e.ctx, name, types.MergePatchType, b, metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("patch RayCluster %s: %v", name, err)
	}
}

// rayClusterNow reads a RayCluster from the API.
func (e *Env) rayClusterNow(ns, name string) *unstructured.Unstructured {
	e.t.Helper()
	var rc *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		rc, err = e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		e.t.Fatalf("get RayCluster %s: %v", name, err)
	}
	return rc
}

// A cluster raysync was restarting and then let go of (annotated raysync.dev/skip: out of raysync's
// scope) is resumed as it was, never left suspended: raysync's marks go, spec.suspend is cleared, and
// its pods come back on the token its Secret holds.
func TestRaysyncResumesAClusterItLetGoOf(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.StandIn()
		ns, token := env.NamespaceWithToken()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "let-go"))
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=let-go", 2, 60*time.Second)
		// As a restart raysync started would leave it, and skipped at the same moment.
		env.annotateSpec(ns, "let-go", map[string]any{"raysync.dev/rotation-started": time.Now().UTC().Format(time.RFC3339),
			"raysync.dev/rotation-target": "1", "raysync.dev/skip": "true"}, map[string]any{"suspend": true})
		env.WaitEventMessage(ns, "let-go", "RotationAbandoned", 60*time.Second, "raysync no longer manages this cluster's token")
		s.WaitMetric("raysync_rotations_abandoned_total", map[string]string{"reason": "unmanaged"}, 1, 10*time.Second)
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"=let-go", 2, 90*time.Second)
		rc := env.rayClusterNow(ns, "let-go")
		if suspend, _, _ := unstructured.NestedBool(rc.Object, "spec", "suspend"); suspend || rc.GetAnnotations()["raysync.dev/rotation-started"] != "" {
			t.Errorf("after raysync let go: suspended %v, annotations %v", suspend, rc.GetAnnotations())
		}
		env.AssertStartedWith(ns, token, "let-go")
	})
}
