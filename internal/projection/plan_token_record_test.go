package projection

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// The record on the RayCluster of which rotation's token its containers run on: written from
// raysync's mark on the Secret, kept when the Secret goes or KubeRay re-creates it, and read to give
// such a Secret back the token the containers hold when that is the current one.

// earlier is rotation 6 (oldToken), before rotated (7, the canonical token).
var earlier = ledger.Rotation{ID: 6, Digest: tokenDigest([]byte(oldToken)), FirstSeen: planNow.Add(-30 * time.Hour)}

// withLedger gives the input the ledger's rotations 6 and 7 (7 current).
func withLedger(in *ClusterInput) {
	in.Sources.ledger, in.Sources.rotation = ledger.Ledger{earlier, rotated}, rotated
}

// recorded: raysync's record on the cluster that it wrote rotation id's token into the Secret at t.
func recorded(id int, t time.Time) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		annotated(names.TokenRotationAnnotation, fmt.Sprint(id))(u)
		annotated(names.TokenWrittenAtAnnotation, t.UTC().Format(time.RFC3339Nano))(u)
	}
}

// marked is raysync's mark on a Secret: it wrote value's token at t.
func marked(value string, t time.Time) func(*corev1.Secret) {
	return func(s *corev1.Secret) {
		withSecretAnnotation(names.TokenSHA256Annotation, tokenDigest([]byte(value)))(s)
		withSecretAnnotation(names.SyncedAtAnnotation, t.UTC().Format(time.RFC3339Nano))(s)
		withSecretAnnotation(names.SourceAnnotation, tokenSrc.String())(s)
	}
}

func recordPatch(rc *unstructured.Unstructured, rotation string, t time.Time) RecordToken {
	a := map[string]any{names.TokenRotationAnnotation: nil, names.TokenWrittenAtAnnotation: nil}
	if rotation != "" {
		a = map[string]any{names.TokenRotationAnnotation: rotation, names.TokenWrittenAtAnnotation: t.UTC().Format(time.RFC3339Nano)}
	}
	b := fmt.Appendf(nil, `{"metadata":{"uid":%q,"annotations":%s}}`, rc.GetUID(), mustJSON(a))
	return RecordToken{Namespace: rc.GetNamespace(), Name: rc.GetName(), Patch: b}
}

