package e2e

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/internal/kuberay"
)

// NewToken returns a random token, registered so no test passes if raysync ever prints it.
func (e *Env) NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return e.Secret(base64.RawURLEncoding.EncodeToString(b))
}

// PutSource creates or replaces the canonical (Opaque) Secret's data.
func (e *Env) PutSource(ns, name string, data map[string][]byte) {
	e.t.Helper()
	e.PutSecret(ns, name, corev1.SecretTypeOpaque, data)
}

// NamespaceWithToken creates a namespace holding the canonical Secret "ray-token" with a new token.
func (e *Env) NamespaceWithToken() (ns, token string) {
	e.t.Helper()
	ns, token = e.Namespace(), e.NewToken()
	e.PutSource(ns, "ray-token", tokenData(token))
	return ns, token
}

// NamespaceWithTokenNotStarted is NamespaceWithToken where no pod ever starts: every cluster takes
// each new token at once (a running one keeps the token it started with; see rotation_test.go).
func (e *Env) NamespaceWithTokenNotStarted() (ns, token string) {
	e.t.Helper()
	ns, token = e.NamespaceWithoutKubelet(), e.NewToken()
	e.PutSource(ns, "ray-token", tokenData(token))
	return ns, token
}

func tokenData(v string) map[string][]byte { return map[string][]byte{"auth_token": []byte(v)} }

func holds(v string) func(*corev1.Secret) bool {
	return func(s *corev1.Secret) bool { return string(s.Data[kuberay.AuthTokenKey]) == v }
}

// raceResult is what happened to one new cluster's auth Secret.
type raceResult struct {
	creator string        // field manager of the first version: "raysync" or KubeRay's
	delay   time.Duration // from the Secret's first watch event to it holding the canonical token
}

// watchRace follows a Secret from its creation until it holds token.
func (e *Env) watchRace(ns, name, token string) <-chan raceResult {
	w, err := e.Kube.CoreV1().Secrets(ns).Watch(e.ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		e.t.Fatal(err)
	}
	ch := make(chan raceResult, 1)
	go func() {
		defer w.Stop()
		var first time.Time
		var creator string
		for ev := range w.ResultChan() {
			s, ok := ev.Object.(*corev1.Secret)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			if first.IsZero() {
				first = time.Now()
				creator = "?"
				if len(s.ManagedFields) > 0 {
					creator = s.ManagedFields[0].Manager
				}
			}
			if string(s.Data[kuberay.AuthTokenKey]) == token {
				ch <- raceResult{creator: creator, delay: time.Since(first)}
				return
			}
		}
	}()
	return ch
}

func TestProjectsCanonicalTokenIntoNewClusters(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, token := env.NamespaceWithToken()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)

		const n = 5
		results := make([]<-chan raceResult, n)
		for i := range n {
			name := fmt.Sprintf("new-%d", i)
			results[i] = env.watchRace(ns, name, token)
			env.CreateRayCluster(rayCluster(ns, name))
		}
		raysyncFirst := 0
		for i := range n {
			select {
			case r := <-results[i]:
				if r.creator == "raysync" {
					raysyncFirst++
				}
				t.Logf("MEASURE new-cluster kuberay=%s cluster=new-%d creator=%s delay_ms=%.2f", env.KubeRayVersion, i, r.creator, float64(r.delay.Microseconds())/1000)
			case <-time.After(30 * time.Second):
				t.Fatalf("new-%d: Secret never held the canonical token", i)
			}
		}
		t.Logf("MEASURE new-cluster kuberay=%s raysync_first=%d/%d", env.KubeRayVersion, raysyncFirst, n)
		for i := range n {
			name := fmt.Sprintf("new-%d", i)
			// KubeRay's pods read exactly that Secret, and KubeRay left the token alone.
			for _, p := range env.WaitPods(ns, name, 2, 30*time.Second) {
				if ref, _ := authTokenSecretRef(p.Spec.Containers[0]); ref != name {
					t.Errorf("pod %s reads RAY_AUTH_TOKEN from %q, want %q", p.Name, ref, name)
				}
			}
			sec := env.WaitSecret(ns, name, 5*time.Second, holds(token))
			if sec.Annotations["raysync.dev/source"] != ns+"/ray-token" || len(sec.Annotations["raysync.dev/token-sha256"]) != 16 || sec.Annotations["raysync.dev/synced-at"] == "" {
				t.Errorf("%s: raysync annotations missing: %v", name, sec.Annotations)
			}
			s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": name}, 1, 10*time.Second)
		}
		s.WaitMetric("raysync_targets", map[string]string{"state": "in_sync"}, n, 10*time.Second)
		if ev := env.Events(ns, "raysync", ""); len(warnings(ev)) > 0 {
			t.Errorf("unexpected Warning Events: %v", warnings(ev))
		}
		if v, _ := s.Metric("raysync_propagation_seconds", nil); v < 1 {
			t.Errorf("raysync_propagation_seconds has no observations")
		}
	})
}

