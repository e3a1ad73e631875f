package projection

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// markedAt is s with raysync's raced-reader mark of a write at t.
func markedAt(s *corev1.Secret, t time.Time) *corev1.Secret {
	s = s.DeepCopy()
	s.Annotations[names.WrittenUnderPodsAnnotation] = t.UTC().Format(time.RFC3339Nano)
	return s
}

// A kubelet can read a container's env just before raysync writes the Secret, or from a cache that has
// not seen the write yet, while raysync's own caches show the pod unbound or not at all (they lag the
// API server: raysync just restarted, or is busy; the pod's status may also keep the last attempt's
// waiting reason). So every write over a token is marked with its time, whatever the caches show, but
// a restart's (the cluster suspended, no pod left, so no kubelet can read it); and the pods whose
// containers started in the raced window are recycled, decided from their durable start times
// whenever the caches show them, so no cluster keeps a container on the token the Secret held before.
func TestWriteOverATokenRecyclesThoseThatMayHaveReadBefore(t *testing.T) {
	cfg := Config{Source: tokenSrc}
	seen := watchingSince(planNow.Add(-time.Hour))
	waiting := func(p *corev1.Pod) { onNode(p); pulling(p) }
	suspendedCluster := func(u *unstructured.Unstructured) { _ = unstructured.SetNestedField(u.Object, true, "spec", "suspend") }
	t.Run("every write over a token is marked, but a restart's", func(t *testing.T) {
		for name, tc := range map[string]struct {
			rc     *unstructured.Unstructured
			secret *corev1.Secret
			pods   []*corev1.Pod
			marked bool
		}{
			"a pod on a node pulls its image":                    {secret: kuberaysOld(), pods: []*corev1.Pod{rayPod("c1-head", "c1", waiting)}, marked: true},
			"the cache shows the pod unbound (it lags the node)": {secret: kuberaysOld(), pods: []*corev1.Pod{rayPod("c1-head", "c1")}, marked: true},
			"the cache shows no pod yet (just restarted)":        {secret: kuberaysOld(), marked: true},
			"a restart: suspended, no pod left":                  {rc: rayCluster("c1", suspendedCluster), secret: kuberaysOld()},
			"suspended, but the cache still shows a pod":         {rc: rayCluster("c1", suspendedCluster), secret: kuberaysOld(), pods: []*corev1.Pod{rayPod("c1-head", "c1")}, marked: true},
			"the Secret held no token (nothing to read)":         {secret: secret(ns, "c1", nil, ownedBy("c1")), pods: []*corev1.Pod{rayPod("c1-head", "c1", waiting)}},
		} {
			t.Run(name, func(t *testing.T) {
				rc := tc.rc
				if rc == nil {
					rc = rayCluster("c1")
				}
				in := input(cfg, rc, []*corev1.Secret{sourceSecret(token)}, target(tc.secret), pods(tc.pods...), seen)
				want := withToken(tc.secret, []byte(token), tokenSrc, planNow)
				if tc.marked {
					want = markedAt(want, planNow)
				}
				got := planCluster(in, cfg.withDefaults())
				checkPlan(t, got, []Action{UpdateSecret{Secret: want, Propagates: true, MarksRace: tc.marked},
					normal(in.Cluster, names.ReasonTokenProjected, "auth Secret now holds the canonical token from raysync-system/ray-token")})
			})
		}
	})

	// The case: a write sent at .95 of its second; the kubelet sees it 100 ms later and takes
	// 1 s to create the container, which starts 2 s after the write's second. The window used to end
	// there (the write's second + 1 s + createLatency).
	written := planNow.Add(-40*time.Second + 950*time.Millisecond) // its pods past RecycleGrace now
	second := written.Truncate(time.Second)
	until := written.Add(raceWindow)
	writtenUnder := func(opts ...func(*corev1.Secret)) *corev1.Secret {
		s := markedAt(withToken(kuberaysAt(second.Add(-5*time.Second)), []byte(token), tokenSrc, written), written)
		for _, o := range opts {
			o(s)
		}
		return s
	}
	createdBefore := func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(second.Add(-5 * time.Second)) }
	startedAt := func(at time.Time) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Status.Phase = corev1.PodRunning
			p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker",
				State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(at.Truncate(time.Second))}}}}
		}
	}
	recycled := func(rc *unstructured.Unstructured, p *corev1.Pod) []Action {
		return []Action{DeletePod{Pod: p, Missing: []string{names.RecycledAuthToken}}, normal(rc, names.ReasonPodRecycled, fmt.Sprintf(
			"deleted pod %s: a container started before %s, within 3s of raysync's write of the canonical token into Secret c1, and may hold the token "+
				"the Secret held before; KubeRay recreates it on the canonical token", p.Name, until.UTC().Format(time.RFC3339)))}
	}
	tests := map[string]struct {
		secret  *corev1.Secret
		pod     *corev1.Pod
		recycle bool
	}{
		"started in the write's second":        {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second)), recycle: true},
		"seen 100 ms late, created in 1 s":     {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(written.Add(1100*time.Millisecond))), recycle: true},
		"the node's clock 0.5 s ahead as well": {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(written.Add(1600*time.Millisecond))), recycle: true},
		"started after the window: kept":       {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(until.Add(time.Second)))},
		"started before the write (unseen by the cache)": {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second.Add(-time.Second))),
			recycle: true},
		"started before the Secret existed: kept (it read an earlier one)": {secret: writtenUnder(func(s *corev1.Secret) {
			s.CreationTimestamp = metav1.NewTime(second.Add(-time.Second))
		}), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second.Add(-3*time.Second)))},
		"an init container started early": {secret: writtenUnder(), recycle: true, pod: rayPod("c1-worker", "c1", onNode, createdBefore,
			startedAt(until.Add(5*time.Second)), func(p *corev1.Pod) {
				p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "wait-gcs-ready", State: corev1.ContainerState{
					Terminated: &corev1.ContainerStateTerminated{StartedAt: metav1.NewTime(second.Add(time.Second)), ExitCode: 0}}}}
			})},
		"created after the write, started in the window (a kubelet's cache may lag)": {secret: writtenUnder(), recycle: true, pod: rayPod("c1-head", "c1", onNode,
			func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(second.Add(time.Second)) }, startedAt(second.Add(time.Second)))},
		"created once every kubelet saw the write: kept": {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode,
			func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(second.Add(3 * time.Second)) }, startedAt(second.Add(3*time.Second)))},
		"a mark of raysync 0.2 (\"true\"): its window from synced-at": {secret: writtenUnder(withSecretAnnotation(names.WrittenUnderPodsAnnotation, "true")),
			pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second)), recycle: true},
		"a write without the mark (a restart's): kept": {secret: withToken(kuberaysOld(), []byte(token), tokenSrc, written),
			pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second))},
		"being deleted: kept": {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second),
			func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: planNow} })},
		"not the cluster's pod: kept": {secret: writtenUnder(), pod: rayPod("c1-head", "c1", onNode, createdBefore, startedAt(second),
			func(p *corev1.Pod) { p.OwnerReferences[0].UID = "someone-else" })},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := input(cfg, rayCluster("c1"), []*corev1.Secret{sourceSecret(token)}, target(tc.secret), pods(tc.pod), seen)
			got := planCluster(in, cfg.withDefaults())
			var want []Action
			if tc.recycle {
				want = recycled(in.Cluster, tc.pod)
			}
			checkPlan(t, got, want)
			if got.Status.Token != names.StateInSync {
				t.Errorf("state %q, want in sync", got.Status.Token)
			}
		})
	}

	// A raced pod is deleted only once RecycleGrace old (KubeRay stalls the recreation of a pod it has
	// not seen yet): a younger one is looked at again then.
	t.Run("younger than RecycleGrace: looked at again, not deleted yet", func(t *testing.T) {
		young := rayPod("c1-head", "c1", onNode, func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(planNow.Add(-2 * time.Second)) },
			startedAt(planNow.Add(-time.Second)))
		s := markedAt(withToken(kuberaysAt(planNow.Add(-3*time.Second)), []byte(token), tokenSrc, planNow.Add(-2*time.Second)), planNow.Add(-2*time.Second))
		in := input(cfg, rayCluster("c1"), []*corev1.Secret{sourceSecret(token)}, target(s), pods(young), seen)
		got := planCluster(in, cfg.withDefaults())
		checkPlan(t, got, nil)
		if got.RequeueAfter <= 0 || got.RequeueAfter > RecycleGrace {
			t.Errorf("RequeueAfter %s, want the rest of RecycleGrace", got.RequeueAfter)
		}
	})

	// KubeRay creates no pod of a group while it expects one it created and has not seen (up to 30 s):
	// a raced pod deleted at 29 s, before KubeRay's reconcile found it in its cache, left a head
	// missing for minutes (TestFleetRotation, v1.5.1, under CI load, when RecycleGrace was 5 s).
	t.Run("29 s old, inside KubeRay's expectation timeout: not deleted yet", func(t *testing.T) {
		created := planNow.Add(-29 * time.Second)
		pod := rayPod("c1-head", "c1", onNode, func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(created) }, startedAt(created.Add(time.Second)))
		s := markedAt(withToken(kuberaysAt(created.Add(-time.Second)), []byte(token), tokenSrc, created.Add(time.Second)), created.Add(time.Second))
		in := input(cfg, rayCluster("c1"), []*corev1.Secret{sourceSecret(token)}, target(s), pods(pod), seen)
		got := planCluster(in, cfg.withDefaults())
		checkPlan(t, got, nil)
		if got.RequeueAfter != 6*time.Second {
			t.Errorf("RequeueAfter %s, want 6s (when it is 35 s old)", got.RequeueAfter)
		}
	})

	// raysync restarted with caches that lag: its pod cache shows the head unbound while the kubelet
	// has read KubeRay's random token. The write is marked all the same, and once the caches show the
	// head's container started (in the window), it is recycled: before, the write went unmarked and
	// the head ran on the random token for ever (issue 25's TestFleetRotation failure).
	t.Run("the pod cache behind: write, then recycle once the start shows", func(t *testing.T) {
		unbound := rayPod("c1-head", "c1", func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(planNow.Add(-2 * time.Second)) })
		in := input(cfg, rayCluster("c1"), []*corev1.Secret{sourceSecret(token)}, target(kuberaysOld()), pods(unbound), seen)
		first := planCluster(in, cfg.withDefaults())
		w := first.Actions[0].(UpdateSecret)
		if !w.MarksRace || w.Secret.Annotations[names.WrittenUnderPodsAnnotation] == "" {
			t.Fatalf("the write under a pod the cache shows unbound is not marked: %+v", w)
		}
		later := planNow.Add(RecycleGrace)
		started := rayPod("c1-head", "c1", onNode, func(p *corev1.Pod) { p.CreationTimestamp = unbound.CreationTimestamp }, startedAt(planNow.Add(time.Second)))
		in = input(cfg, rayCluster("c1"), []*corev1.Secret{sourceSecret(token)}, target(w.Secret), pods(started), seen, func(in *ClusterInput) { in.Now = later })
		got := planCluster(in, cfg.withDefaults())
		if len(got.Actions) == 0 || got.Actions[0].(DeletePod).Pod != started {
			t.Errorf("the head that started on KubeRay's token is not recycled: %v", got.Actions)
		}
	})
}
