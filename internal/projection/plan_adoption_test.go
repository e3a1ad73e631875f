package projection

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/names"
)

// fleetView is a cluster of a fleet that ran before raysync: running for hours on KubeRay's own
// token (no mark of raysync's), the current rotation 7 numbered, and no operator decision unless opts
// make one.
func fleetView(t *testing.T, cfg Config, rc *unstructured.Unstructured, opts ...func(*ClusterInput)) clusterView {
	t.Helper()
	tgt := secret(ns, rc.GetName(), map[string]string{"auth_token": oldToken + "-kuberay"}, ownedBy(rc.GetName()))
	tgt.OwnerReferences[0].UID = rc.GetUID()
	all := append([]func(*ClusterInput){target(tgt), pods(startedPod(rc.GetName()+"-head", rc.GetName(), planNow.Add(-5*time.Hour), headPod)),
		withRotation, notAdoptedByAll}, opts...)
	in := input(cfg, rc, []*corev1.Secret{sourceSecret(token)}, all...)
	return clusterView{in: in, plan: planCluster(in, cfg)}
}

func unadoptedService(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	rs := rayService(name, opts...)
	a := rs.GetAnnotations()
	delete(a, names.AdoptedAnnotation)
	rs.SetAnnotations(a)
	return rs
}

func adoptsNamespaces(all bool, namespaces ...string) func(*ClusterInput) {
	return func(in *ClusterInput) {
		in.Sources.control.adoptAll = all
		in.Sources.control.adopt = map[string]bool{}
		for _, n := range namespaces {
			in.Sources.control.adopt[n] = true
		}
	}
}