// TestRayServiceBlueGreenKeepsOneToken runs a RayService's blue-green upgrade to the end with Ray in
// the loop: the first cluster becomes Ready and serves, a spec change brings up a second cluster
// that becomes ready, traffic switches to it, the first is deleted after its deletion delay, and
// every container of both clusters started with the canonical token.
func TestRayServiceBlueGreenKeepsOneToken(t *testing.T) {
	t.Parallel() // with the other Ray-in-the-loop tests, after the serial ones: each in namespaces of its own
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ray := env.StandIn()
		ns, token := env.NamespaceWithToken()
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)

		svc := rayService(ns, "serve", "v1")
		start := time.Now()
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		blue := env.WaitServiceClusters(ns, "serve", 1, nil)[0].GetName()
		env.WaitSecret(ns, kuberay.CheckName(blue), 30*time.Second, holds(token))
		env.WaitRayServiceReady(ns, "serve", 120*time.Second, func(active string) bool { return active == blue })
		ready := time.Since(start)
		env.assertServesFrom(ns, "serve", blue)

		// Changing rayClusterConfig makes KubeRay prepare a new cluster with a new generated name.
		upgrade := time.Now()
		env.PatchRayService(ns, "serve", `{"spec":{"rayClusterConfig":{"headGroupSpec":{"template":{"metadata":{"labels":{"version":"v2"}}}}}}}`)
		green := env.WaitServiceClusters(ns, "serve", 1, func(rc *unstructured.Unstructured) bool { return rc.GetName() != blue })[0].GetName()
		env.WaitSecret(ns, kuberay.CheckName(green), 30*time.Second, holds(token))
		env.WaitRayServiceReady(ns, "serve", 120*time.Second, func(active string) bool { return active == green })
		switched := time.Since(upgrade)
		env.assertServesFrom(ns, "serve", green)

		// The old cluster goes after rayClusterDeletionDelaySeconds; its Secret is garbage-collected with it.
		err := wait.PollUntilContextTimeout(env.ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(ctx, blue, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Fatalf("old cluster %s never deleted", blue)
		}
		deleted := time.Since(upgrade)
		t.Logf("MEASURE blue-green kuberay=%s first_ready_s=%.1f switch_s=%.1f old_cluster_deleted_s=%.1f (deletion delay 3s)",
			env.KubeRayVersion, ready.Seconds(), switched.Seconds(), deleted.Seconds())
		// Its Secret goes by garbage collection (up to ~40 s late right after the control plane starts).
		env.WaitSecretGone(ns, kuberay.CheckName(blue), 90*time.Second)

		env.AssertStartedWith(ns, token, blue, green)
		for _, c := range []string{blue, green} {
			st, err := ray.Stats(env.ctx, ns, c)
			if err != nil {
				t.Fatal(err)
			}
			if op := st.Requests["operator"]; op.Accepted == 0 || op.Rejected() != 0 {
				t.Errorf("cluster %s: operator requests %+v, want accepted and none refused", c, op)
			}
			if st.JoinFailures != 0 {
				t.Errorf("cluster %s: %d GCS join failures", c, st.JoinFailures)
			}
		}
		// The operator reached the heads' Serve proxies at their pod IPs, and only through the proxy:
		// nothing else answers for 198.19.0.0/16, and its sockets all lead to loopback.
		px, err := ray.ProxyStats(env.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if px["operator"].ToPodIP == 0 || px["operator"].ToService == 0 {
			t.Errorf("operator traffic through the stand-in's proxy: %+v", px["operator"])
		}
		env.assertLoopbackOnly("kuberay-operator")
		if ev := warnings(env.Events(ns, "raysync", "")); len(ev) > 0 {
			t.Errorf("unexpected Warning Events: %v", ev)
		}
	})
}

