package projection

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// The rotation tests: where a cluster stands with its token, and what the wave does about it.

var rotated = ledger.Rotation{ID: 7, Digest: tokenDigest([]byte(token)), FirstSeen: planNow.Add(-3 * time.Hour)}

// withRotation gives the input the ledger's current rotation (the canonical token is rotation 7).
func withRotation(in *ClusterInput) { in.Sources.rotation = rotated }

func startedPod(name, cluster string, at time.Time, opts ...func(*corev1.Pod)) *corev1.Pod {
	return rayPod(name, cluster, append([]func(*corev1.Pod){func(p *corev1.Pod) {
		p.CreationTimestamp = metav1.NewTime(at)
		p.Status.Phase = corev1.PodRunning
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker",
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at)}}}}
	}}, opts...)...)
}

func headPod(p *corev1.Pod) {
	p.Labels[kuberay.NodeTypeLabel] = "head"
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
}

func ofRayService(svc string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) {
		rc.SetLabels(map[string]string{kuberay.OriginatedFromCRDLabel: "RayService", kuberay.OriginatedFromNameLabel: svc})
	}
}

func rayService(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	// raysync adopted it a day ago (TestAdoption* start from RayServices it did not).
	rs := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": name, "namespace": ns, "uid": "uid-" + name, "resourceVersion": "4",
			"annotations": map[string]any{names.AdoptedAnnotation: adoptedAt}},
		"spec": map[string]any{}, "status": map[string]any{}}}
	for _, o := range opts {
		o(rs)
	}
	return rs
}

// adoptedAt is when raysync adopted the fixtures' RayServices.
var adoptedAt = planNow.Add(-24 * time.Hour).Format(time.RFC3339)

func owner(o *unstructured.Unstructured) func(*ClusterInput) {
	return func(in *ClusterInput) { in.Owner = o }
}

func annotated(k, v string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		a := u.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}
		a[k] = v
		u.SetAnnotations(a)
	}
}

func onNode(p *corev1.Pod) { p.Spec.NodeName = "node-1" }

// watchingSince: raysync began acting on its caches at t.
func watchingSince(t time.Time) func(*ClusterInput) {
	return func(in *ClusterInput) { in.WatchingSince = t }
}

func pulling(p *corev1.Pod) {
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}}}
}

// kuberaysOld and kuberaysNew are KubeRay's generated Secret, created 10 s and 100 ms before planNow.
func kuberaysOld() *corev1.Secret { return kuberaysAt(planNow.Add(-10 * time.Second)) }
func kuberaysNew() *corev1.Secret { return kuberaysAt(planNow.Add(-100 * time.Millisecond)) }

func kuberaysAt(t time.Time) *corev1.Secret {
	return secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"), func(s *corev1.Secret) { s.CreationTimestamp = metav1.NewTime(t) })
}

