package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// TestReplacementsKubeRayWillNotStartAreGivenUpAndTheWaveGoesOn (issue 36 item 1): a KubeRay v1.6.1
// operator of its own, started with ENABLE_ZERO_DOWNTIME=false and its RayServiceIncrementalUpgrade
// gate off (the default), and raysync with one rotation slot. Of three RayServices:
//
//   - one without an upgradeStrategy: the operator's ENABLE_ZERO_DOWNTIME=false turns its upgrade off;
//   - one with NewClusterWithIncrementalUpgrade, annotated raysync.dev/rotation=replace: with the gate
//     off KubeRay reads the type as no zero-downtime upgrade;
//   - one with NewCluster, which takes precedence over the operator's variable.
//
// raysync cannot read the operator's environment or its gates. Each of the first two shows no new
// cluster, so raysync gives its replacement up after 2 minutes (RotationAbandoned, no_new_cluster)
// and holds it with the reason; neither gets a second cluster; the slot frees and the third is
// replaced. Only the operator's code decides here, so this runs on v1.6.1 alone.
func TestReplacementsKubeRayWillNotStartAreGivenUpAndTheWaveGoesOn(t *testing.T) {
	env := ownOperator(t, framework.Options{KubeRayVersion: "v1.6.1", OperatorEnv: []string{"ENABLE_ZERO_DOWNTIME=false"}})
	ns, _ := env.NamespaceWithToken()
	env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--max-concurrent-rotations=1")
	strategy := func(typ string) func(*unstructured.Unstructured) {
		return func(rs *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(rs.Object, typ, "spec", "upgradeStrategy", "type")
		}
	}
	services := map[string][]func(*unstructured.Unstructured){
		"env-off": nil,
		"incremental-gate-off": {strategy("NewClusterWithIncrementalUpgrade"), func(rs *unstructured.Unstructured) {
			rs.SetAnnotations(map[string]string{names.RotationAnnotation: names.PolicyReplace})
		}},
		"new-cluster": {strategy("NewCluster")},
	}
	env.createRayServices(ns, services)
	for name := range services {
		env.WaitRayServiceReady(ns, name, 3*time.Minute, nil)
	}
	rotated := time.Now()
	env.PutSource(ns, "ray-token", tokenData(env.NewToken()))

	// Two replacements given up (2 minutes each, one slot) and one done: within 7 minutes.
	abandoned := map[string]bool{}
	completed := false
	for deadline := time.Now().Add(7 * time.Minute); time.Now().Before(deadline) && (len(abandoned) < 2 || !completed); time.Sleep(2 * time.Second) {
		for _, e := range env.Events(ns, "raysync", names.ReasonRotationAbandoned) {
			if e.InvolvedObject.Kind == string(names.OwnerRayService) && strings.Contains(e.Message, "KubeRay started no new cluster") {
				abandoned[e.InvolvedObject.Name] = true
			}
		}
		for _, e := range env.Events(ns, "raysync", names.ReasonRotationCompleted) {
			completed = completed || e.InvolvedObject.Name == "new-cluster"
		}
	}
	t.Logf("MEASURE zero-downtime-off abandoned=%v new-cluster-completed=%v after_s=%.0f", abandoned, completed, time.Since(rotated).Seconds())
	held := map[string]bool{} // the RayCluster each held RayService keeps
	for _, e := range env.Events(ns, "raysync", names.ReasonRotationHeld) {
		if strings.Contains(e.Message, "KubeRay started no new cluster") {
			held[e.InvolvedObject.Name] = true
		}
	}
	for _, name := range []string{"env-off", "incremental-gate-off"} {
		if !abandoned[name] {
			t.Errorf("%s: no RotationAbandoned (KubeRay started no new cluster) within 7 minutes; abandoned %v", name, abandoned)
		}
		clusters := env.WaitServiceClusters(ns, name, 1, nil)
		if len(clusters) != 1 {
			t.Errorf("%s has %d clusters: KubeRay started none, raysync made none", name, len(clusters))
			continue
		}
		if !held[clusters[0].GetName()] {
			t.Errorf("%s: its cluster %s has no RotationHeld saying KubeRay started no new cluster (held: %v)", name, clusters[0].GetName(), held)
		}
	}
	if !completed {
		t.Errorf("new-cluster was not replaced within 7 minutes: the given-up replacements held the wave's slot")
	}
}

// ownOperator runs the test, in parallel, on a control plane of its own whose KubeRay operator starts
// as o says (its environment, its flags, the CRDs it needs), with the stand-in; stopped at the end.
func ownOperator(t *testing.T, o framework.Options) *Env {
	t.Helper()
	if len(controlPlanes) == 0 || controlPlanes[0].External || testing.Short() {
		t.Skip("needs the harness, to start an operator of its own")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	o.Logf = logf
	cp, err := framework.Start(ctx, o)
	cancel()
	if cp != nil {
		t.Cleanup(func() { _ = cp.Stop() })
	}
	if err != nil {
		t.Fatal(err)
	}
	env := newEnv(t, cp)
	env.StandIn()
	return env
}

// createRayServices creates a RayService (rayService, version v1) per name, each changed by its opts.
func (e *Env) createRayServices(ns string, services map[string][]func(*unstructured.Unstructured)) {
	e.t.Helper()
	for name, opts := range services {
		rs := rayService(ns, name, "v1")
		for _, o := range opts {
			o(rs)
		}
		if _, err := e.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(e.ctx, rs, metav1.CreateOptions{}); err != nil {
			e.t.Fatal(err)
		}
	}
}