// assertServesFrom checks that the RayService's head and serve Services select cluster, and that
// its application answers through the serve Service.
func (e *Env) assertServesFrom(ns, svc, cluster string) {
	e.t.Helper()
	for _, name := range []string{svc + "-head-svc", svc + "-serve-svc"} {
		s, err := e.Kube.CoreV1().Services(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		if got := s.Spec.Selector[kuberay.ClusterLabel]; got != cluster {
			e.t.Errorf("Service %s selects cluster %q, want %q", name, got, cluster)
		}
	}
	if code := e.rayGet(fmt.Sprintf("http://%s-serve-svc.%s.svc.cluster.local:8000/fruit/mango", svc, ns), nil); code != http.StatusOK {
		e.t.Errorf("the Serve application answered HTTP %d through %s-serve-svc", code, svc)
	}
}

func TestReferencedSecretName(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if !env.SupportsSecretName() {
			t.Skip("authOptions.secretName needs KubeRay v1.6+")
		}
		ns, token := env.NamespaceWithToken()
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)

		env.CreateRayCluster(rayCluster(ns, "ref-a", withSecretName("shared")))
		env.CreateRayCluster(rayCluster(ns, "ref-b", withSecretName("shared")))
		copySecret := env.WaitSecret(ns, "shared", 30*time.Second, holds(token))
		if copySecret.Labels["raysync.dev/managed-by"] != "raysync" || len(copySecret.OwnerReferences) != 0 {
			t.Errorf("managed copy: labels %v, owners %v", copySecret.Labels, copySecret.OwnerReferences)
		}
		// Pointing at the source itself: nothing to write.
		src, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "ray-token", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env.CreateRayCluster(rayCluster(ns, "ref-src", withSecretName("ray-token")))
		env.WaitPods(ns, "ref-src", 2, 30*time.Second)

		// The copy stays while one referencing cluster remains, and is pruned after the last.
		env.DeleteRayCluster(ns, "ref-a")
		time.Sleep(2 * time.Second)
		env.WaitSecret(ns, "shared", time.Second, holds(token))
		env.DeleteRayCluster(ns, "ref-b")
		env.WaitSecretGone(ns, "shared", 30*time.Second)

		after, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "ray-token", metav1.GetOptions{})
		if err != nil || after.ResourceVersion != src.ResourceVersion {
			t.Errorf("raysync wrote the source Secret (resourceVersion %s -> %s, err %v)", src.ResourceVersion, after.ResourceVersion, err)
		}
		if ev := warnings(env.Events(ns, "raysync", "")); len(ev) > 0 {
			t.Errorf("unexpected Warning Events: %v", ev)
		}
	})
}

