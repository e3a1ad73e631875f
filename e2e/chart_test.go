package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/raysync/raysync/e2e/framework"
)

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path, err := framework.EnsureHelm(context.Background(), func(f string, a ...any) { t.Logf(f, a...) })
	if err != nil {
		t.Fatal(err)
	}
	root, _ := framework.RepoRoot()
	cmd := exec.Command(path, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out) + stderr.String(), err
	}
	return string(out), nil
}

const chart = "deploy/helm/raysync"

func TestChartLintsAndRejectsBadValues(t *testing.T) {
	base := []string{"--set", "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true"}
	if out, err := helm(t, append([]string{"lint", "--strict", chart}, base...)...); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	// Listed namespaces get namespaced Roles unless cluster scope is asked for; allNamespaces a ClusterRole.
	for _, c := range []struct{ scope, set string }{
		{"namespaces", "namespaces={ml,batch}"}, {"namespaces", "namespaces={ml,batch},rbac.scope=namespaces"},
		{"cluster", "namespaces={ml,batch},rbac.scope=cluster"}, {"cluster", "allNamespaces=true"},
	} {
		args := []string{"template", "rs", chart, "--namespace", "raysync", "--set", "authSource.namespace=raysync,authSource.name=ray-token," + c.set,
			"--set", "pullSecrets={platform/regcred},autoscalerTLS.secret=platform/client-tls,serviceMonitor.enabled=true,prometheusRule.enabled=true"}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm template (%s): %v\n%s", c.set, err, out)
		}
		kinds := map[string]int{}
		for _, doc := range renderedObjects(t, out) {
			kinds[doc.GetKind()]++
		}
		if c.scope == "namespaces" && (kinds["ClusterRole"] != 0 || kinds["Role"] != 5) {
			t.Errorf("%s: %v (want no ClusterRole; a Role per namespace, per source namespace, and for leader election)", c.set, kinds)
		}
		if c.scope == "cluster" && kinds["ClusterRole"] != 1 {
			t.Errorf("%s: %v (want one ClusterRole)", c.set, kinds)
		}
	}
	for name, set := range map[string]string{
		"no scope":              "authSource.namespace=a,authSource.name=b",
		"bad log format":        "authSource.namespace=a,authSource.name=b,allNamespaces=true,logFormat=xml",
		"zero workers":          "authSource.namespace=a,authSource.name=b,allNamespaces=true,workers=0",
		"http api server":       "authSource.namespace=a,authSource.name=b,allNamespaces=true,autoscalerTLS.secret=a/t,autoscalerTLS.apiServer=http://x",
		"pull secret not ns/nm": "authSource.namespace=a,authSource.name=b,allNamespaces=true,pullSecrets={regcred}",
		"unknown value":         "authSource.namespace=a,authSource.name=b,allNamespaces=true,frobnicate=1",
		"bad rbac scope":        "authSource.namespace=a,authSource.name=b,allNamespaces=true,rbac.scope=everything",
		"missing source":        "allNamespaces=true",
	} {
		if out, err := helm(t, "template", "rs", chart, "--set", set); err == nil {
			t.Errorf("%s: helm template accepted it:\n%.300s", name, out)
		}
	}
}

