package projection

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/validate"
)

// Planner tests: a ClusterInput in, the exact actions (objects, patches, Event reasons and
// messages) and status out. No clients, no caches, no clock.

// planNow is the planners' clock. It is the real time (to the second) because test certificates are
// made valid around it; every expectation is computed from it.
var (
	planNow       = time.Now().UTC().Truncate(time.Second)
	syncedAtValue = planNow.Add(-time.Hour).Format(time.RFC3339)
)

// input builds a ClusterInput for rc over the given source Secrets (nil source: missing).
func input(cfg Config, rc *unstructured.Unstructured, sources []*corev1.Secret, opts ...func(*ClusterInput)) *ClusterInput {
	get := func(n types.NamespacedName) *corev1.Secret {
		for _, s := range sources {
			if s.Namespace == n.Namespace && s.Name == n.Name {
				return s
			}
		}
		return nil
	}
	in := &ClusterInput{Cluster: rc, Sources: readSources(cfg.withDefaults(), get, planNow), Now: planNow}
	// The tests of everything but adoption see clusters an operator adopted (TestAdoption* see the rest).
	in.Sources.control.adoptAll = true
	for _, o := range opts {
		o(in)
	}
	return in
}

func target(s *corev1.Secret) func(*ClusterInput) { return func(in *ClusterInput) { in.Target = s } }

// notAdoptedByAll: no operator adopted every cluster (the default of a new install).
func notAdoptedByAll(in *ClusterInput) { in.Sources.control.adoptAll = false }

func copies(ss ...*corev1.Secret) func(*ClusterInput) {
	return func(in *ClusterInput) {
		in.Copies = nil
		for _, s := range ss {
			in.setCopy(s)
		}
	}
}

func pods(ps ...*corev1.Pod) func(*ClusterInput) { return func(in *ClusterInput) { in.Pods = ps } }

func warned(key, value string) func(*ClusterInput) {
	return func(in *ClusterInput) {
		if in.Memory.warned == nil {
			in.Memory.warned = map[string]string{}
		}
		in.Memory.warned[key] = value
	}
}

func foreign(name string) func(*ClusterInput) {
	return func(in *ClusterInput) { in.Foreign = map[string]bool{name: true} }
}

func normal(rc *unstructured.Unstructured, reason, message string) RecordEvent {
	return RecordEvent{Object: rc, Type: corev1.EventTypeNormal, Reason: reason, Message: message}
}

func warning(rc *unstructured.Unstructured, reason, message string) RecordEvent {
	return RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: reason, Message: message,
		DedupKey: reason, DedupValue: string(rc.GetUID()) + "/1"}
}

// patchAsJSON compares merge patches by meaning, not by byte order.
var patchAsJSON = cmp.Transformer("patch", func(b []byte) any {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return string(b)
	}
	return v
})

func checkPlan(t *testing.T, got ClusterPlan, want []Action) {
	t.Helper()
	if diff := cmp.Diff(want, got.Actions, patchAsJSON); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
}