// TestRotationUpdatesEveryTargetOnce: clusters none of whose containers has started take a new
// token at once, each with exactly one write.
func TestRotationUpdatesEveryTargetOnce(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, token := env.NamespaceWithTokenNotStarted()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		const n = 6
		for i := range n {
			env.CreateRayCluster(rayCluster(ns, fmt.Sprintf("rot-%d", i)))
		}
		for i := range n {
			env.WaitSecret(ns, fmt.Sprintf("rot-%d", i), 30*time.Second, holds(token))
		}
		// Count writes to the targets from here on.
		w, err := env.Kube.CoreV1().Secrets(ns).Watch(env.ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel,
			ResourceVersion: env.secretListRV(ns)})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		writes := map[string]int{}
		var mu = make(chan struct{}, 1)
		mu <- struct{}{}
		go func() {
			for ev := range w.ResultChan() {
				if s, ok := ev.Object.(*corev1.Secret); ok && ev.Type == watch.Modified {
					<-mu
					writes[s.Name]++
					mu <- struct{}{}
				}
			}
		}()

		rotated := env.NewToken()
		start := time.Now()
		env.PutSource(ns, "ray-token", tokenData(rotated))
		for i := range n {
			env.WaitSecret(ns, fmt.Sprintf("rot-%d", i), 30*time.Second, holds(rotated))
		}
		t.Logf("MEASURE rotation kuberay=%s clusters=%d all_targets_ms=%d", env.KubeRayVersion, n, time.Since(start).Milliseconds())
		s.WaitMetric("raysync_source_rotations_total", map[string]string{"source": ns + "/ray-token"}, 1, 10*time.Second)

		// An annotation-only change of the source writes no target.
		src, _ := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "ray-token", metav1.GetOptions{})
		src.Annotations = map[string]string{"touched": "yes"}
		if _, err := env.Kube.CoreV1().Secrets(ns).Update(env.ctx, src, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second)
		<-mu
		defer func() { mu <- struct{}{} }()
		for i := range n {
			if got := writes[fmt.Sprintf("rot-%d", i)]; got != 1 {
				t.Errorf("rot-%d written %d times after the rotation, want exactly 1", i, got)
			}
		}
		if v, _ := s.Metric("raysync_source_rotations_total", map[string]string{"source": ns + "/ray-token"}); v != 1 {
			t.Errorf("rotations_total = %v after an annotation-only change, want 1", v)
		}
	})
}

func TestBadSourceLeavesTargetsUntouched(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, token := env.NamespaceWithTokenNotStarted()
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "bad"))
		target := env.WaitSecret(ns, "bad", 30*time.Second, holds(token))
		valid := map[string]string{"source": ns + "/ray-token"}

		cases := []struct {
			name string
			data map[string][]byte // nil: delete the source
		}{
			{"missing", nil},
			{"key missing", map[string][]byte{"token": []byte(env.NewToken())}},
			{"empty", map[string][]byte{"auth_token": {}}},
			{"trailing newline", map[string][]byte{"auth_token": []byte(env.Secret("newline-token-value") + "\n")}},
			{"control character", map[string][]byte{"auth_token": []byte("ctl\x01" + env.Secret("control-token-value"))}},
			{"over 4 KiB", map[string][]byte{"auth_token": []byte(strings.Repeat("x", 5000))}},
			{"not UTF-8", map[string][]byte{"auth_token": {0xff, 0xfe, 0xfd}}},
		}
		for _, c := range cases {
			if c.data == nil {
				if err := env.Kube.CoreV1().Secrets(ns).Delete(env.ctx, "ray-token", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			} else {
				env.PutSource(ns, "ray-token", c.data)
			}
			s.WaitMetric("raysync_source_valid", valid, 0, 10*time.Second)
			s.WaitMetric("raysync_targets", map[string]string{"state": "source_invalid"}, 1, 10*time.Second)
			env.WaitEventMessage(ns, "ray-token", "SourceInvalid", 10*time.Second, eventReasonHint(c.name))
			cur := env.WaitSecret(ns, "bad", time.Second, nil)
			if cur.ResourceVersion != target.ResourceVersion {
				t.Fatalf("%s: target written while the source was invalid", c.name)
			}
			// Back to valid between cases, so each case is a fresh transition.
			env.PutSource(ns, "ray-token", tokenData(token))
			s.WaitMetric("raysync_source_valid", valid, 1, 10*time.Second)
		}
		fixed := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(fixed))
		env.WaitSecret(ns, "bad", 30*time.Second, holds(fixed))
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": "bad"}, 1, 10*time.Second)
	})
}