// What adopts a cluster that runs on a token raysync did not write: only an operator's decision, or
// what raysync itself did. Every case from the objects alone.
func TestAdoptionOfAClusterThatRanBeforeRaysync(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	svcCluster := func(rs *unstructured.Unstructured, opts ...func(*unstructured.Unstructured)) (*unstructured.Unstructured, func(*ClusterInput)) {
		return rayCluster("svc-a", append([]func(*unstructured.Unstructured){ofRayService(rs.GetName())}, opts...)...), owner(rs)
	}
	for name, tc := range map[string]struct {
		rc      *unstructured.Unstructured
		opts    []func(*ClusterInput)
		state   string
		invalid bool
	}{
		"nothing adopts it: not adopted":        {rc: rayCluster("c1"), state: names.TokenNotAdopted},
		"raysync.dev/adopt=true on the cluster": {rc: rayCluster("c1", annotated(names.AdoptAnnotation, "true")), state: names.TokenBehind},
		"raysync.dev/adopt=false":               {rc: rayCluster("c1", annotated(names.AdoptAnnotation, "false")), state: names.TokenNotAdopted},
		"raysync.dev/adopt=yes: reported, not adopted": {rc: rayCluster("c1", annotated(names.AdoptAnnotation, "yes")), state: names.TokenNotAdopted,
			invalid: true},
		"its namespace in the control ConfigMap": {rc: rayCluster("c1"), opts: []func(*ClusterInput){adoptsNamespaces(false, ns)}, state: names.TokenBehind},
		"another namespace in the control ConfigMap": {rc: rayCluster("c1"), opts: []func(*ClusterInput){adoptsNamespaces(false, "elsewhere")},
			state: names.TokenNotAdopted},
		"every namespace in the control ConfigMap": {rc: rayCluster("c1"), opts: []func(*ClusterInput){adoptsNamespaces(true)}, state: names.TokenBehind},
		"raysync wrote its Secret once (born while raysync ran)": {rc: rayCluster("c1"), state: names.TokenBehind,
			opts: []func(*ClusterInput){func(in *ClusterInput) { marked(oldToken, planNow.Add(-6*time.Hour))(in.Target) }}},
		"raysync recorded its token on the RayCluster": {rc: rayCluster("c1", recorded(6, planNow.Add(-6*time.Hour))), state: names.TokenBehind},
		"a restart raysync abandoned before":           {rc: rayCluster("c1", annotated(names.RotationAbandonedAnnotation, "6")), state: names.TokenBehind},
		"the cluster runs on the current token: nothing to adopt": {rc: rayCluster("c1"), state: names.TokenCurrent,
			opts: []func(*ClusterInput){func(in *ClusterInput) { in.Target.Data["auth_token"] = []byte(token) }}},
	} {
		t.Run(name, func(t *testing.T) {
			v := fleetView(t, cfg, tc.rc, tc.opts...)
			if got := v.plan.Status.Rotation.State; got != tc.state {
				t.Errorf("state %s, want %s", got, tc.state)
			}
			if got := len(v.plan.Status.Rotation.Invalid) > 0; got != tc.invalid {
				t.Errorf("invalid annotations reported %v, want %v", v.plan.Status.Rotation.Invalid, tc.invalid)
			}
			var events []string
			for _, a := range v.plan.Actions {
				if e, ok := a.(RecordEvent); ok {
					events = append(events, e.Type+" "+e.Reason)
				}
			}
			var want []string
			if tc.invalid {
				want = append(want, "Warning "+names.ReasonInvalidAnnotation)
			}
			if tc.state == names.TokenNotAdopted {
				want = append(want, "Normal "+names.ReasonNotAdopted)
			}
			if diff := cmp.Diff(want, events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
	t.Run("RayService clusters", func(t *testing.T) {
		for name, tc := range map[string]struct {
			rs    *unstructured.Unstructured
			state string
		}{
			"a RayService nobody adopted":                          {rs: unadoptedService("svc"), state: names.TokenNotAdopted},
			"raysync.dev/adopt=true on the RayService":             {rs: unadoptedService("svc", annotated(names.AdoptAnnotation, "true")), state: names.TokenBehind},
			"raysync adopted the RayService (raysync.dev/adopted)": {rs: rayService("svc"), state: names.TokenBehind},
			"raysync replaced its cluster before (rotation-id)": {rs: unadoptedService("svc",
				setPath(map[string]any{names.RotationIDAnnotation: "6-1"}, "spec", "rayClusterConfig", "headGroupSpec", "template", "metadata", "annotations")),
				state: names.TokenBehind},
		} {
			t.Run(name, func(t *testing.T) {
				rc, o := svcCluster(tc.rs)
				v := fleetView(t, cfg, rc, o)
				if got := v.plan.Status.Rotation.State; got != tc.state {
					t.Errorf("state %s, want %s", got, tc.state)
				}
				if tc.state == names.TokenNotAdopted {
					for _, a := range v.plan.Actions {
						if e, ok := a.(RecordEvent); ok && e.Reason == names.ReasonNotAdopted && !strings.Contains(e.Message, "Adopting it would replace it") {
							t.Errorf("NotAdopted does not say what adopting would do: %s", e.Message)
						}
					}
				}
			})
		}
	})
}

// Installing raysync into a running fleet moves nothing: three RayServices, two RayClusters and a
// RayJob's cluster on KubeRay's tokens, the default policies (RayServices replace) and a new rotation
// numbered: the wave starts nothing, writes nothing but its record of what it adopted (nothing), and a
// rotation of the source adopts nothing. Adopting one RayService moves exactly it, paced; adopting its
// namespace moves every RayService there, at most MaxConcurrent at a time.
func TestAdoptionIsADecisionNeverASideEffectOfInstalling(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 2}}.withDefaults()
	fleet := func(opts ...func(*ClusterInput)) []clusterView {
		var out []clusterView
		for _, s := range []string{"a", "b", "c"} {
			rs := unadoptedService("svc-" + s)
			if s == "a" {
				rs = unadoptedService("svc-a", annotated(names.AdoptAnnotation, "true"))
			}
			out = append(out, fleetView(t, cfg, rayCluster("svc-"+s+"-x", ofRayService(rs.GetName())), append([]func(*ClusterInput){owner(rs)}, opts...)...))
		}
		out = append(out, fleetView(t, cfg, rayCluster("standalone-1"), opts...), fleetView(t, cfg, rayCluster("standalone-2"), opts...))
		job := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayJob",
			"metadata": map[string]any{"name": "job", "namespace": ns, "uid": "uid-job"}, "status": map[string]any{"jobDeploymentStatus": "Running"}}}
		out = append(out, fleetView(t, cfg, rayCluster("job-x", annotated(names.RotationAnnotation, "restart"), func(u *unstructured.Unstructured) {
			setPath(string(names.OwnerRayJob), "metadata", "labels", "ray.io/originated-from-crd")(u)
			setPath("job", "metadata", "labels", "ray.io/originated-from-cr-name")(u)
		}), append([]func(*ClusterInput){owner(job)}, opts...)...))
		return out
	}
	t.Run("installed with the defaults: only the adopted RayService moves", func(t *testing.T) {
		w := planWave(fleet(), cfg, planNow, nil)
		want := []string{"patch RayService svc-a", "start RayService svc-a", "event RotationStarted svc-a", "event RotationStarted svc-a-x"}
		if diff := cmp.Diff(want, kinds(w.Actions)); diff != "" {
			t.Errorf("actions (-want +got):\n%s", diff)
		}
	})
	t.Run("nothing adopted: nothing at all", func(t *testing.T) {
		views := fleet()
		views = views[1:] // svc-a, the one adopted, is not there
		if w := planWave(views, cfg, planNow, nil); len(w.Actions) != 0 || w.InFlight != 0 {
			t.Errorf("the wave acted on a fleet nobody adopted: %v", kinds(w.Actions))
		}
	})
	t.Run("its namespace adopted: every RayService, two at a time; the held policies stay held", func(t *testing.T) {
		w := planWave(fleet(adoptsNamespaces(false, ns)), cfg, planNow, nil)
		want := []string{"patch RayService svc-a", "patch RayService svc-b", "patch RayService svc-c",
			"start RayService svc-a", "event RotationStarted svc-a", "event RotationStarted svc-a-x",
			"start RayService svc-b", "event RotationStarted svc-b", "event RotationStarted svc-b-x"}
		if diff := cmp.Diff(want, kinds(w.Actions)); diff != "" {
			t.Errorf("actions (-want +got):\n%s", diff)
		}
		for _, a := range w.Actions[:3] {
			if p := string(a.(PatchRotation).Patch); !strings.Contains(p, names.AdoptedAnnotation) || strings.Contains(p, "rotation-started") {
				t.Errorf("the record of adoption is not only that: %s", p)
			}
		}
	})
}

