package projection

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/names"
)

func withStrategy(t string) func(*unstructured.Unstructured) {
	return setPath(t, "spec", "upgradeStrategy", "type")
}

// What raysync does per RayService upgrade strategy, before anything is marked: it starts a
// replacement only where KubeRay finishes one on its own, holds the others with the reason, and never
// lets one that cannot finish hold the fleet's wave.
func TestUpgradeStrategies(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 5, Timeout: 30 * time.Minute}}.withDefaults()
	one := func(rs *unstructured.Unstructured, clusterOpts ...func(*unstructured.Unstructured)) clusterView {
		opts := append([]func(*unstructured.Unstructured){ofRayService(rs.GetName())}, clusterOpts...)
		return view(t, cfg, rayCluster(rs.GetName()+"-x", opts...), false, owner(rs))
	}
	for name, tc := range map[string]struct {
		v       clusterView
		policy  string
		held    string // a part of the reason
		started bool
	}{
		"none given (KubeRay's NewCluster): replaced": {v: one(rayService("a")), policy: names.PolicyReplace, started: true},
		"NewCluster: replaced":                        {v: one(rayService("a", withStrategy("NewCluster"))), policy: names.PolicyReplace, started: true},
		"None: held, KubeRay starts no new cluster":   {v: one(rayService("a", withStrategy("None"))), policy: names.PolicyHold, held: "upgradeStrategy None"},
		"incremental: held, with why": {v: one(rayService("a", withStrategy(incrementalUpgrade))), policy: names.PolicyHold,
			held: "RayServiceIncrementalUpgrade gate on and a Gateway controller"},
		"incremental, replace asked for on the RayService: replaced": {v: one(rayService("a", withStrategy(incrementalUpgrade),
			annotated(names.RotationAnnotation, "replace"))), policy: names.PolicyReplace, started: true},
		"a type raysync does not know: held, never started": {v: one(rayService("a", withStrategy("BlueGreenV2"))), policy: names.PolicyHold,
			held: "which raysync does not know"},
		"a replacement abandoned for this rotation: held until syncer rotate": {v: one(rayService("a", annotated(names.RotationAbandonedAnnotation, "7"))),
			policy: names.PolicyHold, held: "KubeRay started no new cluster for rotation 7"},
	} {
		t.Run(name, func(t *testing.T) {
			r := tc.v.plan.Status.Rotation
			if r.Policy != tc.policy || !strings.Contains(r.Held, tc.held) || (tc.held == "") != (r.Held == "") {
				t.Errorf("policy %s, held %q; want %s, %q", r.Policy, r.Held, tc.policy, tc.held)
			}
			w := planWave([]clusterView{tc.v}, cfg, planNow, nil)
			if started := len(w.Actions) > 0 && w.Actions[0].(PatchRotation).Starts != ""; started != tc.started {
				t.Errorf("started %v, want %v: %v", started, tc.started, kinds(w.Actions))
			}
		})
	}
}