func eventReasonHint(caseName string) string {
	switch caseName {
	case "missing":
		return "does not exist"
	case "key missing":
		return "missing"
	case "empty":
		return "empty"
	case "trailing newline":
		return "whitespace"
	case "control character":
		return "control characters"
	case "over 4 KiB":
		return "more than 4096"
	case "not UTF-8":
		return "UTF-8"
	}
	return ""
}

func TestForeignSecretIsNeverTouched(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns, _ := env.NamespaceWithToken()
		foreignToken := env.NewToken()
		foreign, err := env.Kube.CoreV1().Secrets(ns).Create(env.ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "foreign", Namespace: ns},
			Data:       tokenData(foreignToken),
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		env.CreateRayCluster(rayCluster(ns, "foreign"))
		env.WaitEvent(ns, "foreign", "TargetNotOwned", 30*time.Second)
		s.WaitMetric("raysync_targets", map[string]string{"state": "not_owned"}, 1, 10*time.Second)
		s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": "foreign"}, 0, 10*time.Second)
		cur := env.WaitSecret(ns, "foreign", time.Second, holds(foreignToken))
		if cur.ResourceVersion != foreign.ResourceVersion || len(cur.Annotations) != 0 {
			t.Errorf("raysync modified a Secret it does not own")
		}
	})
}

func TestDryRunAndScope(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		nsA, nsB := env.Namespace(), env.Namespace()
		token := env.NewToken()
		env.PutSource(nsA, "ray-token", tokenData(token))

		// --dry-run: KubeRay's random token stays, raysync only logs what it would do.
		dry := env.StartSyncer("--auth-source="+nsA+"/ray-token", "--namespaces="+nsA, "--dry-run")
		env.CreateRayCluster(rayCluster(nsA, "dry"))
		env.WaitPods(nsA, "dry", 2, 30*time.Second)
		waitOutput(t, dry, "dry-run: would update Secret", 10*time.Second)
		sec := env.WaitSecret(nsA, "dry", time.Second, nil)
		if holds(token)(sec) || sec.Annotations["raysync.dev/source"] != "" || len(sec.ManagedFields) != 1 {
			t.Errorf("--dry-run wrote the target")
		}
		if ev := env.Events(nsA, "raysync", ""); len(ev) > 0 {
			t.Errorf("--dry-run recorded Events: %v", ev)
		}
		dry.Stop()

		// Scope: only nsA, only clusters labelled team=a.
		env.StartSyncer("--auth-source="+nsA+"/ray-token", "--namespaces="+nsA, "--cluster-selector=team=a")
		env.CreateRayCluster(rayCluster(nsB, "other-ns", withLabels(map[string]string{"team": "a"})))
		env.CreateRayCluster(rayCluster(nsA, "unlabelled"))
		env.CreateRayCluster(rayCluster(nsA, "selected", withLabels(map[string]string{"team": "a"})))
		env.WaitSecret(nsA, "selected", 30*time.Second, holds(token))
		env.WaitPods(nsB, "other-ns", 2, 30*time.Second)
		env.WaitPods(nsA, "unlabelled", 2, 30*time.Second)
		time.Sleep(time.Second)
		for _, c := range []types.NamespacedName{{Namespace: nsB, Name: "other-ns"}, {Namespace: nsA, Name: "unlabelled"}} {
			if sec := env.WaitSecret(c.Namespace, c.Name, time.Second, nil); holds(token)(sec) || sec.Annotations["raysync.dev/source"] != "" {
				t.Errorf("out-of-scope cluster %s got the canonical token", c)
			}
		}
	})
}

func waitOutput(t *testing.T, s *Syncer, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(s.Output(), substr) {
		if time.Now().After(deadline) {
			t.Fatalf("raysync never logged %q", substr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func warnings(evs []corev1.Event) []string {
	var out []string
	for _, e := range evs {
		if e.Type == corev1.EventTypeWarning {
			out = append(out, e.Reason+": "+e.Message)
		}
	}
	return out
}