// The emergency stop: while the control ConfigMap says paused, no replacement or restart starts, on any
// replica (it is read from the object), and a unit in flight goes on to its end, never left suspended;
// resumed, the wave goes on where it stopped.
func TestPausedWaveStartsNothingAndFinishesWhatIsInFlight(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 5, Timeout: time.Hour}}.withDefaults()
	paused := func(in *ClusterInput) { in.Sources.control.paused = true }
	started := planNow.Add(-time.Minute).Format(time.RFC3339)
	views := func(opts ...func(*ClusterInput)) []clusterView {
		inFlight := rayService("svc-a", annotated(names.RotationStartedAnnotation, started), annotated(names.RotationTargetAnnotation, "7"),
			setPath("svc-a-new", "status", "activeServiceStatus", "rayClusterName"),
			setPath(map[string]any{names.RotationIDAnnotation: "7-1"}, "spec", "rayClusterConfig", "headGroupSpec", "template", "metadata", "annotations"))
		done := rayCluster("svc-a-new", ofRayService("svc-a"), func(u *unstructured.Unstructured) { u.SetCreationTimestamp(metav1.NewTime(planNow)) })
		return []clusterView{
			view(t, cfg, done, true, append([]func(*ClusterInput){owner(inFlight)}, opts...)...),
			view(t, cfg, rayCluster("svc-b-x", ofRayService("svc-b")), false, append([]func(*ClusterInput){owner(rayService("svc-b"))}, opts...)...),
			view(t, cfg, restartCluster("c1"), false, opts...),
		}
	}
	w := planWave(views(paused), cfg, planNow, nil)
	want := []string{"complete RayService svc-a", "event RotationCompleted svc-a", "event RotationCompleted svc-a-new"}
	if diff := cmp.Diff(want, kinds(w.Actions)); diff != "" {
		t.Errorf("paused: actions (-want +got):\n%s", diff)
	}
	if !w.Paused || w.Held != 2 {
		t.Errorf("paused %v, held %d: want true, 2", w.Paused, w.Held)
	}
	w = planWave(views(), cfg, planNow, nil)
	want = append(want, "start RayCluster c1", "event RotationStarted c1",
		"start RayService svc-b", "event RotationStarted svc-b", "event RotationStarted svc-b-x")
	if diff := cmp.Diff(want, kinds(w.Actions)); diff != "" {
		t.Errorf("resumed: actions (-want +got):\n%s", diff)
	}
}