// A replacement whose RayService starts no new cluster (the operator started with
// ENABLE_ZERO_DOWNTIME=false, the incremental gate off, the RayService suspended) is given up after
// replacementStartTimeout, not held until --rotation-timeout blocks the fleet: the slot goes to the
// next RayService. An incremental upgrade stalled without a Gateway controller is blocked, but does
// not hold the wave back.
func TestAReplacementKubeRayDoesNotStartDoesNotHoldTheWave(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 1, Timeout: 30 * time.Minute}}.withDefaults()
	inFlight := func(name string, ago time.Duration, opts ...func(*unstructured.Unstructured)) clusterView {
		rs := rayService(name, append([]func(*unstructured.Unstructured){annotated(names.RotationStartedAnnotation, planNow.Add(-ago).Format(time.RFC3339)),
			annotated(names.RotationTargetAnnotation, "7"), setPath(name+"-x", "status", "activeServiceStatus", "rayClusterName"),
			setPath(map[string]any{names.RotationIDAnnotation: "7-1"}, "spec", "rayClusterConfig", "headGroupSpec", "template", "metadata", "annotations")}, opts...)...)
		return view(t, cfg, rayCluster(name+"-x", ofRayService(name)), false, owner(rs))
	}
	next := view(t, cfg, rayCluster("z-x", ofRayService("z")), false, owner(rayService("z")))
	t.Run("no new cluster for a minute: it waits", func(t *testing.T) {
		w := planWave([]clusterView{inFlight("a", time.Minute), next}, cfg, planNow, nil)
		if len(w.Actions) != 0 || w.InFlight != 1 {
			t.Errorf("actions %v, in flight %d", kinds(w.Actions), w.InFlight)
		}
		// And looks again when the start timeout runs out, not at --rotation-timeout (30 minutes): no
		// event may come meanwhile (e2e TestReplacementsKubeRayWillNotStart… saw none for 7 minutes).
		if want := replacementStartTimeout - time.Minute + time.Second; w.RequeueAfter != want {
			t.Errorf("requeue after %s, want %s", w.RequeueAfter, want)
		}
	})
	t.Run("no new cluster after the start timeout: abandoned, the next starts", func(t *testing.T) {
		w := planWave([]clusterView{inFlight("a", replacementStartTimeout+time.Second), next}, cfg, planNow, nil)
		want := []string{"abandon RayService a", "event RotationAbandoned a", "event RotationAbandoned a-x", "start RayService z",
			"event RotationStarted z", "event RotationStarted z-x"}
		if diff := cmp.Diff(want, kinds(w.Actions)); diff != "" {
			t.Errorf("actions (-want +got):\n%s", diff)
		}
		if p := string(w.Actions[0].(PatchRotation).Patch); !strings.Contains(p, `"raysync.dev/rotation-abandoned":"7"`) || strings.Contains(p, "rotation-started") ||
			!strings.Contains(p, `"raysync.dev/rotation-id":"7-1"`) {
			t.Errorf("abandoning patch %s: want the abandoned mark, the template's rotation-id kept, the start given up", p)
		}
	})
	// An incremental upgrade (NewClusterWithIncrementalUpgrade, gate on) in flight, and the next
	// RayService behind it with the only slot.
	incremental := func(ago time.Duration, opts ...func(*unstructured.Unstructured)) clusterView {
		return inFlight("a", ago, append([]func(*unstructured.Unstructured){withStrategy(incrementalUpgrade),
			setPath("a-new", "status", "pendingServiceStatus", "rayClusterName"),
			setPath("emulated", "spec", "upgradeStrategy", "clusterUpgradeOptions", "gatewayClassName")}, opts...)...)
	}
	serving := setPath(map[string]any{"fruit": map[string]any{"status": "RUNNING"}}, "status", "pendingServiceStatus", "applicationStatuses")
	traffic := func(pct int64) func(*unstructured.Unstructured) {
		return func(rs *unstructured.Unstructured) {
			setPath(pct, "status", "pendingServiceStatus", "targetCapacity")(rs)
			setPath(pct, "status", "pendingServiceStatus", "trafficRoutedPercent")(rs)
		}
	}
	blockedAndNext := []string{"patch RayService a", "event RotationBlocked a", "event RotationBlocked a-x", "start RayService z",
		"event RotationStarted z", "event RotationStarted z-x"}
	startsNext := []string{"start RayService z", "event RotationStarted z", "event RotationStarted z-x"}
	for name, tc := range map[string]struct {
		unit     clusterView
		want     []string
		inFlight int
		why      string
	}{
		// KubeRay raises the target capacity only once a Gateway controller accepted its Gateway and
		// HTTPRoute: the new cluster serves, nothing moves, for ever.
		"no Gateway controller: blocked, with why, its slot to the next": {unit: incremental(replacementStartTimeout+time.Second, serving),
			want: blockedAndNext, inFlight: 1, why: `no Gateway controller has accepted Gateway a-gateway and HTTPRoute a-httproute (gatewayClassName "emulated")`},
		"no Gateway controller, reported before: its slot to the next, nothing said again": {unit: incremental(10*time.Minute, serving,
			annotated(names.RotationBlockedAnnotation, "x")), want: startsNext, inFlight: 1},
		"new cluster not serving yet: it waits, holding its slot": {unit: incremental(replacementStartTimeout + time.Second), inFlight: 1},
		"traffic moving: it waits, holding its slot":              {unit: incremental(20*time.Minute, serving, traffic(40)), inFlight: 1},
		"within the start timeout, nothing moved yet: it waits":   {unit: incremental(time.Minute, serving), inFlight: 1},
		"traffic moving past --rotation-timeout: slow, blocked, its slot to the next": {unit: incremental(31*time.Minute, serving, traffic(40)),
			want: blockedAndNext, inFlight: 1, why: "moved 40% of the traffic to the new RayCluster a-new in 31m0s"},
	} {
		t.Run("incremental upgrade: "+name, func(t *testing.T) {
			w := planWave([]clusterView{tc.unit, next}, cfg, planNow, nil)
			if diff := cmp.Diff(tc.want, kinds(w.Actions), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("actions (-want +got):\n%s", diff)
			}
			if w.Blocked || w.InFlight != tc.inFlight {
				t.Errorf("blocked %v, in flight %d: want the wave going on with %d in flight", w.Blocked, w.InFlight, tc.inFlight)
			}
			if tc.why != "" {
				if msg := w.Actions[1].(RecordEvent).Message; !strings.Contains(msg, tc.why) || !strings.Contains(msg, "Its slot goes to the next unit") {
					t.Errorf("blocked message %q: want %q and that its slot goes on", msg, tc.why)
				}
			}
		})
	}
	t.Run("a suspended RayService: not started", func(t *testing.T) {
		v := view(t, cfg, rayCluster("s-x", ofRayService("s")), false, owner(rayService("s", setPath(true, "spec", "suspend"))))
		if w := planWave([]clusterView{v}, cfg, planNow, nil); len(w.Actions) != 0 {
			t.Errorf("started a replacement of a suspended RayService: %v", kinds(w.Actions))
		}
	})
}
