package e2e

import (
	"encoding/json"
	"fmt"
	"github.com/raysync/raysync/internal/names"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/kuberay"
)

// A platform team runs raysync as releases of the chart: several side by side, upgraded in place from
// the previous release, and uninstalled.

// chartArgs are the raysync container's args in a rendered chart, with what only a pod can serve
// (ports on every interface) replaced by loopback, and the webhook at webhookPort when it has one.
func chartArgs(t *testing.T, rendered string, webhookPort int) []string {
	t.Helper()
	for _, o := range renderedObjects(t, rendered) {
		if o.GetKind() != "Deployment" {
			continue
		}
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		var out []string
		for _, a := range containers[0].(map[string]any)["args"].([]any) {
			s := a.(string)
			switch {
			case strings.HasPrefix(s, "--metrics-bind-address="), strings.HasPrefix(s, "--health-probe-bind-address="):
				continue // StartSyncerAs serves them on loopback
			case strings.HasPrefix(s, "--webhook-addr="):
				s = fmt.Sprintf("--webhook-addr=127.0.0.1:%d", webhookPort)
			}
			out = append(out, s)
		}
		return out
	}
	t.Fatal("no Deployment in the rendered chart")
	return nil
}

// installRelease renders the chart as release in rel with set, applies it and starts raysync as the
// Deployment would run it: its args, its ServiceAccount, POD_NAMESPACE rel.
func (e *Env) installRelease(release, rel string, set ...string) *Syncer {
	e.t.Helper()
	args := []string{"template", release, chart, "--namespace", rel}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := helm(e.t, args...)
	if err != nil {
		e.t.Fatalf("helm template: %v\n%s", err, out)
	}
	e.kubectlApply(out)
	e.t.Cleanup(func() { e.kubectlDeleteClusterScoped(out) })
	kubeconfig, _ := e.serviceAccountKubeconfig(rel, release+"-raysync")
	return e.StartSyncerAs(kubeconfig, append(chartArgs(e.t, out, 0), "--leader-election-namespace="+rel, "--leader-election-retry-period=500ms")...)
}

// TestTwoReleasesSideBySide: two releases in one namespace, one per tenant token, each scoped to its
// own namespaces. Each holds a Lease of its own (both lead), keeps a ledger of its own, gives its
// clusters its token and rotates only its own clusters. This is how one control plane gets per-tenant
// canonical tokens.
func TestTwoReleasesSideBySide(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	rel := env.Namespace()
	type tenant struct{ release, src, ns, token string }
	tenants := []*tenant{{release: "tenant-a"}, {release: "tenant-b"}}
	syncers := map[string]*Syncer{}
	for _, tn := range tenants {
		tn.src, tn.ns, tn.token = env.Namespace(), env.Namespace(), env.NewToken()
		env.PutSource(tn.src, "ray-token", tokenData(tn.token))
		syncers[tn.release] = env.installRelease(tn.release, rel, "authSource.namespace="+tn.src, "authSource.name=ray-token",
			"namespaces={"+tn.ns+"}", "rbac.scope=namespaces", "webhook.enabled=false", "rotation.policies.rayCluster=restart")
	}
	for _, tn := range tenants {
		syncers[tn.release].WaitMetric("raysync_leader", nil, 1, 60*time.Second)
		lease, err := env.Kube.CoordinationV1().Leases(rel).Get(env.ctx, tn.release+"-raysync", metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			t.Fatalf("%s: no Lease of its own: %v", tn.release, err)
		}
		env.CreateRayCluster(rayCluster(tn.ns, "c"))
	}
	for _, tn := range tenants {
		env.WaitPodsReady(tn.ns, kuberay.ClusterLabel+"=c", 2, 60*time.Second)
		env.WaitSecret(tn.ns, "c", 30*time.Second, holds(tn.token))
		env.AssertStartedWith(tn.ns, tn.token, "c")
	}
	b := tenants[1]
	untouched := env.WaitSecret(b.ns, "c", time.Second, nil)

	// Tenant a rotates: only its cluster restarts.
	a := tenants[0]
	a.token = env.NewToken()
	env.PutSource(a.src, "ray-token", tokenData(a.token))
	env.WaitEvent(a.ns, "c", "RotationCompleted", 2*time.Minute)
	env.WaitSecret(a.ns, "c", 10*time.Second, holds(a.token))
	if cur := env.WaitSecret(b.ns, "c", time.Second, nil); cur.ResourceVersion != untouched.ResourceVersion {
		t.Error("tenant b's cluster Secret changed when tenant a rotated")
	}
	if evs, _ := env.Kube.CoreV1().Events(b.ns).List(env.ctx, metav1.ListOptions{FieldSelector: "reason=RotationStarted"}); len(evs.Items) > 0 {
		t.Error("tenant b's cluster was rotated by tenant a's rotation")
	}
	for tn, want := range map[*tenant]int{a: 2, b: 1} {
		l, err := env.Kube.CoreV1().Secrets(rel).Get(env.ctx, tn.release+"-raysync-rotations", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s's ledger: %v", tn.release, err)
		}
		var rotations []json.RawMessage
		_ = json.Unmarshal(l.Data["rotations.json"], &rotations)
		if len(rotations) != want {
			t.Errorf("%s's ledger holds %d rotations, want %d", tn.release, len(rotations), want)
		}
	}
	if _, err := env.Kube.CoreV1().Secrets(rel).Get(env.ctx, "raysync-rotations", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Error("a shared ledger raysync-rotations exists")
	}
	// Each exports its own clusters only.
	if v, _ := syncers[b.release].Metric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "current"}); v != 1 {
		t.Errorf("tenant b reports %v current clusters, want its one", v)
	}
}

