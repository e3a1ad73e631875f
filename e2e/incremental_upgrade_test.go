package e2e

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

var (
	gatewayGVR   = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "gateways"}
	httpRouteGVR = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "httproutes"}
)

// TestIncrementalUpgradeWithTheGateOn (issue 36 item 1): KubeRay v1.6.1 with its
// RayServiceIncrementalUpgrade gate on (--feature-gates) and the Gateway API's CRDs from its Go
// module, raysync with one rotation slot, and three RayServices:
//
//   - a-incremental: NewClusterWithIncrementalUpgrade, raysync.dev/rotation=replace;
//   - b-new-cluster: NewCluster;
//   - c-incremental: NewClusterWithIncrementalUpgrade, no annotation: held with the reason, never started.
//
// (a) No Gateway controller: KubeRay's new cluster for a-incremental serves at target capacity 0 and
// no traffic moves. raysync reports it blocked with why (RotationBlocked naming the Gateway) once the
// start timeout has passed, gives its slot to b-new-cluster, which is replaced: the fleet is not held.
//
// (b) The test then plays the Gateway controller: it sets the Gateway's Accepted and Programmed
// conditions and the route's Accepted and ResolvedRefs, as a controller would. This is emulated:
// no proxy carries traffic; the weights are KubeRay's HTTPRoute. KubeRay moves the traffic step by
// step and promotes the new cluster; raysync completes the replacement. The mixed-token window (the
// route splitting Serve traffic between the old cluster, on the previous token, and the new one) and
// the time until the RayService's head Service switches (token clients) are measured.
//
// (c) The gate off is TestReplacementsKubeRayWillNotStartAreGivenUpAndTheWaveGoesOn. Only the
// operator's code decides here, so this runs on v1.6.1 alone.
func TestIncrementalUpgradeWithTheGateOn(t *testing.T) {
	env := ownOperator(t, framework.Options{KubeRayVersion: "v1.6.1", GatewayAPI: true,
		OperatorArgs: []string{"--feature-gates=RayServiceIncrementalUpgrade=true"}})
	ns, _ := env.NamespaceWithToken()
	env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--max-concurrent-rotations=1")

	incremental := func(rs *unstructured.Unstructured) {
		_ = unstructured.SetNestedMap(rs.Object, map[string]any{"type": "NewClusterWithIncrementalUpgrade", "clusterUpgradeOptions": map[string]any{
			"gatewayClassName": "emulated", "stepSizePercent": int64(25), "intervalSeconds": int64(2), "maxSurgePercent": int64(25)}}, "spec", "upgradeStrategy")
		_ = unstructured.SetNestedField(rs.Object, true, "spec", "rayClusterConfig", "enableInTreeAutoscaling")
	}
	replace := func(rs *unstructured.Unstructured) {
		rs.SetAnnotations(map[string]string{names.RotationAnnotation: names.PolicyReplace})
	}
	newCluster := func(rs *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(rs.Object, "NewCluster", "spec", "upgradeStrategy", "type")
	}
	services := map[string][]func(*unstructured.Unstructured){
		"a-incremental": {incremental, replace},
		"b-new-cluster": {newCluster},
		"c-incremental": {incremental},
	}
	env.createRayServices(ns, services)
	first := map[string]string{}
	for name := range services {
		first[name], _, _ = unstructured.NestedString(env.WaitRayServiceReady(ns, name, 3*time.Minute, nil).Object, "status", "activeServiceStatus", "rayClusterName")
	}
	rotated := time.Now()
	env.PutSource(ns, "ray-token", tokenData(env.NewToken()))

	// (a) No Gateway controller: a-incremental blocked with why, b-new-cluster replaced meanwhile.
	var blockedAt, bDoneAt time.Time
	for deadline := time.Now().Add(6 * time.Minute); time.Now().Before(deadline) && (blockedAt.IsZero() || bDoneAt.IsZero()); time.Sleep(time.Second) {
		for _, e := range env.Events(ns, "raysync", names.ReasonRotationBlocked) {
			if blockedAt.IsZero() && e.InvolvedObject.Kind == string(names.OwnerRayService) && e.InvolvedObject.Name == "a-incremental" {
				if !strings.Contains(e.Message, "no Gateway controller has accepted Gateway a-incremental-gateway and HTTPRoute a-incremental-httproute") {
					t.Errorf("a-incremental blocked without saying why: %q", e.Message)
				}
				blockedAt = time.Now()
			}
		}
		for _, e := range env.Events(ns, "raysync", names.ReasonRotationCompleted) {
			if bDoneAt.IsZero() && e.InvolvedObject.Kind == string(names.OwnerRayService) && e.InvolvedObject.Name == "b-new-cluster" {
				bDoneAt = time.Now()
			}
		}
	}
	t.Logf("MEASURE incremental-no-controller blocked_after_s=%.0f b_replaced_after_s=%.0f", blockedAt.Sub(rotated).Seconds(), bDoneAt.Sub(rotated).Seconds())
	if blockedAt.IsZero() {
		t.Fatalf("a-incremental was not reported blocked (no Gateway controller) within 6 minutes of the rotation")
	}
	if bDoneAt.IsZero() {
		t.Fatalf("b-new-cluster was not replaced within 6 minutes: the stalled incremental upgrade held the wave's only slot")
	}
	rs, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Get(env.ctx, "a-incremental", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pending, _, _ := unstructured.NestedString(rs.Object, "status", "pendingServiceStatus", "rayClusterName")
	if active, _, _ := unstructured.NestedString(rs.Object, "status", "activeServiceStatus", "rayClusterName"); active != first["a-incremental"] || pending == "" {
		t.Fatalf("a-incremental without a Gateway controller: active %q pending %q, want the old cluster active and a new one pending (%s)", active, pending, statusSummary(rs))
	}
	if w := routeWeights(t, env, ns, "a-incremental"); w[pending] != 0 {
		t.Errorf("without a Gateway controller KubeRay moved traffic: weights %v", w)
	}

	// (b) The test plays the Gateway controller (emulated: status only, no data plane).
	emulated := time.Now()
	emulateGatewayController(t, env, ns, "a-incremental")
	var mixStart, mixEnd, promoted time.Time
	var seen []int64
	for deadline := time.Now().Add(4 * time.Minute); time.Now().Before(deadline) && promoted.IsZero(); time.Sleep(100 * time.Millisecond) {
		w := routeWeights(t, env, ns, "a-incremental")
		if p, ok := w[pending]; ok {
			if len(seen) == 0 || seen[len(seen)-1] != p {
				seen = append(seen, p)
			}
			if p > 0 && mixStart.IsZero() {
				mixStart = time.Now()
			}
			if p == 100 && mixEnd.IsZero() {
				mixEnd = time.Now()
			}
		}
		rs, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Get(env.ctx, "a-incremental", metav1.GetOptions{})
		if err == nil {
			if active, _, _ := unstructured.NestedString(rs.Object, "status", "activeServiceStatus", "rayClusterName"); active == pending {
				promoted = time.Now()
			}
		}
	}
	t.Logf("MEASURE incremental-emulated-controller pending_weights=%v mixed_window_s=%.1f promoted_after_emulation_s=%.1f head_svc_switch_after_rotation_s=%.0f",
		seen, mixEnd.Sub(mixStart).Seconds(), promoted.Sub(emulated).Seconds(), promoted.Sub(rotated).Seconds())
	if promoted.IsZero() || mixStart.IsZero() || mixEnd.IsZero() {
		t.Fatalf("with the Gateway and HTTPRoute accepted, KubeRay did not move the traffic and promote the new cluster within 4 minutes (pending weights seen %v)", seen)
	}
	if !slicesHasBetween(seen, 0, 100) {
		t.Errorf("pending weights %v: want a weighted mix (a step strictly between 0 and 100) before the switch", seen)
	}
	env.WaitEventMessage(ns, "a-incremental", names.ReasonRotationCompleted, 2*time.Minute, "serving from RayCluster "+pending)

	// c-incremental: held with the reason, never started, one cluster, the first.
	env.WaitEventMessage(ns, first["c-incremental"], names.ReasonRotationHeld, 10*time.Second, "RayServiceIncrementalUpgrade gate on and a Gateway controller")
	if cs := env.WaitServiceClusters(ns, "c-incremental", 1, nil); len(cs) != 1 || cs[0].GetName() != first["c-incremental"] {
		t.Errorf("c-incremental (held) has clusters %v, want only %s", clusterNames(cs), first["c-incremental"])
	}
}

// routeWeights returns the weight of each backend cluster in KubeRay's HTTPRoute for the RayService,
// keyed by cluster name (the backends are the clusters' <cluster>-serve-svc).
func routeWeights(t *testing.T, env *Env, ns, rs string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	r, err := env.Dynamic.Resource(httpRouteGVR).Namespace(ns).Get(env.ctx, rs+"-httproute", metav1.GetOptions{})
	if err != nil {
		return out
	}
	rules, _, _ := unstructured.NestedSlice(r.Object, "spec", "rules")
	for _, rule := range rules {
		refs, _, _ := unstructured.NestedSlice(rule.(map[string]any), "backendRefs")
		for _, ref := range refs {
			m := ref.(map[string]any)
			name, _, _ := unstructured.NestedString(m, "name")
			w, _, _ := unstructured.NestedInt64(m, "weight")
			out[strings.TrimSuffix(name, "-serve-svc")] = w
		}
	}
	return out
}

// emulateGatewayController sets, as a Gateway controller would once it has programmed its data
// plane, the Gateway's Accepted and Programmed conditions and the HTTPRoute's parent status with
// Accepted and ResolvedRefs: what KubeRay waits for before it moves traffic.
func emulateGatewayController(t *testing.T, env *Env, ns, rs string) {
	t.Helper()
	now := metav1.Now().UTC().Format(time.RFC3339)
	cond := func(typ string, gen int64) map[string]any {
		return map[string]any{"type": typ, "status": "True", "reason": typ, "message": "emulated by the e2e test", "lastTransitionTime": now, "observedGeneration": gen}
	}
	gw, err := env.Dynamic.Resource(gatewayGVR).Namespace(ns).Get(env.ctx, rs+"-gateway", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("KubeRay's Gateway for %s: %v", rs, err)
	}
	_ = unstructured.SetNestedSlice(gw.Object, []any{cond("Accepted", gw.GetGeneration()), cond("Programmed", gw.GetGeneration())}, "status", "conditions")
	if _, err := env.Dynamic.Resource(gatewayGVR).Namespace(ns).UpdateStatus(env.ctx, gw, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("emulating the Gateway's status: %v", err)
	}
	route, err := env.Dynamic.Resource(httpRouteGVR).Namespace(ns).Get(env.ctx, rs+"-httproute", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("KubeRay's HTTPRoute for %s: %v", rs, err)
	}
	_ = unstructured.SetNestedSlice(route.Object, []any{map[string]any{
		"parentRef":      map[string]any{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": rs + "-gateway", "namespace": ns},
		"controllerName": "raysync.dev/e2e-emulated-gateway-controller",
		"conditions":     []any{cond("Accepted", route.GetGeneration()), cond("ResolvedRefs", route.GetGeneration())},
	}}, "status", "parents")
	if _, err := env.Dynamic.Resource(httpRouteGVR).Namespace(ns).UpdateStatus(env.ctx, route, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("emulating the HTTPRoute's status: %v", err)
	}
}

func slicesHasBetween(v []int64, lo, hi int64) bool {
	for _, x := range v {
		if x > lo && x < hi {
			return true
		}
	}
	return false
}

func clusterNames(cs []*unstructured.Unstructured) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.GetName())
	}
	return out
}