func renderedObjects(t *testing.T, out string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(out, "\n---") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("rendered YAML: %v", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

// TestChartRBACIsSufficientAndMinimal renders the chart, applies it, and runs raysync as the chart's
// ServiceAccount (never as admin) in both RBAC modes: the default for listed namespaces (namespaced)
// and cluster scope asked for explicitly.
func TestChartRBACIsSufficientAndMinimal(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		for _, scope := range []string{"default", "cluster"} {
			t.Run(scope, func(t *testing.T) {
				env := env.With(t)
				rel, ns, srcNS, otherNS := env.Namespace(), env.Namespace(), env.Namespace(), env.Namespace()
				token := env.NewToken()
				env.PutSource(srcNS, "ray-token", tokenData(token))
				env.PutSource(srcNS, "not-a-source", tokenData(env.NewToken()))
				env.PutSecret(srcNS, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(dockerConfig)})
				release := "rs-" + rel
				// The Prometheus Operator objects must be accepted by a real API server with its CRDs.
				if err := framework.InstallPrometheusOperatorCRDs(env.ctx, env.Dynamic); err != nil {
					t.Fatal(err)
				}
				out, err := helm(t, "template", release, chart, "--namespace", rel, "--set", strings.Join([]string{
					"authSource.namespace=" + srcNS, "authSource.name=ray-token", "namespaces={" + ns + "}", "rbac.scope=" + strings.TrimPrefix(scope, "default"),
					"pullSecrets={" + srcNS + "/regcred}", "serviceMonitor.enabled=true", "prometheusRule.enabled=true"}, ","))
				if err != nil {
					t.Fatalf("helm template: %v\n%s", err, out)
				}
				env.kubectlApply(out)
				var args []string
				for _, o := range renderedObjects(t, out) {
					if o.GetKind() == "Deployment" {
						c, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
						for _, a := range c[0].(map[string]any)["args"].([]any) {
							if s := a.(string); !strings.HasPrefix(s, "--metrics-bind-address") && !strings.HasPrefix(s, "--health-probe-bind-address") {
								args = append(args, s)
							}
						}
					}
				}
				if len(args) == 0 {
					t.Fatal("no Deployment args rendered")
				}
				kubeconfig, sa := env.serviceAccountKubeconfig(rel, release+"-raysync")
				// POD_NAMESPACE comes from the downward API in the cluster.
				syncer := env.StartSyncerAs(kubeconfig, append(args, "--leader-election-namespace="+rel, "--leader-election-retry-period=500ms")...)

				env.CreateRayCluster(rayCluster(ns, "rbac", withPrivateImage)) // never-started pods: raysync recycles them
				env.WaitSecret(ns, "rbac", 30*time.Second, holds(token))
				env.WaitSecret(ns, "regcred", 30*time.Second, nil)
				env.WaitAllPods(ns, "rbac", 2, 60*time.Second, "listing the pull secret", listsPullSecret("regcred"))

				can := func(verb, resource, namespace, name string) bool {
					r, err := sa.AuthorizationV1().SelfSubjectAccessReviews().Create(env.ctx, &authzv1.SelfSubjectAccessReview{
						Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
							Verb: verb, Resource: resource, Namespace: namespace, Name: name, Group: groupOf(resource)}}}, metav1.CreateOptions{})
					if err != nil {
						t.Fatal(err)
					}
					return r.Status.Allowed
				}
				for _, c := range []struct {
					verb, resource, ns, name string
					want                     bool
				}{
					{"get", "secrets", srcNS, "ray-token", true},
					{"create", "namespaces", "", "", false},
					{"delete", "namespaces", "", ns, false},
					{"create", "leases", ns, "", false},
					{"update", "leases", rel, "raysync", true},
					{"update", "leases", rel, "someone-else", false},
					{"delete", "pods", "kube-system", "", scope == "cluster"},
				} {
					if got := can(c.verb, c.resource, c.ns, c.name); got != c.want {
						t.Errorf("%s %s %s/%s: allowed=%v, want %v", c.verb, c.resource, c.ns, c.name, got, c.want)
					}
				}
				if scope == "default" { // listed namespaces: namespaced Roles
					for _, c := range []struct{ verb, ns, name string }{
						{"get", srcNS, "not-a-source"}, {"list", otherNS, ""}, {"create", otherNS, ""}, {"update", srcNS, "ray-token"}, {"list", "", ""},
					} {
						if can(c.verb, "secrets", c.ns, c.name) {
							t.Errorf("namespaced mode may %s secrets %s/%s", c.verb, c.ns, c.name)
						}
					}
					// And for real: reading a Secret outside its scope fails.
					if _, err := sa.CoreV1().Secrets(srcNS).Get(env.ctx, "not-a-source", metav1.GetOptions{}); err == nil {
						t.Error("read a Secret that is not a source")
					}
				}
				if strings.Contains(syncer.Output(), "forbidden") {
					t.Errorf("raysync hit an RBAC denial under the chart's ServiceAccount:\n%s", lastLines(syncer.Output(), 20))
				}
				env.kubectlDeleteClusterScoped(out)
			})
		}
	})
}

func groupOf(resource string) string {
	if resource == "leases" {
		return "coordination.k8s.io"
	}
	return ""
}

// kubectlApply applies rendered manifests server-side as admin.
func (e *Env) kubectlApply(manifests string) {
	e.t.Helper()
	cmd := exec.Command("kubectl", "--kubeconfig", e.Kubeconfig, "apply", "--server-side", "-f", "-")
	cmd.Stdin = strings.NewReader(manifests)
	if out, err := cmd.CombinedOutput(); err != nil {
		e.t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// kubectlDeleteClusterScoped removes the cluster-scoped objects of a rendered chart (namespaces go by themselves).
func (e *Env) kubectlDeleteClusterScoped(manifests string) {
	for _, o := range renderedObjects(e.t, manifests) {
		if o.GetNamespace() == "" && (o.GetKind() == "ClusterRole" || o.GetKind() == "ClusterRoleBinding") {
			_ = exec.Command("kubectl", "--kubeconfig", e.Kubeconfig, "delete", strings.ToLower(o.GetKind()), o.GetName(), "--ignore-not-found").Run()
		}
	}
}

// serviceAccountKubeconfig writes a kubeconfig that authenticates as the ServiceAccount (a TokenRequest token).
func (e *Env) serviceAccountKubeconfig(ns, name string) (string, kubernetes.Interface) {
	e.t.Helper()
	exp := int64(3600)
	tr, err := e.Kube.CoreV1().ServiceAccounts(ns).CreateToken(e.ctx, name, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("token for ServiceAccount %s/%s: %v", ns, name, err)
	}
	admin, err := clientcmd.LoadFromFile(e.Kubeconfig)
	if err != nil {
		e.t.Fatal(err)
	}
	cluster := admin.Clusters[admin.Contexts[admin.CurrentContext].Cluster]
	path := filepath.Join(e.t.TempDir(), "sa.kubeconfig")
	cfg := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: %s\n    certificate-authority-data: %s\nusers:\n- name: sa\n  user:\n    token: %s\ncontexts:\n- name: c\n  context: {cluster: c, user: sa}\ncurrent-context: c\n",
		cluster.Server, base64.StdEncoding.EncodeToString(cluster.CertificateAuthorityData), tr.Status.Token)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		e.t.Fatal(err)
	}
	e.Secret(tr.Status.Token)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: cluster.Server, BearerToken: tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cluster.CertificateAuthorityData}})
	if err != nil {
		e.t.Fatal(err)
	}
	return path, client
}

