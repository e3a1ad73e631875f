package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// External Secrets Operator set up as its documentation says to copy one Kubernetes Secret into
// many: a SecretStore with the kubernetes provider (service-account auth, a Role that may read
// Secrets in the source namespace) and one ExternalSecret per target with creationPolicy Merge into
// the Secret KubeRay generated. ESO runs with its own defaults (those of its Helm chart), cluster-wide.

var (
	esGVR = schema.GroupVersionResource{Group: "external-secrets.io", Version: "v1", Resource: "externalsecrets"}
	ssGVR = schema.GroupVersionResource{Group: "external-secrets.io", Version: "v1", Resource: "secretstores"}
)

// esoAgent prefixes the user agent of every request ESO makes: client-go derives it from the binary's name.
const esoAgent = "eso-"

// installESO installs ESO's CRDs (all of them: its controllers refuse to start without any).
func installESO(ctx context.Context, cp *framework.ControlPlane) string {
	bin, crds, err := framework.EnsureESO(ctx, func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) })
	check(err)
	files, err := filepath.Glob(filepath.Join(crds, "*_*.yaml"))
	check(err)
	check(framework.InstallCRDFiles(ctx, cp.Dynamic, files...))
	return bin
}

func startESO(cp *framework.ControlPlane, bin, logDir string) *proc {
	mp, err := framework.FreePort()
	check(err)
	logPath := filepath.Join(logDir, fmt.Sprintf("eso-%d.log", mp))
	f, err := os.Create(logPath)
	check(err)
	defer f.Close()
	cmd := exec.Command(bin, fmt.Sprintf("--metrics-addr=127.0.0.1:%d", mp), "--loglevel=error")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.Kubeconfig) // ESO and its kubernetes provider read it
	cmd.Stdout, cmd.Stderr = f, f
	return startProc(cmd, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp), logPath)
}

// esoSetup creates the SecretStore, its ServiceAccount and Role, and one ExternalSecret per target.
func (b *bench) esoSetup(refresh string) {
	ctx := context.Background()
	_, err := b.cp.Kube.CoreV1().ServiceAccounts(b.ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "eso-reader"}}, metav1.CreateOptions{})
	check(err)
	_, err = b.cp.Kube.RbacV1().Roles(b.ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "eso-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}}}}, metav1.CreateOptions{})
	check(err)
	_, err = b.cp.Kube.RbacV1().RoleBindings(b.ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "eso-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "eso-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "eso-reader", Namespace: b.ns}}}, metav1.CreateOptions{})
	check(err)
	ca := b.cp.Config.TLSClientConfig.CAData
	if len(ca) == 0 {
		ca, err = os.ReadFile(b.cp.Config.TLSClientConfig.CAFile)
		check(err)
	}
	store := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "external-secrets.io/v1", "kind": "SecretStore",
		"metadata": map[string]any{"name": "canonical", "namespace": b.ns},
		"spec": map[string]any{"provider": map[string]any{"kubernetes": map[string]any{
			"remoteNamespace": b.ns,
			"server":          map[string]any{"url": b.cp.Config.Host, "caBundle": ca},
			"auth":            map[string]any{"serviceAccount": map[string]any{"name": "eso-reader"}},
		}}}}}
	_, err = b.cp.Dynamic.Resource(ssGVR).Namespace(b.ns).Create(ctx, store, metav1.CreateOptions{})
	check(err)
	parallel(len(b.objs), 16, func(i int) {
		name := b.objs[i].Name
		es := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "external-secrets.io/v1", "kind": "ExternalSecret",
			"metadata": map[string]any{"name": name, "namespace": b.ns},
			"spec": map[string]any{
				"refreshInterval": refresh,
				"secretStoreRef":  map[string]any{"name": "canonical", "kind": "SecretStore"},
				"target":          map[string]any{"name": name, "creationPolicy": "Merge"},
				"data": []any{map[string]any{"secretKey": "auth_token",
					"remoteRef": map[string]any{"key": "ray-token", "property": "auth_token"}}},
			}}}
		_, err := b.cp.Dynamic.Resource(esGVR).Namespace(b.ns).Create(ctx, es, metav1.CreateOptions{})
		check(err)
	})
}

// esoRefresh sets every ExternalSecret's refreshInterval (a spec change: ESO reconciles each at once).
func (b *bench) esoRefresh(refresh string) {
	ctx := context.Background()
	patch := []byte(fmt.Sprintf(`{"spec":{"refreshInterval":%q}}`, refresh))
	parallel(len(b.objs), 16, func(i int) {
		_, err := b.cp.Dynamic.Resource(esGVR).Namespace(b.ns).Patch(ctx, b.objs[i].Name, types.MergePatchType, patch, metav1.PatchOptions{})
		check(err)
	})
}

