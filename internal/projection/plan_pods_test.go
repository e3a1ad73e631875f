package projection

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
	"github.com/raysync/raysync/internal/validate"
)

func resourceVersion(rv string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { rc.SetResourceVersion(rv) }
}

func createdAt(t time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t) }
}

func TestPlanPodConfig(t *testing.T) {
	pull := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: true}}
	fixed := func(opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
		rc, _, _ := podtemplate.Desired(templatedCluster("c1", append(opts, resourceVersion("7"))...), podtemplate.Config{PullSecrets: []string{"regcred"}})
		return rc
	}
	recreate := setPath("Recreate", "spec", "upgradeStrategy", "type")
	old := createdAt(planNow.Add(-time.Minute))
	pullPatch := []byte(`{"metadata":{"resourceVersion":"7"},"spec":{
		"headGroupSpec":{"template":{"spec":{"imagePullSecrets":[{"name":"regcred"}]}}},
		"workerGroupSpecs":[{"groupName":"gpu","template":{"spec":{"containers":[{"name":"ray-worker","image":"registry.example/ray:1"}],"imagePullSecrets":[{"name":"regcred"}]}}}]}}`)
	patched := "pod templates now carry raysync's pull secrets / autoscaler TLS"
	tests := map[string]struct {
		cfg         Config
		rc          *unstructured.Unstructured
		sources     []*corev1.Secret
		opts        []func(*ClusterInput)
		want        func(rc *unstructured.Unstructured) []Action
		wantState   string
		wantStale   int
		wantRequeue time.Duration
	}{
		"no copy yet: copy, then patch the templates": {
			cfg: pull, rc: templatedCluster("c1", resourceVersion("7")), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateOutOfSync,
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{CreateSecret{Secret: pullCopy(func(s *corev1.Secret) { s.UID, s.ResourceVersion = "", "" })},
					PatchCluster{Namespace: ns, Name: "c1", Patch: pullPatch}, normal(rc, names.ReasonTemplatePatched, patched)}
			},
		},
		"entries wiped after raysync had applied them: patched again, counted": {
			cfg: pull, rc: templatedCluster("c1", resourceVersion("7")), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateOutOfSync,
			opts: []func(*ClusterInput){copies(pullCopy()), func(in *ClusterInput) { in.Memory.templatesApplied = true }},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{PatchCluster{Namespace: ns, Name: "c1", Patch: pullPatch, Reapplied: true}, normal(rc, names.ReasonTemplatePatched, patched)}
			},
		},
		"in place; a pending pod old enough: recycled": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateInSync,
			opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", old))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{DeletePod{Pod: rayPod("p1", "c1", old), Missing: []string{names.StalePullSecret}}, normal(rc, names.ReasonPodRecycled,
					"deleted pending pod p1 (missing pull_secret, containers never started) so KubeRay recreates it from the fixed template")}
			},
		},
		"a pending pod KubeRay may not have seen yet: look again when it is 35 s old": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateInSync, wantRequeue: 6 * time.Second,
			opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", createdAt(planNow.Add(-29*time.Second))))},
		},
		"a running pod: reported once, never deleted": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateInSync, wantStale: 1,
			opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", old, running))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: names.ReasonStalePodConfig,
					Message:  "1 running Ray pod(s) (e.g. p1) lack raysync's pull_secret; they are not deleted and pick it up when restarted",
					DedupKey: "StalePodConfig/pull_secret", DedupValue: "p1", StartedWithout: 1, StaleReason: "pull_secret"}}
			},
		},
		"a second running pod: reported with the first, only it counted": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateInSync, wantStale: 2,
			opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", old, running), rayPod("p2", "c1", old, running)), warned("StalePodConfig/pull_secret", "p1")},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: names.ReasonStalePodConfig,
					Message:  "2 running Ray pod(s) (e.g. p1) lack raysync's pull_secret; they are not deleted and pick it up when restarted",
					DedupKey: "StalePodConfig/pull_secret", DedupValue: "p1,p2", StartedWithout: 1, StaleReason: "pull_secret"}}
			},
		},
		"a running pod already reported": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateInSync, wantStale: 1,
			opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", old, running)), warned("StalePodConfig/pull_secret", "p1")},
		},
		"Recreate with a running pod: deferred": {
			cfg: pull, rc: templatedCluster("c1", recreate), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateOutOfSync, wantStale: 1,
			opts: []func(*ClusterInput){copies(pullCopy()), pods(rayPod("p1", "c1", old, running))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTemplatePatchDeferred, "upgradeStrategy Recreate would restart every running pod to add raysync's pull secrets "+
					"or autoscaler TLS; not patching (start raysync with --allow-recreate to permit it)"),
					RecordEvent{Object: rc, Type: corev1.EventTypeWarning, Reason: names.ReasonStalePodConfig,
						Message:  "1 running Ray pod(s) (e.g. p1) lack raysync's pull_secret; they are not deleted and pick it up when restarted",
						DedupKey: "StalePodConfig/pull_secret", DedupValue: "p1", StartedWithout: 1, StaleReason: "pull_secret"}}
			},
		},
		"the copy's name is taken by a Secret raysync does not own: not used, Warning": {
			cfg: pull, rc: templatedCluster("c1"), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateNotOwned,
			opts: []func(*ClusterInput){copies(secret(ns, "regcred", nil))},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTargetNotOwned,
					"Secret regcred already exists and is not managed by raysync; not copying raysync-system/regcred into it and not using it")}
			},
		},
		"the copy's name is taken by a Secret only the metadata cache shows: not created, not referenced": {
			cfg: pull, rc: templatedCluster("c1"), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateNotOwned,
			opts: []func(*ClusterInput){foreign("regcred")},
			want: func(rc *unstructured.Unstructured) []Action {
				return []Action{warning(rc, names.ReasonTargetNotOwned,
					"Secret regcred already exists and is not managed by raysync; not copying raysync-system/regcred into it and not using it")}
			},
		},
		"the source changed type: the copy is replaced": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateOutOfSync,
			opts: []func(*ClusterInput){copies(pullCopy(func(s *corev1.Secret) { s.Type = corev1.SecretTypeDockercfg }))},
			want: func(*unstructured.Unstructured) []Action {
				return []Action{ReplaceSecret{Old: pullCopy(func(s *corev1.Secret) { s.Type = corev1.SecretTypeDockercfg }),
					New: pullCopy(func(s *corev1.Secret) { s.UID, s.ResourceVersion = "", "" })}}
			},
		},
		"the source's data changed: the copy follows": {
			cfg: pull, rc: fixed(), sources: []*corev1.Secret{pullSecretSource()}, wantState: names.StateOutOfSync,
			opts: []func(*ClusterInput){copies(pullCopy(func(s *corev1.Secret) { s.Data = map[string][]byte{".dockerconfigjson": []byte(`{"auths":{}}`)} }))},
			want: func(*unstructured.Unstructured) []Action { return []Action{UpdateSecret{Secret: pullCopy()}} },
		},
		"invalid source: nothing at all": {
			cfg: pull, rc: templatedCluster("c1"), wantState: names.StateSourceInvalid, opts: []func(*ClusterInput){pods(rayPod("p1", "c1", old))},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := planCluster(input(tc.cfg, tc.rc, append(tc.sources, sourceSecret(token)), tc.opts...), tc.cfg.withDefaults())
			var want []Action
			if tc.want != nil {
				want = tc.want(tc.rc)
			}
			// The token target is not this test's concern: drop its actions.
			var podActions []Action
			for _, a := range got.Actions {
				if c, ok := a.(CreateSecret); ok && c.Secret.Name == "c1" {
					continue
				}
				if e, ok := a.(RecordEvent); ok && (e.Reason == names.ReasonTokenProjected || e.Reason == names.ReasonTargetMissing) {
					continue
				}
				podActions = append(podActions, a)
			}
			got.Actions = podActions
			checkPlan(t, got, want)
			if got.Status.PullSecret != tc.wantState || got.Status.StalePods[names.StalePullSecret] != tc.wantStale || got.RequeueAfter != tc.wantRequeue {
				t.Errorf("state %q, stale %d, requeue %v; want %q, %d, %v", got.Status.PullSecret, got.Status.StalePods[names.StalePullSecret],
					got.RequeueAfter, tc.wantState, tc.wantStale, tc.wantRequeue)
			}
		})
	}
}