func TestTokenNeverChangesUnderRunningContainers(t *testing.T) {
	cfg := Config{Source: tokenSrc}
	old := func() *corev1.Secret {
		return secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"), withSecretAnnotation(names.TokenSHA256Annotation, "0123456789abcdef"))
	}
	running := startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)
	// Someone replaced the token in a Secret raysync had written the current token into (its mark says so).
	changedUnder := func(written time.Time) *corev1.Secret {
		return secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"), withSecretAnnotation(names.TokenSHA256Annotation, rotated.Digest),
			withSecretAnnotation(names.SyncedAtAnnotation, written.UTC().Format(time.RFC3339Nano)))
	}
	tests := map[string]struct {
		rc          *unstructured.Unstructured
		opts        []func(*ClusterInput)
		wantWrites  bool
		wantState   string
		wantPolicy  string
		wantHeld    string
		wantTarget  string // names.State* of the auth_token target
		wantCreates bool
	}{
		"running on an older token: the Secret stays, the cluster is behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(old()), pods(running)},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		"no container started: the new token at once": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(old()), pods(rayPod("c1-head", "c1"))},
			wantWrites: true, wantState: names.TokenCurrent, wantPolicy: names.PolicyHold, wantTarget: names.StateOutOfSync,
		},
		"KubeRay's token for seconds, pods on a node the kubelet has said nothing of: may have been read, behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberaysOld()), pods(rayPod("c1-head", "c1", onNode))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		"KubeRay's token for seconds, every container still pulling its image: written": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberaysOld()), pods(rayPod("c1-head", "c1", onNode, pulling))},
			wantWrites: true, wantState: names.TokenCurrent, wantPolicy: names.PolicyHold, wantTarget: names.StateOutOfSync,
		},
		"KubeRay's token just created, pod on a node: written (the new-cluster race)": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberaysNew()), pods(rayPod("c1-head", "c1", onNode))},
			wantWrites: true, wantState: names.TokenCurrent, wantPolicy: names.PolicyHold, wantTarget: names.StateOutOfSync,
		},
		"KubeRay's token just created, but before raysync was watching, pod on a node: may have been read, behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberaysNew()), pods(rayPod("c1-head", "c1", onNode)), watchingSince(planNow.Add(-50 * time.Millisecond))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		"KubeRay's token from before raysync was watching, no pod on a node: written": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberaysNew()), pods(rayPod("c1-head", "c1")), watchingSince(planNow)},
			wantWrites: true, wantState: names.TokenCurrent, wantPolicy: names.PolicyHold, wantTarget: names.StateOutOfSync,
		},
		"an earlier canonical token, pod on a node the kubelet has said nothing of: may have been read, behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(old()), pods(rayPod("c1-head", "c1", onNode))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		// Which token running containers hold is derived from durable state (the target's mark of what
		// raysync wrote and when, the containers' start times), never from process memory.
		"Secret changed under containers started after raysync wrote the current token: put back": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(changedUnder(rotated.FirstSeen)), pods(startedPod("c1-head", "c1", rotated.FirstSeen.Add(time.Hour), headPod))},
			wantWrites: true, wantState: names.TokenCurrent, wantPolicy: names.PolicyHold, wantTarget: names.StateOutOfSync,
		},
		"Secret changed under a container started in the second raysync wrote the token: left as it is, behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(changedUnder(rotated.FirstSeen.Add(300 * time.Millisecond))), pods(startedPod("c1-head", "c1", rotated.FirstSeen, headPod))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		"Secret changed under a container started before raysync wrote the token: left as it is, behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(changedUnder(rotated.FirstSeen)), pods(startedPod("c1-head", "c1", rotated.FirstSeen.Add(time.Hour), headPod),
				startedPod("c1-worker", "c1", rotated.FirstSeen.Add(-time.Minute)))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		"Secret without raysync's mark under late containers (KubeRay's, written while raysync was down): left as it is, behind": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberaysAt(rotated.FirstSeen)), pods(startedPod("c1-head", "c1", rotated.FirstSeen.Add(time.Hour), headPod))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
		},
		"Secret deleted under containers started on the current token: nothing tells their token any more, missing": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){pods(startedPod("c1-head", "c1", rotated.FirstSeen.Add(time.Hour), headPod))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateMissing,
		},
		"Secret deleted under containers on a token raysync cannot tell: nothing written, behind, missing": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){pods(running)},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateMissing,
		},
		"a RayService's cluster: replaced by default": {
			rc: rayCluster("c1", ofRayService("svc")), opts: []func(*ClusterInput){target(old()), pods(running), owner(rayService("svc"))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyReplace, wantTarget: names.StateFrozen,
		},
		"a RayService with upgradeStrategy None: held, and why": {
			rc: rayCluster("c1", ofRayService("svc")), wantTarget: names.StateFrozen,
			opts:      []func(*ClusterInput){target(old()), pods(running), owner(rayService("svc", setPath("None", "spec", "upgradeStrategy", "type")))},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantHeld: "its RayService has upgradeStrategy None: KubeRay would not start a new cluster",
		},
		"restart chosen by annotation, in flight": {
			rc:   rayCluster("c1", annotated(names.RotationAnnotation, "restart"), annotated(names.RotationStartedAnnotation, planNow.Add(-time.Minute).Format(time.RFC3339))),
			opts: []func(*ClusterInput){target(old()), pods(running)}, wantState: names.TokenRotating, wantPolicy: names.PolicyRestart, wantTarget: names.StateFrozen,
		},
		"in flight past the timeout: blocked": {
			rc:   rayCluster("c1", annotated(names.RotationAnnotation, "restart"), annotated(names.RotationStartedAnnotation, planNow.Add(-2*time.Hour).Format(time.RFC3339))),
			opts: []func(*ClusterInput){target(old()), pods(running)}, wantState: names.TokenBlocked, wantPolicy: names.PolicyRestart, wantTarget: names.StateFrozen,
		},
		"a managed copy shared by its clusters: held, and why": {
			rc:        rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}), annotated(names.RotationAnnotation, "restart")),
			opts:      []func(*ClusterInput){target(secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed)), pods(running)},
			wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateFrozen,
			wantHeld: "it shares the managed Secret shared, which holds one token for every cluster naming it",
		},
		"reading the source itself, started before it changed: behind": {
			rc:   rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "ray-token"}), func(u *unstructured.Unstructured) { u.SetNamespace(tokenSrc.Namespace) }),
			opts: []func(*ClusterInput){pods(running)}, wantState: names.TokenBehind, wantPolicy: names.PolicyHold, wantTarget: names.StateInSync, // the source itself: in sync; its containers are behind
		},
		"reading the source itself, started after it changed: current": {
			rc:   rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "ray-token"}), func(u *unstructured.Unstructured) { u.SetNamespace(tokenSrc.Namespace) }),
			opts: []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-time.Hour)))}, wantState: names.TokenCurrent, wantPolicy: names.PolicyHold, wantTarget: names.StateInSync,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := cfg
			c.Rotation.Timeout = time.Hour
			in := input(c, tc.rc, []*corev1.Secret{sourceSecret(token)}, append(tc.opts, withRotation)...)
			p := planCluster(in, c.withDefaults())
			var writes, creates bool
			for _, a := range p.Actions {
				switch a.(type) {
				case UpdateSecret:
					writes = true
				case CreateSecret:
					creates = true
				}
			}
			r := p.Status.Rotation
			if r == nil {
				t.Fatalf("no rotation status: %+v", p.Status)
			}
			if writes != tc.wantWrites || creates != tc.wantCreates || r.State != tc.wantState || r.Policy != tc.wantPolicy || r.Held != tc.wantHeld || p.Status.Token != tc.wantTarget {
				t.Errorf("writes %v creates %v, rotation %+v, target %s; want writes %v creates %v, %s %s %q, target %s",
					writes, creates, r, p.Status.Token, tc.wantWrites, tc.wantCreates, tc.wantState, tc.wantPolicy, tc.wantHeld, tc.wantTarget)
			}
			if r.State == names.TokenBehind && r.Since == nil {
				t.Error("behind since an unknown time") // how long: TestBehindSinceTheFirstRotationMissed
			}
		})
	}
}