// esoSynced waits until ESO has refreshed every ExternalSecret since `since` (its pass over all of
// them after a start) and each reports Ready, so a rotation that follows meets ESO in steady state.
func (b *bench) esoSynced(since time.Time, timeout time.Duration) {
	since = since.Truncate(time.Second) // refreshTime has second precision
	check(wait.PollUntilContextTimeout(context.Background(), time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Dynamic.Resource(esGVR).Namespace(b.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		synced := 0
		for _, es := range l.Items {
			at, _, _ := unstructured.NestedString(es.Object, "status", "refreshTime")
			t, err := time.Parse(time.RFC3339, at)
			if err != nil || t.Before(since) {
				continue
			}
			conds, _, _ := unstructured.NestedSlice(es.Object, "status", "conditions")
			for _, c := range conds {
				if m, _ := c.(map[string]any); m["type"] == "Ready" && m["status"] == "True" {
					synced++
				}
			}
		}
		return synced == len(b.objs), nil
	}))
}

// esoTeardown deletes the namespace's ExternalSecrets and SecretStore (their targets stay: ESO's
// default deletionPolicy is Retain) so a later ESO run does not reconcile them too.
func (b *bench) esoTeardown() {
	ctx := context.Background()
	check(b.cp.Dynamic.Resource(esGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	check(b.cp.Dynamic.Resource(ssGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	check(wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Dynamic.Resource(esGVR).Namespace(b.ns).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil && len(l.Items) == 0, nil
	}))
}

// sideBySide runs raysync and ESO alternately on the same N targets: rotation rounds of raysync and
// ESO at refreshInterval 10s, then ESO at its default 1h (a rotation it cannot see until the next
// refresh, so it is capped at limit1h), then ESO's idle cost at both intervals.
func (b *bench) sideBySide(r *esoResult, audit *auditLog, esoBin, logDir string, rounds int, idleFor, limit1h time.Duration) {
	n := r.N
	b.setup(n)
	b.esoSetup("10s")
	for round := 1; round <= rounds; round++ {
		s := b.startSyncer("--namespaces=" + b.ns)
		b.waitAll(n, b.token)
		r.Rotation = append(r.Rotation, sideRotation{"raysync", round, b.rotate(n, 0)})
		s.stop()

		started := time.Now()
		e := startESO(b.cp, esoBin, logDir)
		b.esoSynced(started, 10*time.Minute)
		r.Rotation = append(r.Rotation, sideRotation{"eso refresh 10s", round, b.rotate(n, 0)})
		if round == rounds {
			r.Idle = append(r.Idle, sideIdle{"eso refresh 10s", *b.idle(audit, esoAgent, n, idleFor)})
		}
		e.stop()
	}
	b.esoRefresh("1h")
	started := time.Now()
	e := startESO(b.cp, esoBin, logDir)
	b.esoSynced(started, 10*time.Minute)
	audit.quiet(esoAgent, 5*time.Second, 2*time.Minute) // its start-up pass has ended
	r.Rotation = append(r.Rotation, sideRotation{"eso refresh 1h", 1, b.rotate(n, limit1h)})
	r.Idle = append(r.Idle, sideIdle{"eso refresh 1h", *b.idle(audit, esoAgent, n, idleFor)})
	e.stop()
}

// ratios compares raysync with ESO: mean rotation times over the rounds, idle requests, RSS at M.
func (r *esoResult) ratios(idle *idleResult, mem []memoryResult) {
	mean := func(client string) float64 {
		var sum float64
		var k int
		for _, x := range r.Rotation {
			if x.Client == client {
				sum += x.LastMs
				k++
			}
		}
		return sum / float64(max(k, 1))
	}
	rs := mean("raysync")
	r.RotationRatio10s = rs / mean("eso refresh 10s")
	r.RotationRatio1h = rs / mean("eso refresh 1h") // ESO did not finish within the limit: raysync is at least this much faster
	for _, x := range r.Idle {
		if idle == nil || x.RequestsPerSec == 0 {
			continue
		}
		ratio := idle.RequestsPerSec / x.RequestsPerSec
		if strings.HasSuffix(x.Client, "10s") {
			r.IdleRatio10s = ratio
		} else {
			r.IdleRatio1h = ratio
		}
	}
	for _, m := range mem {
		if m.M == r.Memory.M && r.Memory.PeakRSSMi > 0 {
			r.MemoryRatio = m.PeakRSSMi / r.Memory.PeakRSSMi
		}
	}
}