func TestPlanAutoscalerTLS(t *testing.T) {
	crt, key := testCert(t)
	tlsSrc := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "client-tls"}
	src := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tlsSrc.Name, Namespace: tlsSrc.Namespace}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "extra": []byte("never copied")}}
	cfg := Config{Source: tokenSrc, Pods: PodOptions{AutoscalerTLS: &tlsSrc, APIServer: &validate.APIServer{Host: "proxy.example", Port: 6443}}}
	rc := templatedCluster("c1", autoscaling, resourceVersion("9"))
	got := planCluster(input(cfg, rc, []*corev1.Secret{sourceSecret(token), src}, target(secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1")))), cfg.withDefaults())
	wantCopy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "client-tls", Namespace: ns,
		Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
		Annotations: map[string]string{names.SourceAnnotation: tlsSrc.String(), names.KindAnnotation: string(names.KindAutoscalerTLS)}},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	checkPlan(t, got, []Action{
		CreateSecret{Secret: wantCopy},
		PatchCluster{Namespace: ns, Name: "c1", Patch: []byte(`{"metadata":{"resourceVersion":"9"},"spec":{
			"headGroupSpec":{"template":{"spec":{"volumes":[{"name":"raysync-autoscaler-tls","secret":{"secretName":"client-tls"}}]}}},
			"autoscalerOptions":{"volumeMounts":[{"name":"raysync-autoscaler-tls","mountPath":"/etc/raysync/autoscaler-tls","readOnly":true}],
				"env":[{"name":"RAY_KUBERAY_CLIENT_CERT_PATH","value":"/etc/raysync/autoscaler-tls/tls.crt"},
					{"name":"RAY_KUBERAY_CLIENT_KEY_PATH","value":"/etc/raysync/autoscaler-tls/tls.key"},
					{"name":"KUBERNETES_SERVICE_HOST","value":"proxy.example"},{"name":"KUBERNETES_SERVICE_PORT_HTTPS","value":"6443"}]}}}`)},
		normal(rc, names.ReasonTemplatePatched, "pod templates now carry raysync's pull secrets / autoscaler TLS"),
	})
	if got.Status.AutoscalerTLS != names.StateOutOfSync || got.Status.PullSecret != "" {
		t.Errorf("status %+v", got.Status)
	}
}