// TestUpgradeFromThePreviousRelease: a running install of chart 0.1.0 (e2e/testdata/chart-0.1.0.yaml,
// as helm installed it) with what it made — the rotation ledger, copies, a webhook certificate Secret
// without the mark 0.1.0 did not write, and a restart it left half done — is upgraded to the chart in the
// tree. The new raysync is ready (the certificate is adopted, no rollout stalls), finishes the restart,
// keeps the ledger and the copies as they are, and the upgrade starts no rotation.
func TestUpgradeFromThePreviousRelease(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	rel, src, ns := env.Namespace(), env.Namespace(), env.Namespace()
	t1 := env.NewToken()
	env.PutSource(src, "ray-token", tokenData(t1))
	env.PutSecret(src, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
	b, err := os.ReadFile(filepath.Join("testdata", "chart-0.1.0.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	old := strings.NewReplacer("release-ns", rel, "source-ns", src, "target-ns", ns).Replace(string(b))
	env.kubectlApply(old)
	t.Cleanup(func() { env.kubectlDeleteClusterScoped(old) })
	kubeconfig, _ := env.serviceAccountKubeconfig(rel, "raysync")
	port := freePort(t)
	// --control=-: 0.1.0 had no control ConfigMap (and its Roles grant none; the binary here would read
	// that as paused).
	oldArgs := append(chartArgs(t, old, port), "--leader-election-namespace="+rel, "--leader-election-retry-period=500ms", "--control=-")
	s := env.StartSyncerAs(kubeconfig, oldArgs...)
	env.CreateRayCluster(rayCluster(ns, "held"))
	env.CreateRayCluster(rayCluster(ns, "restarting", withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})))
	pods := append(env.WaitPodsReady(ns, kuberay.ClusterLabel+"=held", 2, time.Minute), env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarting", 2, time.Minute)...)
	env.waitForNextSecond(pods)
	t2 := env.NewToken()
	env.PutSource(src, "ray-token", tokenData(t2))
	// The old release stops in the middle of the restart: the cluster is suspended, its pods gone.
	env.waitNoPods(ns, "restarting", time.Minute)
	s.Kill()
	cert, err := env.Kube.CoreV1().Secrets(rel).Get(env.ctx, "raysync-webhook-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cert.Annotations = nil // 0.1.0 wrote no mark
	if _, err := env.Kube.CoreV1().Secrets(rel).Update(env.ctx, cert, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	ledger := env.WaitSecret(rel, "raysync-rotations", time.Second, nil)
	copyBefore := env.WaitSecret(ns, "regcred", time.Second, nil)
	heldBefore := env.WaitSecret(ns, "held", time.Second, nil)

	// helm upgrade: the chart in the tree, the same values.
	out, err := helm(t, "template", "raysync", chart, "--namespace", rel, "--set", "authSource.namespace="+src+",authSource.name=ray-token,namespaces={"+ns+"},rbac.scope=namespaces,pullSecrets={"+src+"/regcred}")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	env.kubectlApply(out)
	kubeconfig, _ = env.serviceAccountKubeconfig(rel, "raysync")
	s = env.StartSyncerAs(kubeconfig, append(chartArgs(t, out, port), "--leader-election-namespace="+rel, "--leader-election-retry-period=500ms")...) // ready: no stall
	env.WaitEvent(ns, "restarting", "RotationCompleted", 2*time.Minute)
	env.WaitSecret(ns, "restarting", 10*time.Second, holds(t2))
	if cur := env.WaitSecret(rel, "raysync-rotations", time.Second, nil); string(cur.Data["rotations.json"]) != string(ledger.Data["rotations.json"]) {
		t.Error("the upgrade changed the rotation ledger: it started a rotation of its own")
	}
	if cur := env.WaitSecret(ns, "regcred", time.Second, nil); cur.ResourceVersion != copyBefore.ResourceVersion {
		t.Error("the upgrade rewrote a copy")
	}
	if cur := env.WaitSecret(ns, "held", time.Second, nil); cur.ResourceVersion != heldBefore.ResourceVersion {
		t.Error("the upgrade rewrote a held cluster's Secret")
	}
	if adopted := env.WaitSecret(rel, "raysync-webhook-tls", time.Second, nil); adopted.Annotations["raysync.dev/kind"] != "webhook_certificate" {
		t.Error("the previous release's webhook certificate Secret was not adopted")
	}
	if evs, _ := env.Kube.CoreV1().Events(ns).List(env.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=held,reason=RotationStarted"}); len(evs.Items) > 0 {
		t.Error("the upgrade rotated the held cluster")
	}
	s.WaitMetric("raysync_rotation_clusters", map[string]string{"kind": "RayCluster", "state": "behind"}, 1, 30*time.Second)
}

// TestUninstallLeavesNothingOfRaysync: raysync stopped in the middle of a restart; `syncer uninstall`
// lists what it would do without doing it, then with --yes resumes the suspended cluster, removes
// raysync's marks, deletes its copies that no RayCluster names (keeping, and saying so, the one a
// cluster still names) and its own objects, and never touches a Secret it does not own.
func TestUninstallLeavesNothingOfRaysync(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	src, ns, gone := env.Namespace(), env.Namespace(), env.Namespace()
	t1 := env.NewToken()
	env.PutSource(src, "ray-token", tokenData(t1))
	env.PutSecret(src, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: ns}, Data: map[string][]byte{"k": []byte("v")}}
	theirs, err := env.Kube.CoreV1().Secrets(ns).Create(env.ctx, theirs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	flags := []string{"--auth-source=" + src + "/ray-token", "--namespaces=" + ns + "," + gone, "--pull-secret=" + src + "/regcred"}
	s := env.StartSyncer(append(flags, "--prune=false")...) // a copy no cluster names any more is left behind
	env.CreateRayCluster(rayCluster(ns, "restarting", withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})))
	env.CreateRayCluster(rayCluster(gone, "deleted-later"))
	env.WaitSecret(gone, "regcred", 30*time.Second, nil)
	pods := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarting", 2, time.Minute)
	env.DeleteRayCluster(gone, "deleted-later")
	env.waitForNextSecond(pods)
	env.PutSource(src, "ray-token", tokenData(env.NewToken()))
	env.waitNoPods(ns, "restarting", time.Minute)
	s.Kill()

	out, code := env.uninstall(flags...)
	if code != 1 || !strings.Contains(out, "would resume RayCluster "+ns+"/restarting") || !strings.Contains(out, "would delete Secret "+gone+"/regcred") ||
		!strings.Contains(out, "keep Secret "+ns+"/regcred") || !strings.Contains(out, "would delete Secret "+src+"/raysync-rotations") ||
		!strings.Contains(out, "dry run") {
		t.Fatalf("syncer uninstall (dry run): exit %d\n%s", code, out)
	}
	if rc := env.GetRayCluster(ns, "restarting"); !suspendedCluster(rc) {
		t.Fatal("the dry run changed the cluster")
	}
	out, code = env.uninstall(append(flags, "--yes")...)
	if code != 1 || !strings.Contains(out, "resume RayCluster "+ns+"/restarting") {
		t.Fatalf("syncer uninstall --yes: exit %d (want 1: a copy is still named)\n%s", code, out)
	}
	rc := env.GetRayCluster(ns, "restarting")
	if suspendedCluster(rc) {
		t.Error("the cluster raysync suspended is still suspended")
	}
	for _, a := range []string{"raysync.dev/rotation-started", "raysync.dev/rotation-target"} {
		if _, ok := rc.GetAnnotations()[a]; ok {
			t.Errorf("annotation %s left on the cluster", a)
		}
	}
	env.WaitPodsReady(ns, kuberay.ClusterLabel+"=restarting", 2, time.Minute)
	for _, n := range []types.NamespacedName{{Namespace: gone, Name: "regcred"}, {Namespace: src, Name: "raysync-rotations"}} {
		if _, err := env.Kube.CoreV1().Secrets(n.Namespace).Get(env.ctx, n.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s is left", n)
		}
	}
	for _, n := range []types.NamespacedName{{Namespace: ns, Name: "regcred"}, {Namespace: ns, Name: "theirs"}, {Namespace: src, Name: "ray-token"}, {Namespace: src, Name: "regcred"}} {
		if _, err := env.Kube.CoreV1().Secrets(n.Namespace).Get(env.ctx, n.Name, metav1.GetOptions{}); err != nil {
			t.Errorf("Secret %s was deleted: %v", n, err)
		}
	}
	// The foreign Secret was not touched at all, not merely left in place.
	if cur, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "theirs", metav1.GetOptions{}); err != nil || cur.ResourceVersion != theirs.ResourceVersion {
		t.Errorf("the foreign Secret was written (resourceVersion %s, was %s): %v", cur.GetResourceVersion(), theirs.ResourceVersion, err)
	}
	// Nothing left that raysync's labels or annotations mark, but what is kept on purpose: the copy a
	// cluster still names, and the rotation number in a RayService's template (removing it would start an
	// upgrade). The annotations users set (raysync.dev/rotation, skip, adopt) are theirs. (A cluster's auth
	// Secret, KubeRay's, keeps raysync's digest mark: it goes with its cluster, as the uninstall guide says.)
	usersOwn := map[string]bool{names.RotationAnnotation: true, names.SkipAnnotation: true, names.AdoptAnnotation: true}
	for _, n := range []string{src, ns, gone} {
		for _, gvr := range []schema.GroupVersionResource{kuberay.RayClusterGVR, kuberay.RayServiceGVR, kuberay.RayJobGVR} {
			l, err := env.Dynamic.Resource(gvr).Namespace(n).List(env.ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range l.Items {
				for k := range o.GetAnnotations() {
					if strings.HasPrefix(k, "raysync.dev/") && !usersOwn[k] {
						t.Errorf("%s %s/%s still carries %s", o.GetKind(), n, o.GetName(), k)
					}
				}
			}
		}
		secrets, err := env.Kube.CoreV1().Secrets(n).List(env.ctx, metav1.ListOptions{LabelSelector: names.ManagedByLabel})
		if err != nil {
			t.Fatal(err)
		}
		for _, sec := range secrets.Items {
			if !(n == ns && sec.Name == "regcred") {
				t.Errorf("Secret %s/%s still carries raysync's label", n, sec.Name)
			}
		}
	}
	if out, code := env.uninstall(append(flags, "--yes")...); code != 1 || strings.Contains(out, "delete") {
		t.Errorf("a second uninstall: exit %d\n%s", code, out)
	}
}

func suspendedCluster(rc *unstructured.Unstructured) bool {
	v, _, _ := unstructured.NestedBool(rc.Object, "spec", "suspend")
	return v
}

// uninstall runs `syncer uninstall` with the admin kubeconfig.
func (e *Env) uninstall(args ...string) (string, int) { return e.syncerCLI("uninstall", args...) }

func freePort(t *testing.T) int {
	t.Helper()
	p, err := freePortPair()
	if err != nil {
		t.Fatal(err)
	}
	return p[0]
}