// What raysync can do to move a cluster, whatever its policy: `syncer rotate` and the wave both read
// it, so a cluster raysync cannot move is refused before anything is marked.
func TestWhatRaysyncCannotMove(t *testing.T) {
	shared := func() *corev1.Secret { return secret(ns, "shared", map[string]string{"auth_token": oldToken}, managed) }
	sharer := startedPod("other-head", "other", planNow.Add(-5*time.Hour), headPod)
	const sharesCopy = "it shares the managed Secret shared, which holds one token for every cluster naming it"
	tests := map[string]struct {
		rc                                  *unstructured.Unstructured
		opts                                []func(*ClusterInput)
		wantPolicy, wantHeld                string
		wantMove, wantUnmovable, wantTarget string
	}{
		"a standalone cluster, held by default: a request restarts it": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod))},
			wantPolicy: names.PolicyHold, wantMove: names.PolicyRestart, wantTarget: names.StateMissing,
		},
		"a standalone cluster sharing a managed copy with running clusters, held by default: raysync cannot move it": {
			rc:         rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"})),
			opts:       []func(*ClusterInput){target(shared()), pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)), readers(sharer)},
			wantPolicy: names.PolicyHold, wantUnmovable: sharesCopy, wantTarget: names.StateFrozen,
		},
		"a RayJob's cluster sharing a managed copy, restart by annotation: held, and raysync cannot move it": {
			rc: rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "shared"}), annotated(names.RotationAnnotation, names.PolicyRestart),
				withLabel(kuberay.OriginatedFromCRDLabel, "RayJob"), withLabel(kuberay.OriginatedFromNameLabel, "job")),
			opts:       []func(*ClusterInput){target(shared()), pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)), readers(sharer), owner(rayService("job"))},
			wantPolicy: names.PolicyHold, wantHeld: sharesCopy, wantUnmovable: sharesCopy, wantTarget: names.StateFrozen,
		},
		"a generated Secret another RayCluster names too: raysync cannot move it": {
			rc:         rayCluster("c1"),
			opts:       []func(*ClusterInput){target(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))), pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)), readers(sharer), sharedWith("other")},
			wantPolicy: names.PolicyHold, wantUnmovable: "RayCluster other also reads its Secret c1, which holds one token for every cluster naming it", wantTarget: names.StateFrozen,
		},
		"a RayService's cluster: replaced": {
			rc:         rayCluster("c1", ofRayService("svc")),
			opts:       []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)), owner(rayService("svc"))},
			wantPolicy: names.PolicyReplace, wantMove: names.PolicyReplace, wantTarget: names.StateMissing,
		},
		"a RayService's cluster on restart: KubeRay's RayService puts spec.suspend back, so it is held and a request replaces it": {
			rc:         rayCluster("c1", ofRayService("svc"), annotated(names.RotationAnnotation, names.PolicyRestart)),
			opts:       []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)), owner(rayService("svc"))},
			wantPolicy: names.PolicyHold, wantMove: names.PolicyReplace, wantTarget: names.StateMissing,
			wantHeld: "a RayService's cluster moves only by replacement, which keeps its traffic served (a restart stops every pod serving it; on KubeRay v1.6 its RayService also puts spec.suspend back, so a restart would never end)",
		},
		"a RayService's cluster held by annotation, upgradeStrategy None: raysync cannot move it": {
			rc:         rayCluster("c1", ofRayService("svc"), annotated(names.RotationAnnotation, names.PolicyHold)),
			opts:       []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)), owner(rayService("svc", setPath("None", "spec", "upgradeStrategy", "type")))},
			wantPolicy: names.PolicyHold, wantTarget: names.StateMissing,
			wantUnmovable: "its RayService has upgradeStrategy None: KubeRay would not start a new cluster",
		},
		"a RayService's cluster whose RayService is not cached: raysync cannot move it": {
			rc:         rayCluster("c1", ofRayService("svc")),
			opts:       []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod))},
			wantPolicy: names.PolicyHold, wantTarget: names.StateMissing,
			wantHeld: "its RayService is not in raysync's cache", wantUnmovable: "its RayService is not in raysync's cache",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Source: tokenSrc, Rotation: RotationOptions{Timeout: time.Hour}}.withDefaults()
			p := planCluster(input(cfg, tc.rc, []*corev1.Secret{sourceSecret(token)}, append(tc.opts, withRotation)...), cfg)
			r := p.Status.Rotation
			if r == nil {
				t.Fatalf("no rotation status: %+v", p.Status)
			}
			got := [...]string{r.State, r.Policy, r.Held, r.Move, r.Unmovable, p.Status.Token}
			want := [...]string{names.TokenBehind, tc.wantPolicy, tc.wantHeld, tc.wantMove, tc.wantUnmovable, tc.wantTarget}
			if got != want {
				t.Errorf("state, policy, held, move, unmovable, target:\n got %q\nwant %q", got, want)
			}
		})
	}
}

func readers(ps ...*corev1.Pod) func(*ClusterInput) {
	return func(in *ClusterInput) { in.Readers = ps }
}

func sharedWith(clusters ...string) func(*ClusterInput) {
	return func(in *ClusterInput) { in.SharedWith = clusters }
}
