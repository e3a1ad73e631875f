package projection

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/names"
)

// The token policy chain, case by case: for each case, the smallest input that gives it (cert-manager's
// Test_NewTriggerPolicyChain). TestPlanToken and TestTokenNeverChangesUnderRunningContainers check
// what each case plans.
func TestClassifyTokenTarget(t *testing.T) {
	inSource := func(u *unstructured.Unstructured) { u.SetNamespace(tokenSrc.Namespace) }
	namesSource := withAuth(map[string]any{"mode": "token", "secretName": tokenSrc.Name})
	referenced := withAuth(map[string]any{"mode": "token", "secretName": "shared"})
	src := []*corev1.Secret{sourceSecret(token)}
	kuberays := secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))
	writtenBefore := func(s *corev1.Secret) {
		s.Annotations = map[string]string{names.TokenSHA256Annotation: tokenDigest([]byte(token)),
			names.SyncedAtAnnotation: planNow.Add(-time.Hour).Format(time.RFC3339Nano)}
	}
	runningPod := startedPod("c1-head", "c1", planNow)
	tests := map[tokenCase]struct {
		rc        *unstructured.Unstructured
		sources   []*corev1.Secret
		sourceKey string
		cfg       func(*Config)
		opts      []func(*ClusterInput)
	}{
		tokenSourceInvalid: {rc: rayCluster("c1")},
		tokenSourceKeyMismatch: {rc: rayCluster("c1", namesSource, inSource), sourceKey: "token",
			sources: []*corev1.Secret{secret(tokenSrc.Namespace, tokenSrc.Name, map[string]string{"token": token})}},
		tokenIsSource:      {rc: rayCluster("c1", namesSource, inSource), sources: src},
		tokenNotOwned:      {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){foreign("c1")}},
		tokenMissing:       {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){pods(runningPod)}},
		tokenLeftToKubeRay: {rc: rayCluster("c1"), sources: src, cfg: func(c *Config) { c.NoPrecreate = true }},
		tokenCreate:        {rc: rayCluster("c1"), sources: src},
		tokenRelabel: {rc: rayCluster("c1", referenced), sources: src, opts: []func(*ClusterInput){
			target(secret(ns, "shared", map[string]string{"auth_token": token}, managed, withSecretAnnotation(names.SourceAnnotation, "old/src")))}},
		tokenInSync: {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){
			target(secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1")))}},
		tokenRestore: {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){
			target(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"), writtenBefore)), pods(runningPod)}},
		tokenFrozen: {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){target(kuberays), pods(runningPod)}},
		tokenMayHaveBeenRead: {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){
			target(kuberays), pods(rayPod("c1-head", "c1", onNode))}},
		tokenWrite: {rc: rayCluster("c1"), sources: src, opts: []func(*ClusterInput){target(kuberays)}},
	}
	// The second tokenNotOwned check: a Secret under the target's name that raysync may not write.
	unowned := secret(ns, "c1", map[string]string{"auth_token": oldToken})
	checks := map[tokenCase]func(*tokenFacts) bool{tokenWrite: func(*tokenFacts) bool { return true }}
	for _, c := range tokenChecks {
		if _, ok := tests[c.is]; !ok {
			t.Errorf("case %s has no test", c.is)
		}
		if checks[c.is] == nil {
			checks[c.is] = c.holds
		}
	}
	run := func(t *testing.T, want tokenCase, f *tokenFacts) {
		t.Helper()
		if got := classifyTokenTarget(f); got != want {
			t.Errorf("classifyTokenTarget = %s, want %s", got, want)
		}
	}
	for want, tc := range tests {
		t.Run(string(want), func(t *testing.T) {
			cfg := Config{Source: tokenSrc, SourceKey: tc.sourceKey}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			in := input(cfg, tc.rc, tc.sources, tc.opts...)
			cfg = cfg.withDefaults()
			tt, ok, err := TokenTargetFor(in.Cluster, cfg.Source)
			if !ok || err != nil {
				t.Fatalf("fixture: no token target (%v)", err)
			}
			f := tokenFactsOf(in, cfg, tt)
			run(t, want, f)
			if tokenStates[want] == "" {
				t.Errorf("case %s reports no target state", want)
			}
			if !checks[want](f) {
				t.Errorf("the check of %s does not hold for its own input", want)
			}
			if p := planCluster(in, cfg); p.TokenCase != string(want) {
				t.Errorf("ClusterPlan.TokenCase = %q, want %q", p.TokenCase, want)
			}
		})
	}
	t.Run("not_owned, in the caches", func(t *testing.T) {
		in := input(Config{Source: tokenSrc}, rayCluster("c1"), src, target(unowned))
		cfg := Config{Source: tokenSrc}.withDefaults()
		tt, _, _ := TokenTargetFor(in.Cluster, cfg.Source)
		f := tokenFactsOf(in, cfg, tt)
		run(t, tokenNotOwned, f)
		if !notOurs(f) {
			t.Error("notOurs does not hold for a Secret without the cluster as controller")
		}
	})
}
