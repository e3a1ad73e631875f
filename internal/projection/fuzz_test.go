package projection

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/podtemplate"
)

// FuzzPlanCluster plans RayClusters of any spec and annotations (authOptions of any shape, templates
// that are not objects, a rotation-id that is not a number…) against the target Secret, pods and
// owner shapes the planner meets: it never panics, plans the same input the same way twice, and
// never writes a Secret raysync does not own.
func FuzzPlanCluster(f *testing.F) {
	for _, seed := range []struct {
		spec, annotations string
		shape             uint8
	}{
		{`{"authOptions":{"mode":"token"}}`, `{}`, 0},
		{`{"authOptions":{"mode":"token","secretName":"shared"},"headGroupSpec":{"template":{"spec":{"containers":[{"name":"ray-head"}]}}}}`, `{}`, 9},
		{`{"authOptions":{"mode":"token"},"enableInTreeAutoscaling":true,"headGroupSpec":{"template":{"spec":{"containers":[{"name":"autoscaler"}]}}}}`, `{"raysync.dev/rotate":"now"}`, 27},
		{`{"authOptions":"token","headGroupSpec":[]}`, `{"raysync.dev/rotation-id":"x"}`, 255},
		{`{"authOptions":{"mode":"token","secretName":7},"workerGroupSpecs":[null]}`, `{"raysync.dev/rotation":"restart"}`, 42},
		{`{"authOptions":{"mode":"none"}}`, `{}`, 3},
	} {
		f.Add([]byte(seed.spec), []byte(seed.annotations), seed.shape)
	}
	tls := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "client-tls"}
	cfg := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}, AutoscalerTLS: &tls,
		MountPath: podtemplate.DefaultTLSMountPath}, Rotation: RotationOptions{Timeout: time.Hour}}.withDefaults()
	f.Fuzz(func(t *testing.T, specJSON, annotationsJSON []byte, shape uint8) {
		var spec map[string]any
		var annotations map[string]string
		if json.Unmarshal(specJSON, &spec) != nil || json.Unmarshal(annotationsJSON, &annotations) != nil {
			return
		}
		plan := func() ClusterPlan {
			rc := rayCluster("c1")
			rc.Object["spec"] = spec
			rc.SetAnnotations(annotations)
			if shape&1 != 0 {
				ofRayService("svc")(rc)
			}
			var opts []func(*ClusterInput)
			switch (shape >> 1) & 3 {
			case 1: // KubeRay's generated Secret
				opts = append(opts, target(kuberaysOld()))
			case 2: // raysync's copy on an older token
				opts = append(opts, target(secret(ns, "c1", map[string]string{"auth_token": oldToken}, managed)))
			case 3: // someone else's Secret under the target's name
				opts = append(opts, target(secret(ns, "c1", map[string]string{"auth_token": "theirs"})), foreign("c1"))
			}
			switch (shape >> 3) & 3 {
			case 1:
				opts = append(opts, pods(startedPod("c1-head", "c1", planNow.Add(-time.Hour), headPod)))
			case 2:
				opts = append(opts, pods(rayPod("c1-worker", "c1", onNode)))
			case 3:
				opts = append(opts, pods(startedPod("c1-head", "c1", planNow.Add(time.Minute))))
			}
			if shape&32 != 0 {
				opts = append(opts, withRotation)
			}
			if shape&64 != 0 {
				opts = append(opts, owner(rayService("svc")))
			}
			srcs := []*corev1.Secret{sourceSecret(token), pullSecretSource()}
			if shape&128 != 0 {
				srcs = srcs[1:] // the canonical source is missing
			}
			return planCluster(input(cfg, rc, srcs, opts...), cfg)
		}
		first, second := plan(), plan()
		a, errA := json.Marshal(first.Actions)
		b, errB := json.Marshal(second.Actions)
		if errA != nil || errB != nil || string(a) != string(b) {
			t.Fatalf("the same input planned twice differently (or not marshalable: %v, %v): %s and %s", errA, errB, actionTypes(first), actionTypes(second))
		}
		if (shape>>1)&3 != 3 {
			return
		}
		for _, act := range first.Actions {
			var name string
			switch a := act.(type) {
			case UpdateSecret:
				name = a.Secret.Name
			case ReplaceSecret:
				name = a.Old.Name
			case DeleteSecret:
				name = a.Secret.Name
			case CreateSecret:
				name = a.Secret.Name
			}
			if name == "c1" {
				t.Fatalf("writes the Secret c1, which is not raysync's: %#v", act)
			}
		}
	})
}

// actionTypes names a plan's actions (their content may hold tokens).
func actionTypes(p ClusterPlan) string {
	var out []string
	for _, a := range p.Actions {
		out = append(out, fmt.Sprintf("%T", a))
	}
	return fmt.Sprint(out)
}