func TestPlanToken(t *testing.T) {
	cfg := Config{Source: tokenSrc}
	referenced := withAuth(map[string]any{"mode": "token", "secretName": "shared"})
	kuberays := secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))
	ours := secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"), withSecretAnnotation(names.TokenSHA256Annotation, "0123456789abcdef"))
	inSync := secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"), withSecretAnnotation(names.SyncedAtAnnotation, syncedAtValue))
	projected := "auth Secret now holds the canonical token from raysync-system/ray-token"
	tests := map[string]struct {
		rc        *unstructured.Unstructured
		sources   []*corev1.Secret
		opts      []func(*ClusterInput)
		want      func(rc *unstructured.Unstructured) []Action
		wantState string
		sourceKey string
	}{
		"generated, absent: created in KubeRay's shape": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, wantState: names.StateOutOfSync,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{CreateSecret{Secret: desiredGeneratedSecret(rc, "c1", []byte(token), tokenSrc, bornAt(planNow)), Propagates: true},
					normal(rc, names.ReasonTokenProjected, projected)}
			},
		},
		"generated, KubeRay's random token: updated": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, opts: []func(*ClusterInput){target(kuberays)}, wantState: names.StateOutOfSync,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{UpdateSecret{Secret: markedAt(withToken(kuberays, []byte(token), tokenSrc, planNow), planNow), Propagates: true, MarksRace: true},
					normal(rc, names.ReasonTokenProjected, projected)}
			},
		},
		"generated, raysync's older token: a rotation": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, opts: []func(*ClusterInput){target(ours)}, wantState: names.StateOutOfSync,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{UpdateSecret{Secret: markedAt(withToken(ours, []byte(token), tokenSrc, planNow), planNow), Propagates: true, MarksRace: true},
					normal(rc, names.ReasonTokenRotated, "auth Secret updated to the rotated canonical token from raysync-system/ray-token")}
			},
		},
		"in sync: nothing": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, opts: []func(*ClusterInput){target(inSync)}, wantState: names.StateInSync,
		},
		"controlled by another UID: refused once per generation": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, wantState: names.StateNotOwned,
			opts: []func(*ClusterInput){target(secret(ns, "c1", nil, ownedBy("c1"), func(s *corev1.Secret) { s.OwnerReferences[0].UID = "x" }))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTargetNotOwned, "Secret c1 already exists and is not managed by raysync for this RayCluster; leaving it untouched")}
			},
		},
		"refused, already warned for this generation": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, wantState: names.StateNotOwned,
			opts: []func(*ClusterInput){target(secret(ns, "c1", nil)), warned(names.ReasonTargetNotOwned, "uid-c1/1")},
		},
		"absent from the data caches, the name taken by a Secret raysync does not own: not owned, nothing created": {
			rc: rayCluster("c1"), sources: []*corev1.Secret{sourceSecret(token)}, opts: []func(*ClusterInput){foreign("c1")}, wantState: names.StateNotOwned,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTargetNotOwned, "Secret c1 already exists and is not managed by raysync for this RayCluster; leaving it untouched")}
			},
		},
		"referenced, absent: a managed copy": {
			rc: rayCluster("c1", referenced), sources: []*corev1.Secret{sourceSecret(token)}, wantState: names.StateOutOfSync,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{CreateSecret{Secret: desiredManagedCopy(ns, "shared", []byte(token), tokenSrc, bornAt(planNow)), Propagates: true},
					normal(rc, names.ReasonTokenProjected, projected)}
			},
		},
		"referenced, copy of an earlier source holding the token: its annotations follow, quietly": {
			rc: rayCluster("c1", referenced), sources: []*corev1.Secret{sourceSecret(token)}, wantState: names.StateOutOfSync,
			opts: []func(*ClusterInput){target(secret(ns, "shared", map[string]string{"auth_token": token}, managed, withSecretAnnotation(names.SourceAnnotation, "old/src")))},
			want: func(*unstructured.Unstructured) []Action {
				s := secret(ns, "shared", map[string]string{"auth_token": token}, managed)
				return []Action{UpdateSecret{Secret: s}}
			},
		},
		"names the source, whose token is under another key: Warning": {
			rc:      rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "ray-token"}), func(u *unstructured.Unstructured) { u.SetNamespace(tokenSrc.Namespace) }),
			sources: []*corev1.Secret{secret(tokenSrc.Namespace, tokenSrc.Name, map[string]string{"token": token})}, sourceKey: "token", wantState: names.StateOutOfSync,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonSourceKeyMismatch,
					`spec.authOptions.secretName names the canonical source raysync-system/ray-token, but KubeRay reads key "auth_token" and the source keeps its token in "token": Ray pods will fail to start`)}
			},
		},
		"malformed authOptions: Warning": {
			rc: rayCluster("c1", withAuth("token")), sources: []*corev1.Secret{sourceSecret(token)},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonInvalidSpec, "raysync cannot read spec.authOptions: spec.authOptions is not an object; leaving this cluster alone")}
			},
		},
		"source missing: nothing, whatever the target holds": {
			rc: rayCluster("c1"), opts: []func(*ClusterInput){target(kuberays)}, wantState: names.StateSourceInvalid,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := cfg
			cfg.SourceKey = tc.sourceKey
			in := input(cfg, tc.rc, tc.sources, tc.opts...)
			got := planCluster(in, cfg.withDefaults())
			var want []Action
			if tc.want != nil {
				want = tc.want(tc.rc)
			}
			checkPlan(t, got, want)
			if got.Status.Token != tc.wantState {
				t.Errorf("state = %q, want %q", got.Status.Token, tc.wantState)
			}
		})
	}
}