// A value raysync cannot read never falls back to the default policy silently: a RayService annotated
// to be held, with a typo, is held (the safest), and the Event says so.
func TestAnInvalidRotationAnnotationIsHeldAndReported(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	v := view(t, cfg, rayCluster("svc-x", ofRayService("svc"), annotated(names.RotationAnnotation, "hodl")), false, owner(rayService("svc")))
	r := v.plan.Status.Rotation
	if r.Policy != names.PolicyHold || len(r.Invalid) != 1 || !strings.Contains(r.Invalid[0], `"hodl"`) {
		t.Errorf("policy %s, invalid %v: want hold, and the value reported", r.Policy, r.Invalid)
	}
	if w := planWave([]clusterView{v}, cfg, planNow, nil); len(w.Actions) != 0 {
		t.Errorf("the wave moved a cluster whose policy it cannot read: %v", kinds(w.Actions))
	}
	found := false
	for _, a := range v.plan.Actions {
		if e, ok := a.(RecordEvent); ok && e.Reason == names.ReasonInvalidAnnotation && e.Type == corev1.EventTypeWarning &&
			strings.Contains(e.Message, "read as hold, the safest") {
			found = true
		}
	}
	if !found {
		t.Errorf("no InvalidAnnotation Warning saying what raysync applied: %v", v.plan.Actions)
	}
}

// TestAnInvalidSkipIsReadAsFalseAndReported: raysync.dev/skip is "true" (raysync leaves the cluster
// alone) or "false"; any other value is read as false, what raysync read before it said so, and is
// reported in the status (rotation or not), by a Warning Event and in raysync_invalid_annotations.
func TestAnInvalidSkipIsReadAsFalseAndReported(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	for name, tc := range map[string]struct {
		value    string
		token    bool // the cluster uses token auth
		inScope  bool
		reported bool
	}{
		"true: left alone":                      {value: "true", token: true},
		"false: managed":                        {value: "false", token: true, inScope: true},
		"yes: managed, and said":                {value: "yes", token: true, inScope: true, reported: true},
		"True: managed, and said":               {value: "True", token: true, inScope: true, reported: true},
		"empty: managed":                        {value: "", token: true, inScope: true},
		"yes without token auth: managed, said": {value: "yes", inScope: true, reported: true},
	} {
		t.Run(name, func(t *testing.T) {
			opts := []func(*unstructured.Unstructured){annotated(names.SkipAnnotation, tc.value)}
			if !tc.token {
				opts = append(opts, func(u *unstructured.Unstructured) { delete(u.Object["spec"].(map[string]any), "authOptions") })
			}
			rc := rayCluster("c1", opts...)
			if got := cfg.InScope(rc); got != tc.inScope {
				t.Fatalf("in scope %v, want %v", got, tc.inScope)
			}
			if !tc.inScope {
				return
			}
			in := input(cfg, rc, []*corev1.Secret{sourceSecret(token)})
			p := planCluster(in, cfg)
			if (p.Status.Rotation != nil) != tc.token {
				t.Fatalf("rotation status %v with token auth %v", p.Status.Rotation, tc.token)
			}
			got := p.Status.InvalidAnnotations()
			if tc.reported != (len(got) == 1 && strings.Contains(got[0], names.SkipAnnotation+` "`+tc.value+`"`) && strings.Contains(got[0], "read as false")) || (!tc.reported && len(got) > 0) {
				t.Errorf("status says %q, want reported: %v", got, tc.reported)
			}
			events := 0
			for _, a := range p.Actions {
				if e, ok := a.(RecordEvent); ok && e.Reason == names.ReasonInvalidAnnotation && e.Type == corev1.EventTypeWarning &&
					strings.Contains(e.Message, "read as false") {
					events++
				}
			}
			if want := map[bool]int{true: 1}[tc.reported]; events != want {
				t.Errorf("%d InvalidAnnotation Warnings, want %d: %v", events, want, kinds(p.Actions))
			}
		})
	}
}