// TestOwnerReferencesPermissionEnforcement: on an API server with the OwnerReferencesPermissionEnforcement
// admission plugin (as OpenShift and other hardened distributions run), the Secrets raysync pre-creates,
// with a blockOwnerDeletion ownerReference to the RayCluster, are accepted under the chart's RBAC.
func TestOwnerReferencesPermissionEnforcement(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("starts a control plane of its own")
	}
	cp, err := framework.Start(context.Background(), framework.Options{KubeRayVersion: "v1.6.1", Logf: t.Logf,
		ExtraAPIServerArgs: []string{"--enable-admission-plugins=OwnerReferencesPermissionEnforcement"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	env := newEnv(t, cp)
	rel, ns := env.Namespace(), env.Namespace()
	token := env.NewToken()
	env.PutSource(rel, "ray-token", tokenData(token))
	release := "rs-" + rel
	out, err := helm(t, "template", release, chart, "--namespace", rel, "--set",
		"authSource.namespace="+rel+",authSource.name=ray-token,namespaces={"+ns+"},rbac.scope=namespaces")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	env.kubectlApply(out)
	kubeconfig, _ := env.serviceAccountKubeconfig(rel, release+"-raysync")
	s := env.StartSyncerAs(kubeconfig, "--auth-source="+rel+"/ray-token", "--namespaces="+ns, "--leader-elect=false")
	byRaysync := 0
	for i := range 5 {
		name := fmt.Sprintf("owned-%d", i)
		env.CreateRayCluster(rayCluster(ns, name))
		sec := env.WaitSecret(ns, name, 30*time.Second, holds(token))
		if len(sec.ManagedFields) > 0 && sec.ManagedFields[0].Manager == "raysync" {
			byRaysync++
			if o := metav1.GetControllerOf(sec); o == nil || o.BlockOwnerDeletion == nil || !*o.BlockOwnerDeletion {
				t.Errorf("%s: pre-created without a blockOwnerDeletion controller reference", name)
			}
		}
	}
	if byRaysync == 0 {
		t.Fatal("KubeRay created every Secret first; nothing proved about raysync's ownerReferences")
	}
	if strings.Contains(s.Output(), "forbidden") {
		t.Errorf("admission refused raysync:\n%s", lastLines(s.Output(), 10))
	}
	t.Logf("raysync pre-created %d of 5 Secrets under OwnerReferencesPermissionEnforcement", byRaysync)
}

// StartSyncerUnderChart runs raysync as the ServiceAccount of the chart rendered for these flags
// (namespaced RBAC, the strictest mode) instead of as admin. Leader election uses the release namespace.
func (e *Env) StartSyncerUnderChart(args ...string) *Syncer {
	e.t.Helper()
	var authSource, namespaces string
	var pulls, rest []string
	for _, a := range args {
		switch {
		case strings.HasPrefix(a, "--auth-source="):
			authSource = strings.TrimPrefix(a, "--auth-source=")
		case strings.HasPrefix(a, "--namespaces="):
			namespaces = strings.TrimPrefix(a, "--namespaces=")
		case strings.HasPrefix(a, "--pull-secret="):
			pulls = append(pulls, strings.TrimPrefix(a, "--pull-secret="))
		case strings.HasPrefix(a, "--leader-election-namespace="):
			continue
		}
		rest = append(rest, a)
	}
	srcNS, srcName, _ := strings.Cut(authSource, "/")
	rel := e.Namespace()
	release := "rs-" + rel
	set := []string{"authSource.namespace=" + srcNS, "authSource.name=" + srcName, "namespaces={" + namespaces + "}", "rbac.scope=namespaces"}
	if len(pulls) > 0 {
		set = append(set, "pullSecrets={"+strings.Join(pulls, ",")+"}")
	}
	out, err := helm(e.t, "template", release, chart, "--namespace", rel, "--set", strings.Join(set, ","))
	if err != nil {
		e.t.Fatalf("helm template: %v\n%s", err, out)
	}
	e.kubectlApply(out)
	kubeconfig, _ := e.serviceAccountKubeconfig(rel, release+"-raysync")
	e.lastKubeconfig, e.lastRelease = kubeconfig, rel
	return e.StartSyncerAs(kubeconfig, append(rest, "--leader-election-namespace="+rel)...)
}
