package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raysync/raysync/e2e/framework"
)

// previousChartCommit is the last commit of chart 0.1.0, the release before the chart in the tree
// (the next commit made it 0.2.0). The test packages the chart directory as it was there, as the
// release was published.
const previousChartCommit = "187416f"

// packagedPreviousChart is chart 0.1.0 packaged by helm (raysync-0.1.0.tgz), from git history.
func packagedPreviousChart(t *testing.T) string {
	t.Helper()
	root, _ := framework.RepoRoot()
	dir := t.TempDir()
	archive := exec.Command("bash", "-o", "pipefail", "-c", `git -C "$1" archive "$2" deploy/helm/raysync | tar -x -C "$3"`, "-", root, previousChartCommit, dir)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("chart 0.1.0 from commit %s: %v\n%s", previousChartCommit, err, out)
	}
	if out, err := helm(t, "package", filepath.Join(dir, chart), "--destination", dir); err != nil {
		t.Fatalf("helm package: %v\n%s", err, out)
	}
	tgz := filepath.Join(dir, "raysync-0.1.0.tgz")
	if _, err := os.Stat(tgz); err != nil {
		t.Fatalf("commit %s does not package chart 0.1.0: %v", previousChartCommit, err)
	}
	return tgz
}

// TestHelmUpgradeFromThePreviousPackagedChart: `helm upgrade` as users run it, from a release of the
// packaged chart 0.1.0 to the chart in the tree: with the values file it was installed with, with
// --reset-then-reuse-values (the new chart's defaults, then the values the release was installed
// with), and with --reuse-values, which takes the previous chart's values as the new chart's defaults
// and so lacks every value new in 0.2.0: Helm refuses that upgrade and the release stays as it was
// (docs/guides/upgrade.md says to use --reset-then-reuse-values). After each upgrade that goes through,
// raysync started as the upgraded Deployment runs it is ready: its arguments are the new binary's.
func TestHelmUpgradeFromThePreviousPackagedChart(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	previous := packagedPreviousChart(t)
	env := newEnv(t, controlPlanes[0])
	for _, tc := range []struct {
		name    string
		upgrade []string // how the release is upgraded
		refused string   // "": it goes through; else what Helm says
	}{
		{name: "with the values file", upgrade: []string{"-f", "VALUES"}},
		{name: "with --reset-then-reuse-values", upgrade: []string{"--reset-then-reuse-values"}},
		{name: "with --reuse-values", upgrade: []string{"--reuse-values"}, refused: "nil pointer evaluating"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := env.With(t)
			rel, src, ns := env.NamespaceWithoutKubelet(), env.Namespace(), env.Namespace()
			env.PutSource(src, "ray-token", tokenData(env.NewToken()))
			values := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(values, []byte("authSource:\n  namespace: "+src+"\n  name: ray-token\nnamespaces: ["+ns+"]\nrbac:\n  scope: namespaces\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			release := "up-" + rel // its own cluster-scoped objects (webhook configuration) for each case
			kube := []string{"--kubeconfig", env.Kubeconfig, "--namespace", rel}
			if out, err := helm(t, append([]string{"install", release, previous, "-f", values}, kube...)...); err != nil {
				t.Fatalf("helm install of chart 0.1.0: %v\n%s", err, out)
			}
			t.Cleanup(func() { _, _ = helm(t, append([]string{"uninstall", release}, kube...)...) })
			upgrade := append([]string{"upgrade", release, chart}, kube...)
			for _, a := range tc.upgrade {
				upgrade = append(upgrade, strings.ReplaceAll(a, "VALUES", values))
			}
			out, err := helm(t, upgrade...)
			history, _ := helm(t, append([]string{"history", release, "-o", "json"}, kube...)...)
			if tc.refused != "" {
				if err == nil || !strings.Contains(out, tc.refused) {
					t.Fatalf("helm %s: %v, want it refused (%q)\n%s", strings.Join(tc.upgrade, " "), err, tc.refused, out)
				}
				if !strings.Contains(history, `"chart":"raysync-0.1.0","app_version":"0.1.0","description":"Install complete"`) || strings.Contains(history, "0.2.0") {
					t.Errorf("a refused upgrade changed the release: %s", history)
				}
				return
			}
			if err != nil {
				t.Fatalf("helm %s: %v\n%s", strings.Join(upgrade, " "), err, out)
			}
			if !strings.Contains(history, `"revision":2,`) || !strings.Contains(history, `"status":"deployed","chart":"raysync-0.2.0"`) {
				t.Errorf("release after the upgrade: %s", history)
			}
			dep, err := env.Kube.AppsV1().Deployments(rel).Get(env.ctx, release+"-raysync", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if img := dep.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":0.2.0") {
				t.Errorf("the upgraded Deployment runs %s", img)
			}
			// raysync as the upgraded Deployment runs it (its arguments, its ServiceAccount, POD_NAMESPACE): ready.
			kubeconfig, _ := env.serviceAccountKubeconfig(rel, dep.Spec.Template.Spec.ServiceAccountName)
			b := env.startBinary(kubeconfig, "/readyz", []string{"POD_NAMESPACE=" + rel}, nil, append(deploymentArgs(dep), "--leader-election-retry-period=500ms")...)
			ledger := env.WaitSecret(rel, release+"-raysync-rotations", 30*time.Second, nil)
			if _, err := env.Kube.CoreV1().ConfigMaps(rel).Get(env.ctx, release+"-raysync-control", metav1.GetOptions{}); err != nil {
				t.Errorf("the upgraded release has no control ConfigMap: %v", err)
			}
			if tc.name != "with the values file" {
				return
			}

			// Roll back (docs/guides/upgrade.md#roll-back): revision 3 is chart 0.1.0 again; what the
			// new chart added is gone, what raysync wrote (the ledger) stays; rolling forward again works.
			b.Kill()
			if out, err := helm(t, append([]string{"rollback", release, "1"}, kube...)...); err != nil {
				t.Fatalf("helm rollback: %v\n%s", err, out)
			}
			history, _ = helm(t, append([]string{"history", release, "-o", "json"}, kube...)...)
			if !strings.Contains(history, `"revision":3,`) || !strings.Contains(history, `"chart":"raysync-0.1.0","app_version":"0.1.0","description":"Rollback to 1"`) {
				t.Errorf("release after the rollback: %s", history)
			}
			dep, err = env.Kube.AppsV1().Deployments(rel).Get(env.ctx, release+"-raysync", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if img := dep.Spec.Template.Spec.Containers[0].Image; !strings.HasSuffix(img, ":0.1.0") {
				t.Errorf("the rolled-back Deployment runs %s", img)
			}
			if _, err := env.Kube.CoreV1().ConfigMaps(rel).Get(env.ctx, release+"-raysync-control", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the control ConfigMap after the rollback: %v, want it deleted with the chart that made it", err)
			}
			if cur := env.WaitSecret(rel, release+"-raysync-rotations", time.Second, nil); cur.ResourceVersion != ledger.ResourceVersion {
				t.Error("the rollback changed the rotation ledger")
			}
			if out, err := helm(t, append([]string{"upgrade", release, chart, "-f", values}, kube...)...); err != nil {
				t.Fatalf("helm upgrade after the rollback: %v\n%s", err, out)
			}
			dep, err = env.Kube.AppsV1().Deployments(rel).Get(env.ctx, release+"-raysync", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			env.startBinary(kubeconfig, "/readyz", []string{"POD_NAMESPACE=" + rel}, nil, append(deploymentArgs(dep), "--leader-election-retry-period=500ms")...)
			if cur := env.WaitSecret(rel, release+"-raysync-rotations", time.Second, nil); string(cur.Data["rotations.json"]) != string(ledger.Data["rotations.json"]) {
				t.Error("rolling forward again started a rotation")
			}
		})
	}
}