// raysync.dev/rotate is a request; "false" reads like a setting that turns rotation off. It is
// reported (status, one Warning) as no request, on a cluster with a token and on one without.
func TestRotateFalseIsReportedAsNoRequest(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	for name, tc := range map[string]struct {
		value    string
		token    bool
		reported bool
	}{
		"false":                    {value: "false", token: true, reported: true},
		"false without token auth": {value: "false", reported: true},
		"now":                      {value: "now", token: true},
		"a time, as syncer rotate": {value: "2026-12-07T10:00:00Z", token: true},
	} {
		t.Run(name, func(t *testing.T) {
			opts := []func(*unstructured.Unstructured){annotated(names.RotateAnnotation, tc.value)}
			if !tc.token {
				opts = append(opts, func(u *unstructured.Unstructured) { delete(u.Object["spec"].(map[string]any), "authOptions") })
			}
			rc := rayCluster("c1", opts...)
			if rotateRequested(rc) == tc.reported {
				t.Errorf("%q read as a request: %v", tc.value, rotateRequested(rc))
			}
			p := planCluster(input(cfg, rc, []*corev1.Secret{sourceSecret(token)}), cfg)
			got := p.Status.InvalidAnnotations()
			if tc.reported != (len(got) == 1 && strings.Contains(got[0], names.RotateAnnotation+` "false" requests nothing`)) || (!tc.reported && len(got) > 0) {
				t.Errorf("status says %q, want reported: %v", got, tc.reported)
			}
			events := 0
			for _, a := range p.Actions {
				if e, ok := a.(RecordEvent); ok && e.Reason == names.ReasonInvalidAnnotation && strings.Contains(e.Message, "requests nothing") {
					events++
				}
			}
			if want := map[bool]int{true: 1}[tc.reported]; events != want {
				t.Errorf("%d InvalidAnnotation Warnings, want %d: %v", events, want, kinds(p.Actions))
			}
		})
	}
}

// The control ConfigMap, value by value: what cannot be read is read the safe way, and said.
func TestReadControl(t *testing.T) {
	for name, tc := range map[string]struct {
		data     map[string]string
		paused   bool
		all      bool
		adopts   []string
		problems int
	}{
		"absent keys: nothing":           {},
		"paused":                         {data: map[string]string{"paused": "true", "reason": "wrong token"}, paused: true},
		"paused: yes is read as paused":  {data: map[string]string{"paused": "yes"}, paused: true, problems: 1},
		"adopt all":                      {data: map[string]string{"adopt": "all"}, all: true},
		"adopt two namespaces":           {data: map[string]string{"adopt": "ml-team, batch\nserving"}, adopts: []string{"ml-team", "batch", "serving"}},
		"a name that is no namespace":    {data: map[string]string{"adopt": "ml-team,Not_A_Namespace"}, adopts: []string{"ml-team"}, problems: 1},
		"paused-at unreadable: ignored":  {data: map[string]string{"paused": "true", "paused-at": "yesterday"}, paused: true, problems: 1},
		"paused false with a stale time": {data: map[string]string{"paused": "false", "paused-at": "yesterday"}},
	} {
		t.Run(name, func(t *testing.T) {
			c := readControl(&corev1.ConfigMap{Data: tc.data})
			if c.paused != tc.paused || c.adoptAll != tc.all || len(c.problems) != tc.problems {
				t.Errorf("paused %v all %v problems %q; want %v %v %d", c.paused, c.adoptAll, c.problems, tc.paused, tc.all, tc.problems)
			}
			for _, n := range tc.adopts {
				if !c.adopts(n) {
					t.Errorf("%s not adopted", n)
				}
			}
			if !tc.all && c.adopts("other") {
				t.Error("a namespace not listed is adopted")
			}
		})
	}
	if c := readControl(nil); c.paused || c.adoptAll {
		t.Errorf("no ConfigMap: %+v", c)
	}
}

// A control ConfigMap raysync cannot list (a new binary with an earlier release's Roles, say) does not
// keep raysync from becoming ready, and is read as paused, saying why: an emergency stop raysync
// cannot see is never missed, and nothing else stops.
func TestAnUnreadableControlConfigMapReadsAsPaused(t *testing.T) {
	cfg := Config{Source: tokenSrc, Prune: true, Control: types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "raysync-control"}}
	h := buildHarness(t, false, cfg, nil, func(kube *fake.Clientset) {
		kube.PrependReactor("list", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource("configmaps"), "raysync-control", errors.New("no Role"))
		})
	}, sourceSecret(token))
	if h.ctrl.caches.ControlReadable() {
		t.Fatal("the control ConfigMap reads as readable")
	}
	c := h.ctrl.reporter.Control()
	if !c.Paused || len(c.Problems) != 1 || !strings.Contains(c.Problems[0], "cannot read the control ConfigMap") {
		t.Errorf("control %+v: want paused, and why", c)
	}
	if !h.ctrl.Snapshot().Paused {
		t.Error("raysync_rotation_paused is not 1")
	}
}