func TestPlanPrune(t *testing.T) {
	cfg := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}}}.withDefaults()
	copyNamed := func(name string) *corev1.Secret { return secret(ns, name, nil, managed) }
	refs := func(name string) func(*unstructured.Unstructured) {
		return withAuth(map[string]any{"mode": "token", "secretName": name})
	}
	tests := map[string]struct {
		clusters []*unstructured.Unstructured
		copies   []*corev1.Secret
		want     []string
	}{
		"nothing references it":                 {copies: []*corev1.Secret{copyNamed("a")}, want: []string{"a"}},
		"a cluster being deleted references it": {clusters: []*unstructured.Unstructured{rayCluster("c", refs("a"), deleting)}, copies: []*corev1.Secret{copyNamed("a")}},
		"a managed cluster will reference the pull secret": {clusters: []*unstructured.Unstructured{rayCluster("c")},
			copies: []*corev1.Secret{copyNamed("regcred"), copyNamed("old-regcred")}, want: []string{"old-regcred"}},
		"a skipped cluster's templates reference it": {clusters: []*unstructured.Unstructured{templatedCluster("c", withAnnotation(names.SkipAnnotation, "true"),
			setPath([]any{map[string]any{"name": "old-regcred"}}, "spec", "workerGroupSpecs"))}, copies: []*corev1.Secret{copyNamed("old-regcred")}, want: []string{"old-regcred"}},
		"a malformed cluster: keep everything": {clusters: []*unstructured.Unstructured{rayCluster("c", withAuth("x"))}, copies: []*corev1.Secret{copyNamed("a")}},
		"not labelled managed: never":          {copies: []*corev1.Secret{secret(ns, "a", nil)}},
		"the rotation ledger: never":           {copies: []*corev1.Secret{ledger.Desired(types.NamespacedName{Namespace: ns, Name: "raysync-rotations"}, nil, nil)}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var want []Action
			for _, n := range tc.want {
				for _, c := range tc.copies {
					if c.Name == n {
						want = append(want, DeleteSecret{Secret: c})
					}
				}
			}
			if diff := cmp.Diff(want, planPrune(tc.clusters, tc.copies, cfg)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestObserveSource(t *testing.T) {
	valid := func(v string) source {
		s := source{kind: names.KindAuthToken, secret: sourceSecret(v)}
		s.value, s.err = validate.Token(s.secret, kuberay.AuthTokenKey)
		return s
	}
	first := observeSource(sourceMemory{}, valid("a"), kuberay.AuthTokenKey)
	if first.rotated || first.nowInvalid != "" {
		t.Fatalf("first observation: %+v", first)
	}
	same := observeSource(first.afterwards, valid("a"), kuberay.AuthTokenKey)
	bad := observeSource(same.afterwards, valid(" a"), kuberay.AuthTokenKey)
	badAgain := observeSource(bad.afterwards, valid(" a"), kuberay.AuthTokenKey)
	rotated := observeSource(badAgain.afterwards, valid("b"), kuberay.AuthTokenKey)
	switch {
	case same.rotated:
		t.Error("same content counted as a rotation")
	case bad.nowInvalid != `key "auth_token" has leading or trailing whitespace` || bad.rotated:
		t.Errorf("invalid: %+v", bad)
	case badAgain.nowInvalid != "":
		t.Error("the same reason reported twice")
	case !rotated.rotated || !rotated.validAgain:
		t.Errorf("a new valid value after an invalid one: %+v", rotated)
	}
}
