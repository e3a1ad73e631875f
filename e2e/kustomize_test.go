package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/e2e/framework"
)

func kustomize(t *testing.T, dir string) string {
	t.Helper()
	root, _ := framework.RepoRoot()
	cmd := exec.Command("kubectl", "kustomize", dir)
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	return string(out)
}

func byKey(objs []*unstructured.Unstructured) map[string]string {
	m := map[string]string{}
	for _, o := range objs {
		labels := o.GetLabels()
		delete(labels, "helm.sh/chart")
		delete(labels, "app.kubernetes.io/managed-by")
		o.SetLabels(labels)
		b, _ := json.Marshal(o.Object)
		m[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = string(b)
	}
	return m
}

func TestKustomizeBaseMatchesChart(t *testing.T) {
	base := renderedObjects(t, kustomize(t, "deploy/kustomize/base"))
	out, err := helm(t, "template", "raysync", chart, "--namespace", "raysync", "--set", "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true")
	if err != nil {
		t.Fatal(err)
	}
	want := byKey(renderedObjects(t, out))
	got := byKey(base)
	if _, ok := got["Namespace//raysync"]; !ok {
		t.Error("base has no Namespace")
	}
	delete(got, "Namespace//raysync")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s differs between the kustomize base and the chart (regenerate deploy/kustomize/base/raysync.yaml)", k)
		}
	}
	if len(got) != len(want) {
		t.Errorf("base has %d objects, chart %d", len(got), len(want))
	}
}

func TestKustomizeOverlayApplies(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		rendered := kustomize(t, "deploy/kustomize/overlays/example")
		// The overlay patches arguments by position: every one it means to change is changed, and
		// none of the base's arguments it means to keep is lost.
		for _, arg := range []string{"--auth-source=platform-secrets/ray-auth", "--auth-source-key=token",
			"--namespaces=ml-team,ml-batch", "--pull-secret=platform-secrets/regcred", "--name=raysync", "--webhook-configuration=raysync"} {
			if !strings.Contains(rendered, "- "+arg+"\n") {
				t.Errorf("overlay output lacks %s", arg)
			}
		}
		for _, arg := range []string{"--all-namespaces", "--auth-source=raysync/ray-token", "--auth-source-key=auth_token"} {
			if strings.Contains(rendered, "- "+arg+"\n") {
				t.Errorf("overlay output still has the base's %s", arg)
			}
		}
		if t.Failed() {
			t.Fatalf("overlay not applied as written:\n%.2000s", rendered)
		}
		// The namespaces the overlay names exist in the cluster it is written for.
		namespaces := []string{"raysync", "ml-team", "ml-batch", "platform-secrets"}
		for _, ns := range namespaces[1:] {
			if _, err := env.Kube.CoreV1().Namespaces().Create(env.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		env.kubectlApply(rendered)
		t.Cleanup(func() {
			env.kubectlDeleteClusterScoped(rendered)
			for _, ns := range namespaces {
				_ = exec.Command("kubectl", "--kubeconfig", env.Kubeconfig, "delete", "namespace", ns, "--wait=false").Run()
			}
		})
		if _, err := env.Kube.AppsV1().Deployments("raysync").Get(env.ctx, "raysync", metav1.GetOptions{}); err != nil {
			t.Fatalf("Deployment not created: %v", err)
		}
	})
}

// TestKustomizeOverlayRBACMatchesChart: the example overlay lists namespaces, so like the chart it
// grants namespaced Roles, and no ClusterRole but the webhook's (its MutatingWebhookConfiguration is
// cluster-scoped; the Role limits it to that one object).
func TestKustomizeOverlayRBACMatchesChart(t *testing.T) {
	out, err := helm(t, "template", "raysync", chart, "--namespace", "raysync", "--show-only", "templates/rbac.yaml", "--set",
		"authSource.namespace=platform-secrets,authSource.name=ray-auth,authSource.key=token,namespaces={ml-team,ml-batch},pullSecrets={platform-secrets/regcred}")
	if err != nil {
		t.Fatal(err)
	}
	want := byKey(renderedObjects(t, out))
	var rbac []*unstructured.Unstructured
	for _, o := range renderedObjects(t, kustomize(t, "deploy/kustomize/overlays/example")) {
		switch o.GetKind() {
		case "ClusterRole", "ClusterRoleBinding":
			if _, ok := want[o.GetKind()+"//"+o.GetName()]; !ok {
				t.Errorf("the overlay grants %s %s: listed namespaces need no cluster-wide rights", o.GetKind(), o.GetName())
			}
			rbac = append(rbac, o)
		case "Role", "RoleBinding":
			rbac = append(rbac, o)
		}
	}
	got := byKey(rbac)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s differs between the overlay and the chart (regenerate deploy/kustomize/overlays/example/rbac.yaml)", k)
		}
	}
	if len(got) != len(want) {
		t.Errorf("overlay has %d RBAC objects, chart %d", len(got), len(want))
	}
}

// TestKustomizeOverlayWebhookMatchesChart: the overlay's admission webhook is the chart's for the
// overlay's values: called for the listed namespaces only.
func TestKustomizeOverlayWebhookMatchesChart(t *testing.T) {
	out, err := helm(t, "template", "raysync", chart, "--namespace", "raysync", "--show-only", "templates/webhook.yaml", "--set",
		"authSource.namespace=platform-secrets,authSource.name=ray-auth,authSource.key=token,namespaces={ml-team,ml-batch},pullSecrets={platform-secrets/regcred}")
	if err != nil {
		t.Fatal(err)
	}
	want := byKey(renderedObjects(t, out))
	if _, ok := want["MutatingWebhookConfiguration//raysync"]; !ok {
		t.Fatalf("the chart renders no webhook configuration: %v", want)
	}
	var webhook []*unstructured.Unstructured
	for _, o := range renderedObjects(t, kustomize(t, "deploy/kustomize/overlays/example")) {
		if _, ok := want[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()]; ok || o.GetKind() == "MutatingWebhookConfiguration" {
			webhook = append(webhook, o)
		}
	}
	got := byKey(webhook)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s differs between the overlay and the chart (patch it in deploy/kustomize/overlays/example/kustomization.yaml):\n%s\n%s", k, got[k], v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("overlay has %d webhook objects, chart %d", len(got), len(want))
	}
}