func TestTokenRecordOnTheRayCluster(t *testing.T) {
	cfg := Config{Source: tokenSrc, Ledger: tokenSrc}.withDefaults() // a ledger is configured
	cfg.Ledger.Name = "raysync-rotations"
	written := rotated.FirstSeen.Add(10 * time.Minute) // raysync wrote rotation 7's token then
	head := func(at time.Time) *corev1.Pod { return startedPod("c1-head", "c1", at, headPod) }
	// KubeRay's Secret, re-created (a random token, no mark) at t.
	recreated := func(at time.Time) *corev1.Secret {
		return secret(ns, "c1", map[string]string{"auth_token": oldToken + "-random"}, ownedBy("c1"), func(s *corev1.Secret) { s.CreationTimestamp = metav1.NewTime(at) })
	}
	restored := "auth Secret c1 was deleted or re-created under Ray containers that run on the current canonical token (rotation 7, as recorded on the RayCluster); put that token back, from raysync-system/ray-token"
	tests := map[string]struct {
		rc        *unstructured.Unstructured
		opts      []func(*ClusterInput)
		want      func(rc *unstructured.Unstructured) []Action
		wantState string
	}{
		"KubeRay re-created the Secret under containers recorded on the current token: put back": {
			rc:   rayCluster("c1", recorded(7, written)),
			opts: []func(*ClusterInput){target(recreated(written.Add(2 * time.Hour))), pods(head(written.Add(time.Hour)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{UpdateSecret{Secret: markedAt(withToken(recreated(written.Add(2*time.Hour)), []byte(token), tokenSrc, written), planNow), MarksRace: true},
					RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: names.ReasonTokenRestored, Message: restored}}
			},
			wantState: names.StateOutOfSync,
		},
		"deleted under containers recorded on the current token: re-created with it": {
			rc:   rayCluster("c1", recorded(7, written)),
			opts: []func(*ClusterInput){pods(head(written.Add(time.Hour)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{CreateSecret{Secret: desiredGeneratedSecret(rc, "c1", []byte(token), tokenSrc, written)},
					RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: names.ReasonTokenRestored, Message: restored}}
			},
			wantState: names.StateOutOfSync,
		},
		"deleted under containers recorded on an earlier rotation: missing, as before": {
			rc:   rayCluster("c1", recorded(6, written)),
			opts: []func(*ClusterInput){pods(head(written.Add(time.Hour)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTargetMissing, missingMessage(TokenTarget{Mode: Generated, Name: "c1"}))}
			},
			wantState: names.StateMissing,
		},
		"re-created, and a container started after that (it read KubeRay's token): left as it is": {
			rc:        rayCluster("c1", recorded(7, written)),
			opts:      []func(*ClusterInput){target(recreated(written.Add(2 * time.Hour))), pods(head(written.Add(time.Hour)), startedPod("c1-worker", "c1", written.Add(3*time.Hour)))},
			wantState: names.StateFrozen,
		},
		"deleted under containers started in the very second raysync created the Secret (born with the token): re-created with it": {
			rc:   rayCluster("c1", recorded(7, bornAt(written))),
			opts: []func(*ClusterInput){pods(head(written.Truncate(time.Second)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{CreateSecret{Secret: desiredGeneratedSecret(rc, "c1", []byte(token), tokenSrc, bornAt(written))},
					RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: names.ReasonTokenRestored, Message: restored}}
			},
			wantState: names.StateOutOfSync,
		},
		"re-created, and a container started before the recorded write: left as it is": {
			rc:        rayCluster("c1", recorded(7, written)),
			opts:      []func(*ClusterInput){target(recreated(written.Add(2 * time.Hour))), pods(head(written.Add(-time.Minute)))},
			wantState: names.StateFrozen,
		},
		"re-created, the record names a rotation the ledger no longer lists: left as it is": {
			rc:        rayCluster("c1", recorded(3, written)),
			opts:      []func(*ClusterInput){target(recreated(written.Add(2 * time.Hour))), pods(head(written.Add(time.Hour)))},
			wantState: names.StateFrozen,
		},
		"deleted, the record names rotation 7 of a ledger started again since (written before 7 was first seen): missing": {
			rc:   rayCluster("c1", recorded(7, rotated.FirstSeen.Add(-2*time.Hour))),
			opts: []func(*ClusterInput){pods(head(rotated.FirstSeen.Add(-time.Hour)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTargetMissing, missingMessage(TokenTarget{Mode: Generated, Name: "c1"}))}
			},
			wantState: names.StateMissing,
		},
		"a new cluster: its Secret is created; the record follows on the next pass (below)": {
			rc: rayCluster("c1"),
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{CreateSecret{Secret: desiredGeneratedSecret(rc, "c1", []byte(token), tokenSrc, bornAt(planNow)), Propagates: true},
					normal(rc, names.ReasonTokenProjected, "auth Secret now holds the canonical token from raysync-system/ray-token")}
			},
			wantState: names.StateOutOfSync,
		},
		"the next pass, the created Secret cached: the RayCluster records rotation 7": {
			rc:   rayCluster("c1"),
			opts: []func(*ClusterInput){target(secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"), marked(token, bornAt(planNow))))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{recordPatch(rc, "7", bornAt(planNow))}
			},
			wantState: names.StateInSync,
		},
		"raysync's Secret holds rotation 7, the cluster has no record yet: recorded from the mark": {
			rc:   rayCluster("c1"),
			opts: []func(*ClusterInput){target(secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"), marked(token, written))), pods(head(written.Add(time.Hour)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{recordPatch(rc, "7", written)}
			},
			wantState: names.StateInSync,
		},
		"already recorded: nothing to write": {
			rc:        rayCluster("c1", recorded(7, written)),
			opts:      []func(*ClusterInput){target(secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"), marked(token, written))), pods(head(written.Add(time.Hour)))},
			wantState: names.StateInSync,
		},
		"frozen on rotation 6 by raysync's mark: recorded as 6": {
			rc:   rayCluster("c1"),
			opts: []func(*ClusterInput){target(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"), marked(oldToken, written.Add(-24*time.Hour)))), pods(head(written))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{recordPatch(rc, "6", written.Add(-24*time.Hour))}
			},
			wantState: names.StateFrozen,
		},
		"KubeRay's Secret without raysync's mark: the record stays": {
			rc:        rayCluster("c1", recorded(6, written)),
			opts:      []func(*ClusterInput){target(kuberaysAt(written)), pods(head(written.Add(time.Hour)))},
			wantState: names.StateFrozen,
		},
		"a mark of a token the ledger cannot name: the record goes": {
			rc:   rayCluster("c1", recorded(6, written)),
			opts: []func(*ClusterInput){target(secret(ns, "c1", map[string]string{"auth_token": "unnumbered"}, ownedBy("c1"), marked("unnumbered", written.Add(time.Hour)))), pods(head(written.Add(2 * time.Hour)))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{recordPatch(rc, "", time.Time{})}
			},
			wantState: names.StateFrozen,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := input(cfg, tc.rc, []*corev1.Secret{sourceSecret(token)}, append(tc.opts, withLedger)...)
			p := planCluster(in, cfg)
			var want []Action
			if tc.want != nil {
				want = tc.want(tc.rc)
			}
			checkPlan(t, p, want)
			if p.Status.Token != tc.wantState {
				t.Errorf("target state %s, want %s", p.Status.Token, tc.wantState)
			}
		})
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// The record's patch comes last: the template patch carries the resourceVersion it would change.
func TestTokenRecordAfterTheTemplatePatch(t *testing.T) {
	cfg := Config{Source: tokenSrc, Ledger: types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "raysync-rotations"},
		Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}}}.withDefaults()
	written := rotated.FirstSeen.Add(10 * time.Minute)
	in := input(cfg, templatedCluster("c1"), []*corev1.Secret{sourceSecret(token), pullSecretSource()}, copies(pullCopy()), withLedger,
		target(secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"), marked(token, written))))
	var got []string
	for _, a := range planCluster(in, cfg).Actions {
		got = append(got, fmt.Sprintf("%T", a))
	}
	want := []string{"projection.PatchCluster", "projection.RecordEvent", "projection.RecordToken"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("actions %v, want %v", got, want)
	}
}

// A restore from the record writes over KubeRay's re-created Secret, whose random token a pod bound
// meanwhile may have read (its container not started yet, so the record's check cannot see it). The
// restore is marked as any write over a token, and the pods whose containers then start in the raced
// window are recycled; containers that started before KubeRay re-created the Secret read raysync's and
// are kept. Before, the restore went unmarked and such a pod counted as current for ever.
func TestRestoreOverKubeRaysTokenRecyclesItsRacedReaders(t *testing.T) {
	cfg := Config{Source: tokenSrc, Ledger: tokenSrc}.withDefaults()
	cfg.Ledger.Name = "raysync-rotations"
	written := rotated.FirstSeen.Add(10 * time.Minute)
	recreatedAt := planNow.Add(-30 * time.Second)
	kuberays := secret(ns, "c1", map[string]string{"auth_token": oldToken + "-random"}, ownedBy("c1"), func(s *corev1.Secret) { s.CreationTimestamp = metav1.NewTime(recreatedAt) })
	head := startedPod("c1-head", "c1", written.Add(time.Hour), headPod)
	bound := rayPod("c1-worker", "c1", onNode, func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(recreatedAt.Add(-time.Minute)) })
	in := input(cfg, rayCluster("c1", recorded(7, written)), []*corev1.Secret{sourceSecret(token)}, withLedger, target(kuberays), pods(head, bound))
	first := planCluster(in, cfg)
	if len(first.Actions) == 0 {
		t.Fatal("nothing restored")
	}
	restore, ok := first.Actions[0].(UpdateSecret)
	if !ok || !restore.MarksRace || restore.Secret.Annotations[names.WrittenUnderPodsAnnotation] != planNow.Format(time.RFC3339Nano) {
		t.Fatalf("the restore over KubeRay's token is not marked as raced: %+v", first.Actions[0])
	}
	for name, tc := range map[string]struct {
		started time.Time
		recycle bool
	}{
		"the bound worker started in the window": {started: planNow.Add(2 * time.Second), recycle: true},
		"the bound worker started after it":      {started: planNow.Add(raceWindow + time.Second)},
	} {
		t.Run(name, func(t *testing.T) {
			worker := startedPod("c1-worker", "c1", tc.started)
			worker.CreationTimestamp = bound.CreationTimestamp
			later := planNow.Add(raceWindow + 5*time.Second)
			in := input(cfg, rayCluster("c1", recorded(7, written)), []*corev1.Secret{sourceSecret(token)}, withLedger,
				target(restore.Secret), pods(head, worker), func(in *ClusterInput) { in.Now = later })
			var deleted []string
			for _, a := range planCluster(in, cfg).Actions {
				if d, ok := a.(DeletePod); ok {
					deleted = append(deleted, d.Pod.Name)
				}
			}
			want := []string(nil)
			if tc.recycle {
				want = []string{"c1-worker"} // the head started before KubeRay re-created the Secret: kept
			}
			if fmt.Sprint(deleted) != fmt.Sprint(want) {
				t.Errorf("recycled %v, want %v", deleted, want)
			}
		})
	}
}

// A token rolled back (A as 7, B as 8, A again as 9), raysync killed after writing B into a new
// cluster's Secret and before recording it (the record still says 7), and the Secret deleted: the
// stale record "7 (A)" matches the current token by digest, but a container that started after B came
// may hold B. The record vouches only for containers started before the next rotation came (matched by
// rotation and token together): the cluster is reported missing and moved by its policy, never given A
// under containers on B. Before, the restore wrote A.
func TestAStaleRecordAfterARollbackRestoresNothing(t *testing.T) {
	cfg := Config{Source: tokenSrc, Ledger: tokenSrc}.withDefaults()
	cfg.Ledger.Name = "raysync-rotations"
	seven := ledger.Rotation{ID: 7, Digest: tokenDigest([]byte(token)), FirstSeen: planNow.Add(-5 * time.Hour)}
	eight := ledger.Rotation{ID: 8, Digest: tokenDigest([]byte(oldToken)), FirstSeen: planNow.Add(-3 * time.Hour)}
	nine := ledger.Rotation{ID: 9, Digest: tokenDigest([]byte(token)), FirstSeen: planNow.Add(-time.Hour)}
	rolledBack := func(in *ClusterInput) {
		in.Sources.ledger, in.Sources.rotation = ledger.Ledger{seven, eight, nine}, nine
	}
	written := seven.FirstSeen.Add(10 * time.Minute)
	for name, tc := range map[string]struct {
		started time.Time
		want    tokenCase
	}{
		"the head started after B came (it may hold B): missing":  {started: eight.FirstSeen.Add(10 * time.Minute), want: tokenMissing},
		"the head started before B came (it holds A): re-created": {started: eight.FirstSeen.Add(-2 * ledgerLag), want: tokenCreate},
	} {
		t.Run(name, func(t *testing.T) {
			in := input(cfg, rayCluster("c1", recorded(7, written)), []*corev1.Secret{sourceSecret(token)}, rolledBack,
				pods(startedPod("c1-head", "c1", tc.started, headPod)))
			if got := planCluster(in, cfg); got.TokenCase != string(tc.want) {
				t.Errorf("case %s, want %s", got.TokenCase, tc.want)
			}
		})
	}
}
