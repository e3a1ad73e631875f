package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
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
	args = withImage(args)
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

// releasedImage is what `make release REGISTRY=registry.example.com/platform` writes into the chart it
// publishes: the checkout's chart has no image repository and refuses to render without one.
const releasedImage = "registry.example.com/platform/raysync"

// withImage gives a helm template, install or upgrade of the checkout's chart the image a release
// would have set, unless the command sets one.
func withImage(args []string) []string {
	if len(args) == 0 || !slices.Contains([]string{"template", "install", "upgrade"}, args[0]) || !slices.Contains(args, chart) ||
		slices.ContainsFunc(args, func(a string) bool { return strings.Contains(a, "image.repository") }) {
		return args
	}
	return append(slices.Clone(args), "--set", "image.repository="+releasedImage)
}

func TestChartLintsAndRejectsBadValues(t *testing.T) {
	base := []string{"--set", "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true"}
	for _, set := range []string{"webhook.enabled=true", "webhook.enabled=false", "webhook.certManager.enabled=true"} {
		if out, err := helm(t, append([]string{"lint", "--strict", chart, "--set", set}, base...)...); err != nil {
			t.Fatalf("helm lint (%s): %v\n%s", set, err, out)
		}
	}
	// Every flag users need is reachable from a value (and the rest through extraArgs).
	for set, want := range map[string][]string{
		"rotation.timeout=0":                      {"--rotation-timeout=0"},
		"precreateAuthSecrets=false":              {"--precreate-auth-secrets=false"},
		"webhook.certValidity=720h":               {"--webhook-cert-validity=720h"},
		"webhook.ips={127.0.0.1}":                 {"--webhook-ips=127.0.0.1"},
		"extraArgs={--workers=4}":                 {"--workers=4"},
		"name=tenant-a":                           {"--name=tenant-a"},
		"leaderElection.enabled=false,replicas=1": {"--leader-elect=false"},
	} {
		out, err := helm(t, append([]string{"template", "rs", chart, "--show-only", "templates/deployment.yaml", "--set", set}, base...)...)
		if err != nil {
			t.Errorf("%s: %v\n%s", set, err, out)
			continue
		}
		for _, w := range want {
			if !strings.Contains(out, "- "+w+"\n") {
				t.Errorf("%s: the container args lack %s", set, w)
			}
		}
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
		// Both scopes: the webhook's own ClusterRole (its MutatingWebhookConfiguration is cluster-scoped;
		// TestChartWebhook checks it grants nothing else) and a Role for its certificate Secret.
		if c.scope == "namespaces" && (kinds["ClusterRole"] != 1 || kinds["Role"] != 7) {
			t.Errorf("%s: %v (want only the webhook's ClusterRole; a Role per namespace, per source namespace, for the rotation ledger, for leader election and for the webhook certificate)", c.set, kinds)
		}
		if c.scope == "cluster" && kinds["ClusterRole"] != 2 {
			t.Errorf("%s: %v (want the ClusterRole and the webhook's)", c.set, kinds)
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
		"webhook port 0":        "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.port=0",
		"webhook port > 65535":  "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.port=65536",
		"webhook port=metrics":  "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.port=8080",
		"webhook port=health":   "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.port=8081",
		"webhook timeout 0":     "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.timeoutSeconds=0",
		"webhook timeout 31":    "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.timeoutSeconds=31",
		"webhook timeout 1.5":   "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.timeoutSeconds=1.5",
		"webhook enabled yes":   "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.enabled=yes",
		"webhook unknown value": "authSource.namespace=a,authSource.name=b,allNamespaces=true,webhook.certManager.issuer=x",
		// What raysync would refuse at start (a CrashLoop), refused at helm template instead.
		"two writers":                    "authSource.namespace=a,authSource.name=b,allNamespaces=true,leaderElection.enabled=false,replicas=2",
		"lease ordering":                 "authSource.namespace=a,authSource.name=b,allNamespaces=true,leaderElection.renewDeadline=20s",
		"retry period 0":                 "authSource.namespace=a,authSource.name=b,allNamespaces=true,leaderElection.retryPeriod=0s",
		"copies of one name":             "authSource.namespace=a,authSource.name=b,allNamespaces=true,pullSecrets={a/regcred,b/regcred}",
		"a pull secret named like TLS":   "authSource.namespace=a,authSource.name=b,allNamespaces=true,pullSecrets={a/x},autoscalerTLS.secret=b/x",
		"a selector that does not parse": "authSource.namespace=a,authSource.name=b,allNamespaces=true,clusterSelector=a in (b",
		"a name no object can have":      "authSource.namespace=a,authSource.name=b,allNamespaces=true,name=Not_A_Name",
		"extraArgs not a flag":           "authSource.namespace=a,authSource.name=b,allNamespaces=true,extraArgs={workers}",
	} {
		if out, err := helm(t, "template", "rs", chart, "--set", set); err == nil {
			t.Errorf("%s: helm template accepted it:\n%.300s", name, out)
		}
	}
	// Refused for the reason named: a chart without an image (nothing is published for it to default
	// to), and rotation policies that cannot take effect (they were read as hold, silently).
	scope := "authSource.namespace=a,authSource.name=b,allNamespaces=true,"
	for set, why := range map[string]string{
		scope + "image.repository=":                    "image.repository is not set",
		scope + "rotation.policies.rayService=restart": "/rotation/policies/rayService",
		scope + "rotation.policies.rayCluster=replace": "/rotation/policies/rayCluster",
		scope + "rotation.policies.rayJob=replace":     "/rotation/policies/rayJob",
		scope + "rotation.policies.rayService=hodl":    "/rotation/policies/rayService",
	} {
		if out, err := helm(t, "template", "rs", chart, "--set", set); err == nil || !strings.Contains(out, why) {
			t.Errorf("%s: helm template (%v) does not refuse it naming %s:\n%.400s", set, err, why, out)
		}
	}
	for _, set := range []string{"rotation.policies.rayService=replace,rotation.policies.rayCluster=restart,rotation.policies.rayJob=restart",
		"rotation.policies.rayService=hold,rotation.policies.rayCluster=hold,rotation.policies.rayJob=hold",
		"gateway.enabled=true,gateway.rotationPolicy=gateway", "gateway.enabled=true,gateway.rotationPolicy=hold"} {
		if out, err := helm(t, "template", "rs", chart, "--set", scope+set); err != nil {
			t.Errorf("policies %s refused: %v\n%.400s", set, err, out)
		}
	}
	// Chart.yaml's kubeVersion: the cluster versions the chart claims, and helm refusing older ones.
	valid := "authSource.namespace=a,authSource.name=b,allNamespaces=true"
	if out, err := helm(t, "template", "rs", chart, "--kube-version", "1.28.9", "--set", valid); err == nil || !strings.Contains(out, "kubeVersion") {
		t.Errorf("helm template for Kubernetes 1.28 accepted the chart (%v):\n%.300s", err, out)
	}
	if out, err := helm(t, "template", "rs", chart, "--kube-version", "1.29.0", "--set", valid); err != nil {
		t.Errorf("helm template for Kubernetes 1.29: %v\n%.300s", err, out)
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

// TestChartWebhook renders the admission webhook in each mode: self-managed certificate (the default),
// cert-manager, and off; for all namespaces and for listed ones, in both RBAC scopes.
func TestChartWebhook(t *testing.T) {
	const (
		rel, fullname = "raysync", "rs-raysync"
		svc           = fullname + "-webhook"
		certSecret    = fullname + "-webhook-tls"
	)
	dnsNames := []string{svc + "." + rel + ".svc", svc + "." + rel + ".svc.cluster.local"}
	render := func(t *testing.T, set ...string) map[string]*unstructured.Unstructured {
		t.Helper()
		args := []string{"template", "rs", chart, "--namespace", rel, "--set", "authSource.namespace=raysync,authSource.name=ray-token,pullSecrets={platform/regcred}"}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm template %v: %v\n%s", set, err, out)
		}
		objs := map[string]*unstructured.Unstructured{}
		for _, o := range renderedObjects(t, out) {
			objs[o.GetKind()+"/"+o.GetName()] = o
		}
		return objs
	}
	container := func(t *testing.T, objs map[string]*unstructured.Unstructured) map[string]any {
		t.Helper()
		d, ok := objs["Deployment/"+fullname]
		if !ok {
			t.Fatal("no Deployment")
		}
		c, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		return c[0].(map[string]any)
	}
	webhookArgs := func(t *testing.T, objs map[string]*unstructured.Unstructured) []string {
		t.Helper()
		var flags []string
		for _, a := range container(t, objs)["args"].([]any) {
			if strings.HasPrefix(a.(string), "--webhook") {
				flags = append(flags, a.(string))
			}
		}
		return flags
	}
	// rbacOn lists every rule of every Role and ClusterRole that names resource.
	rbacOn := func(objs map[string]*unstructured.Unstructured, resource string) []string {
		var found []string
		for key, o := range objs {
			if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
				continue
			}
			rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
			for _, r := range rules {
				res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
				if slices.Contains(res, resource) {
					b, _ := json.Marshal(r)
					found = append(found, key+" "+string(b))
				}
			}
		}
		sort.Strings(found)
		return found
	}
	rules := func(t *testing.T, objs map[string]*unstructured.Unstructured, key string) string {
		t.Helper()
		o, ok := objs[key]
		if !ok {
			t.Fatalf("no %s", key)
		}
		r, _, _ := unstructured.NestedSlice(o.Object, "rules")
		b, _ := json.Marshal(r)
		return string(b)
	}
	webhooks := func(t *testing.T, objs map[string]*unstructured.Unstructured) map[string]map[string]any {
		t.Helper()
		mwc, ok := objs["MutatingWebhookConfiguration/"+fullname]
		if !ok {
			t.Fatal("no MutatingWebhookConfiguration " + fullname)
		}
		whs, _, _ := unstructured.NestedSlice(mwc.Object, "webhooks")
		m := map[string]map[string]any{}
		for _, w := range whs {
			m[w.(map[string]any)["name"].(string)] = w.(map[string]any)
		}
		if len(m) != 3 { // rendered with a pull secret: a RayJob's submitter pods too
			t.Fatalf("webhooks %v, want pods.raysync.dev, submitters.raysync.dev and secrets.raysync.dev", slices.Collect(maps.Keys(m)))
		}
		return m
	}
	asJSON := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	nsSelector := func(op string, values ...string) string {
		return asJSON(map[string]any{"matchExpressions": []any{map[string]any{"key": "kubernetes.io/metadata.name", "operator": op, "values": values}}})
	}

	for _, c := range []struct {
		name       string
		set        []string
		nsSelector string
	}{
		{"all namespaces", []string{"allNamespaces=true"}, nsSelector("NotIn", rel, "kube-system")},
		{"listed namespaces", []string{"namespaces={ml,batch}"}, nsSelector("In", "ml", "batch")},
		{"listed namespaces, cluster RBAC", []string{"namespaces={ml,batch},rbac.scope=cluster"}, nsSelector("In", "ml", "batch")},
	} {
		t.Run("self-managed/"+c.name, func(t *testing.T) {
			objs := render(t, c.set...)
			whs := webhooks(t, objs)
			for name, want := range map[string]struct{ path, resource, objectSelector, sideEffects string }{
				"pods.raysync.dev": {"/mutate-pods", "pods", asJSON(map[string]any{
					"matchLabels":      map[string]any{"app.kubernetes.io/created-by": "kuberay-operator"},
					"matchExpressions": []any{map[string]any{"key": "ray.io/cluster", "operator": "Exists"}}}), "None"},
				// a RayJob's submitter: a Job's pod, with no KubeRay label
				"submitters.raysync.dev": {"/mutate-pods", "pods", asJSON(map[string]any{
					"matchExpressions": []any{map[string]any{"key": "batch.kubernetes.io/job-name", "operator": "Exists"}}}), "None"},
				// raysync creates the cluster's auth Secret itself (never on a dry-run request)
				"secrets.raysync.dev": {"/mutate-secrets", "secrets", asJSON(map[string]any{
					"matchExpressions": []any{map[string]any{"key": "ray.io/cluster", "operator": "Exists"}}}), "NoneOnDryRun"},
			} {
				w := whs[name]
				if w == nil {
					t.Errorf("no webhook %s", name)
					continue
				}
				for field, v := range map[string]any{
					"failurePolicy": "Ignore", "sideEffects": want.sideEffects, "matchPolicy": "Equivalent", "reinvocationPolicy": "Never",
					"timeoutSeconds": float64(2), "admissionReviewVersions": []any{"v1"},
					"rules": []any{map[string]any{"operations": []any{"CREATE"}, "apiGroups": []any{""}, "apiVersions": []any{"v1"},
						"resources": []any{want.resource}, "scope": "Namespaced"}},
					// No caBundle: raysync writes it, and the chart must not reset it.
					"clientConfig":      map[string]any{"service": map[string]any{"name": svc, "namespace": rel, "path": want.path, "port": float64(443)}},
					"objectSelector":    json.RawMessage(want.objectSelector),
					"namespaceSelector": json.RawMessage(c.nsSelector),
				} {
					if got, wantJSON := asJSON(w[field]), asJSON(v); got != wantJSON {
						t.Errorf("%s %s: %s, want %s", name, field, got, wantJSON)
					}
				}
			}
			if a := objs["MutatingWebhookConfiguration/"+fullname].GetAnnotations(); a["cert-manager.io/inject-ca-from"] != "" {
				t.Errorf("self-managed: cainjector annotation %v", a)
			}

			// Every replica serves the webhook: the Service selects all of the Deployment's pods.
			s, ok := objs["Service/"+svc]
			if !ok {
				t.Fatal("no Service " + svc)
			}
			sel, _, _ := unstructured.NestedMap(s.Object, "spec", "selector")
			podSel, _, _ := unstructured.NestedMap(objs["Deployment/"+fullname].Object, "spec", "selector", "matchLabels")
			ports, _, _ := unstructured.NestedSlice(s.Object, "spec", "ports")
			if asJSON(sel) != asJSON(podSel) || asJSON(ports) != `[{"name":"webhook","port":443,"targetPort":"webhook"}]` {
				t.Errorf("Service %s: selector %v (pods: %v), ports %v", svc, sel, podSel, ports)
			}
			if got := asJSON(container(t, objs)["ports"]); !strings.Contains(got, `{"containerPort":9443,"name":"webhook"}`) {
				t.Errorf("no container port webhook 9443: %s", got)
			}
			wantArgs := []string{"--webhook-addr=:9443", "--webhook-cert-secret=" + rel + "/" + certSecret,
				"--webhook-configuration=" + fullname, "--webhook-dns-names=" + strings.Join(dnsNames, ","), "--webhook-cert-validity=2160h"}
			if got := webhookArgs(t, objs); !slices.Equal(got, wantArgs) {
				t.Errorf("webhook flags %q, want %q", got, wantArgs)
			}

			// RBAC: the certificate Secret by name (create cannot be limited by name) and the caBundle of
			// raysync's own webhook configuration by name, in both scopes; nothing more.
			if got, want := rules(t, objs, "Role/"+fullname+"-webhook"), asJSON([]any{
				map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "verbs": []any{"create"}},
				map[string]any{"apiGroups": []any{""}, "resources": []any{"secrets"}, "resourceNames": []any{certSecret}, "verbs": []any{"get", "update"}},
			}); got != want {
				t.Errorf("Role %s-webhook: %s, want %s", fullname, got, want)
			}
			if got, want := rbacOn(objs, "mutatingwebhookconfigurations"), []string{"ClusterRole/" + fullname + "-webhook " + asJSON(map[string]any{
				"apiGroups": []any{"admissionregistration.k8s.io"}, "resources": []any{"mutatingwebhookconfigurations"},
				"resourceNames": []any{fullname}, "verbs": []any{"get", "update"}})}; !slices.Equal(got, want) {
				t.Errorf("rules on mutatingwebhookconfigurations: %q, want %q", got, want)
			}
			if got := rules(t, objs, "ClusterRole/"+fullname+"-webhook"); strings.Count(got, `"resources"`) != 1 {
				t.Errorf("the webhook's ClusterRole grants more than its configuration: %s", got)
			}
			for _, b := range []string{"RoleBinding/" + fullname + "-webhook", "ClusterRoleBinding/" + fullname + "-webhook"} {
				o, ok := objs[b]
				if !ok {
					t.Errorf("no %s", b)
					continue
				}
				subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
				roleName, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
				if roleName != fullname+"-webhook" || asJSON(subjects) != asJSON([]any{map[string]any{"kind": "ServiceAccount", "name": fullname, "namespace": rel}}) {
					t.Errorf("%s: role %s, subjects %v", b, roleName, subjects)
				}
			}
		})
	}

	t.Run("port and timeout", func(t *testing.T) {
		objs := render(t, "allNamespaces=true", "webhook.port=10443", "webhook.timeoutSeconds=30")
		for name, w := range webhooks(t, objs) {
			if w["timeoutSeconds"] != float64(30) {
				t.Errorf("%s timeoutSeconds %v, want 30", name, w["timeoutSeconds"])
			}
		}
		if got := webhookArgs(t, objs); len(got) == 0 || got[0] != "--webhook-addr=:10443" {
			t.Errorf("webhook flags %q", got)
		}
		if got := asJSON(container(t, objs)["ports"]); !strings.Contains(got, `{"containerPort":10443,"name":"webhook"}`) {
			t.Errorf("container ports %s", got)
		}
	})

	for _, scope := range []string{"namespaces", "cluster"} {
		t.Run("off/"+scope, func(t *testing.T) {
			objs := render(t, "namespaces={ml}", "rbac.scope="+scope, "webhook.enabled=false", "webhook.certManager.enabled=true")
			for key := range objs {
				if strings.Contains(key, "Webhook") || strings.HasSuffix(key, "-webhook") || strings.HasPrefix(key, "Issuer/") || strings.HasPrefix(key, "Certificate/") {
					t.Errorf("webhook.enabled=false renders %s", key)
				}
			}
			if got := webhookArgs(t, objs); len(got) != 0 {
				t.Errorf("webhook.enabled=false passes %q", got)
			}
			if got := asJSON(container(t, objs)); strings.Contains(got, "webhook") {
				t.Errorf("webhook.enabled=false: the container mentions the webhook: %s", got)
			}
			if got := rbacOn(objs, "mutatingwebhookconfigurations"); len(got) != 0 {
				t.Errorf("webhook.enabled=false grants %q", got)
			}
		})

		t.Run("cert-manager/"+scope, func(t *testing.T) {
			objs := render(t, "namespaces={ml}", "rbac.scope="+scope, "webhook.certManager.enabled=true")
			issuer, ok := objs["Issuer/"+fullname+"-selfsigned"]
			if !ok {
				t.Fatal("no Issuer")
			}
			if got := asJSON(issuer.Object["spec"]); got != `{"selfSigned":{}}` {
				t.Errorf("Issuer spec %s", got)
			}
			cert, ok := objs["Certificate/"+svc]
			if !ok {
				t.Fatal("no Certificate " + svc)
			}
			if got, want := asJSON(cert.Object["spec"]), asJSON(map[string]any{"secretName": fullname + "-webhook-cert", "dnsNames": dnsNames,
				"issuerRef": map[string]any{"group": "cert-manager.io", "kind": "Issuer", "name": issuer.GetName()}}); got != want {
				t.Errorf("Certificate spec %s, want %s", got, want)
			}
			if cert.GetNamespace() != rel || issuer.GetNamespace() != rel {
				t.Errorf("Issuer in %q, Certificate in %q, want %q", issuer.GetNamespace(), cert.GetNamespace(), rel)
			}
			whs := webhooks(t, objs)
			if a := objs["MutatingWebhookConfiguration/"+fullname].GetAnnotations(); a["cert-manager.io/inject-ca-from"] != rel+"/"+svc {
				t.Errorf("annotations %v, want cert-manager.io/inject-ca-from: %s/%s", a, rel, svc)
			}
			for name, w := range whs {
				if asJSON(w["namespaceSelector"]) != nsSelector("In", "ml") || w["failurePolicy"] != "Ignore" {
					t.Errorf("%s: %s", name, asJSON(w))
				}
			}
			if got, want := webhookArgs(t, objs), []string{"--webhook-addr=:9443", "--webhook-cert-dir=/etc/raysync/webhook-tls"}; !slices.Equal(got, want) {
				t.Errorf("webhook flags %q, want %q", got, want)
			}
			c := container(t, objs)
			if got := asJSON(c["volumeMounts"]); got != `[{"mountPath":"/etc/raysync/webhook-tls","name":"webhook-tls","readOnly":true}]` {
				t.Errorf("volumeMounts %s", got)
			}
			vols, _, _ := unstructured.NestedSlice(objs["Deployment/"+fullname].Object, "spec", "template", "spec", "volumes")
			if got := asJSON(vols); got != `[{"name":"webhook-tls","secret":{"optional":true,"secretName":"`+fullname+`-webhook-cert"}}]` {
				t.Errorf("volumes %s", got)
			}
			// cert-manager owns the certificate and cainjector the caBundle: raysync gets no rights on either.
			if got := rbacOn(objs, "mutatingwebhookconfigurations"); len(got) != 0 {
				t.Errorf("cert-manager mode grants %q", got)
			}
			for _, key := range []string{"Role/" + fullname + "-webhook", "ClusterRole/" + fullname + "-webhook"} {
				if _, ok := objs[key]; ok {
					t.Errorf("cert-manager mode renders %s", key)
				}
			}
			for _, r := range rbacOn(objs, "secrets") {
				if strings.Contains(r, "webhook") {
					t.Errorf("cert-manager mode grants %s", r)
				}
			}
		})
	}
}

// TestChartRBACIsSufficientAndMinimal renders the chart, applies it, and runs raysync as the chart's
// ServiceAccount (never as admin) in both RBAC modes: the default for listed namespaces (namespaced)
// and cluster scope asked for explicitly. The admission webhook is on (the chart's default), with the
// certificate raysync issues itself: raysync creates its Secret and writes the caBundle under the chart's RBAC.
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
				// Nothing runs the Deployment's pods, so the webhook Service has no endpoints: raysync serves the
				// webhook on a free loopback port and the API server calls it there by URL (raysync's certificate
				// gets that IP too). Everything else is applied as rendered.
				webhookPort, err := framework.FreePort()
				if err != nil {
					t.Fatal(err)
				}
				var args, docs []string
				for _, o := range renderedObjects(t, out) {
					switch o.GetKind() {
					case "Deployment":
						c, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
						for _, a := range c[0].(map[string]any)["args"].([]any) {
							switch s := a.(string); {
							case strings.HasPrefix(s, "--metrics-bind-address"), strings.HasPrefix(s, "--health-probe-bind-address"):
							case strings.HasPrefix(s, "--webhook-addr="):
								args = append(args, fmt.Sprintf("--webhook-addr=127.0.0.1:%d", webhookPort), "--webhook-ips=127.0.0.1")
							default:
								args = append(args, s)
							}
						}
					case "MutatingWebhookConfiguration":
						whs, _, _ := unstructured.NestedSlice(o.Object, "webhooks")
						for _, w := range whs {
							w := w.(map[string]any)
							path, _, _ := unstructured.NestedString(w, "clientConfig", "service", "path")
							w["clientConfig"] = map[string]any{"url": fmt.Sprintf("https://127.0.0.1:%d%s", webhookPort, path)}
						}
						if err := unstructured.SetNestedSlice(o.Object, whs, "webhooks"); err != nil {
							t.Fatal(err)
						}
					}
					b, err := yaml.Marshal(o.Object)
					if err != nil {
						t.Fatal(err)
					}
					docs = append(docs, string(b))
				}
				if len(args) == 0 || !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--webhook-addr=") }) {
					t.Fatalf("no Deployment args, or no webhook, rendered: %q", args)
				}
				out = strings.Join(docs, "---\n")
				env.kubectlApply(out)
				t.Cleanup(func() { env.kubectlDeleteClusterScoped(out) })
				kubeconfig, sa := env.serviceAccountKubeconfig(rel, release+"-raysync")
				// POD_NAMESPACE comes from the downward API in the cluster.
				syncer := env.StartSyncerAs(kubeconfig, append(args, "--name="+release+"-raysync", "--leader-election-namespace="+rel, "--leader-election-retry-period=500ms")...)

				env.CreateRayCluster(rayCluster(ns, "rbac", withPrivateImage)) // never-started pods: raysync recycles them
				env.WaitSecret(ns, "rbac", 30*time.Second, holds(token))
				env.WaitSecret(ns, "regcred", 30*time.Second, nil)
				env.WaitAllPods(ns, "rbac", 2, 60*time.Second, "listing the pull secret", listsPullSecret("regcred"))
				// The webhook's certificate: raysync created its Secret and put the CA in its configuration.
				certSecret, configuration := release+"-raysync-webhook-tls", release+"-raysync"
				var caBundles []string
				err = wait.PollUntilContextTimeout(env.ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
					s, err := env.Kube.CoreV1().Secrets(rel).Get(ctx, certSecret, metav1.GetOptions{})
					if err != nil {
						return false, nil
					}
					mwc, err := env.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, configuration, metav1.GetOptions{})
					if err != nil {
						return false, nil
					}
					caBundles = caBundles[:0]
					for _, w := range mwc.Webhooks {
						caBundles = append(caBundles, string(w.ClientConfig.CABundle))
					}
					ca := string(s.Data["ca.crt"])
					// pods, a RayJob's submitter pods (a pull secret is configured) and Secrets: each the CA
					return len(s.Data["tls.crt"]) > 0 && len(s.Data["tls.key"]) > 0 && ca != "" &&
						len(caBundles) == 3 && !slices.ContainsFunc(caBundles, func(b string) bool { return b != ca }), nil
				})
				if err != nil {
					t.Errorf("raysync did not issue the webhook certificate into %s/%s and its CA into %s's caBundle (%d webhooks with one): %v",
						rel, certSecret, configuration, len(slices.DeleteFunc(caBundles, func(b string) bool { return b == "" })), err)
				}

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
					{"update", "leases", rel, release + "-raysync", true},
					{"update", "leases", rel, "raysync", false}, // another release's
					{"update", "secrets", rel, release + "-raysync-rotations", true},
					{"update", "secrets", rel, "raysync-rotations", scope == "cluster"},
					{"update", "leases", rel, "someone-else", false},
					{"delete", "pods", "kube-system", "", scope == "cluster"},
					{"delete", "pods", ns, "", true}, // recycling a pod that may hold the token before raysync's write
					{"update", "configmaps", rel, release + "-raysync-control", true},
					{"update", "configmaps", rel, "someone-elses", false},
					// The webhook: its certificate Secret and its own configuration, by name.
					{"get", "secrets", rel, release + "-raysync-webhook-tls", true},
					{"update", "secrets", rel, release + "-raysync-webhook-tls", true},
					{"update", "secrets", rel, "not-the-webhook-certificate", scope == "cluster"},
					{"get", "mutatingwebhookconfigurations", "", release + "-raysync", true},
					{"update", "mutatingwebhookconfigurations", "", release + "-raysync", true},
					{"update", "mutatingwebhookconfigurations", "", "someone-elses", false},
					{"delete", "mutatingwebhookconfigurations", "", release + "-raysync", false},
					{"create", "mutatingwebhookconfigurations", "", "", false},
					{"list", "mutatingwebhookconfigurations", "", "", false},
					{"update", "validatingwebhookconfigurations", "", release + "-raysync", false},
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
			})
		}
	})
}

func groupOf(resource string) string {
	switch resource {
	case "leases":
		return "coordination.k8s.io"
	case "mutatingwebhookconfigurations", "validatingwebhookconfigurations":
		return "admissionregistration.k8s.io"
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
		switch o.GetKind() {
		case "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration":
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
	// No webhook: raysync runs without it here, and a configuration calling nobody would slow KubeRay's
	// Secrets down, changing who creates them first.
	out, err := helm(t, "template", release, chart, "--namespace", rel, "--set",
		"authSource.namespace="+rel+",authSource.name=ray-token,namespaces={"+ns+"},rbac.scope=namespaces,webhook.enabled=false")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	env.kubectlApply(out)
	kubeconfig, _ := env.serviceAccountKubeconfig(rel, release+"-raysync")
	s := env.StartSyncerAs(kubeconfig, "--auth-source="+rel+"/ray-token", "--namespaces="+ns, "--leader-elect=false", "--name="+release+"-raysync")
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
// The chart's webhook is off: raysync runs with these flags only, and a webhook configuration whose
// Service nobody serves would make the API server wait on every Ray pod and Secret.
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
	set := []string{"authSource.namespace=" + srcNS, "authSource.name=" + srcName, "namespaces={" + namespaces + "}", "rbac.scope=namespaces", "webhook.enabled=false"}
	if len(pulls) > 0 {
		set = append(set, "pullSecrets={"+strings.Join(pulls, ",")+"}")
	}
	out, err := helm(e.t, "template", release, chart, "--namespace", rel, "--set", strings.Join(set, ","))
	if err != nil {
		e.t.Fatalf("helm template: %v\n%s", err, out)
	}
	e.kubectlApply(out)
	kubeconfig, _ := e.serviceAccountKubeconfig(rel, release+"-raysync")
	e.lastKubeconfig, e.lastRelease, e.lastName = kubeconfig, rel, release+"-raysync"
	return e.StartSyncerAs(kubeconfig, append(rest, "--name="+e.lastName, "--leader-election-namespace="+rel)...)
}

// StartReplica starts another replica of the install the last StartSyncerUnderChart made: its
// ServiceAccount, its name (Lease and ledger) and its release namespace, with args.
func (e *Env) StartReplica(args ...string) *Syncer {
	e.t.Helper()
	var rest []string
	for _, a := range args {
		if !strings.HasPrefix(a, "--leader-election-namespace=") {
			rest = append(rest, a)
		}
	}
	return e.StartSyncerAs(e.lastKubeconfig, append(rest, "--name="+e.lastName, "--leader-election-namespace="+e.lastRelease)...)
}

// TestChartGateway renders the gateway: its own pods (no selector of the controller's matches them, or
// the reverse), a Role on exactly its table Secret, the Service and PDB, and the controller's gateway
// flags and rights.
func TestChartGateway(t *testing.T) {
	const rel, fullname = "raysync", "rs-raysync"
	out, err := helm(t, "template", "rs", chart, "--namespace", rel, "--set",
		"authSource.namespace=raysync,authSource.name=ray-token,namespaces={ml},gateway.enabled=true,gateway.pendingKey=next,gateway.grace=12h,serviceMonitor.enabled=true,prometheusRule.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	objs := map[string]*unstructured.Unstructured{}
	for _, o := range renderedObjects(t, out) {
		objs[o.GetKind()+"/"+o.GetName()] = o
	}
	gw := fullname + "-gateway"
	for _, k := range []string{"Deployment/" + gw, "Service/" + gw, "PodDisruptionBudget/" + gw, "ServiceAccount/" + gw, "Role/" + gw, "RoleBinding/" + gw, "ServiceMonitor/" + gw} {
		if objs[k] == nil {
			t.Errorf("no %s", k)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	podLabels := func(name string) map[string]any {
		l, _, _ := unstructured.NestedMap(objs["Deployment/"+name].Object, "spec", "template", "metadata", "labels")
		return l
	}
	selects := func(sel, labels map[string]any) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	for _, k := range []string{"Deployment/" + fullname, "Service/" + fullname + "-metrics", "Service/" + fullname + "-webhook", "PodDisruptionBudget/" + fullname} {
		sel, _, _ := unstructured.NestedMap(objs[k].Object, "spec", "selector")
		if m, ok := sel["matchLabels"].(map[string]any); ok {
			sel = m
		}
		if selects(sel, podLabels(gw)) {
			t.Errorf("%s selects the gateway's pods", k)
		}
	}
	sel, _, _ := unstructured.NestedMap(objs["Service/"+gw].Object, "spec", "selector")
	if !selects(sel, podLabels(gw)) || selects(sel, podLabels(fullname)) {
		t.Errorf("the gateway Service selects %v: want the gateway's pods only", sel)
	}
	rules, _, _ := unstructured.NestedSlice(objs["Role/"+gw].Object, "rules")
	if got := jsonOf(rules); got != `[{"apiGroups":[""],"resourceNames":["rs-raysync-gateway"],"resources":["secrets"],"verbs":["get","list","watch"]}]` {
		t.Errorf("the gateway's rights: %s (want its table Secret only)", got)
	}
	c, _, _ := unstructured.NestedSlice(objs["Deployment/"+gw].Object, "spec", "template", "spec", "containers")
	args := jsonOf(c[0].(map[string]any)["args"])
	for _, want := range []string{`"gateway"`, `"--table-secret=raysync/rs-raysync-gateway"`, `"--max-connections=512"`} {
		if !strings.Contains(args, want) {
			t.Errorf("gateway args %s lack %s", args, want)
		}
	}
	c, _, _ = unstructured.NestedSlice(objs["Deployment/"+fullname].Object, "spec", "template", "spec", "containers")
	args = jsonOf(c[0].(map[string]any)["args"])
	for _, want := range []string{`"--gateway-table=raysync/rs-raysync-gateway"`, `"--gateway-service=rs-raysync-gateway.raysync.svc.cluster.local"`,
		`"--gateway-grace=12h"`, `"--gateway-pending-key=next"`, `"--rotation-policy-rayservice=gateway"`} {
		if !strings.Contains(args, want) {
			t.Errorf("controller args %s lack %s", args, want)
		}
	}
	// The controller keeps the <name>-gw Services in the listed namespaces and may write its table.
	var services, table bool
	for _, o := range objs {
		if o.GetKind() != "Role" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
		j := jsonOf(rules)
		services = services || (o.GetNamespace() == "ml" && strings.Contains(j, `"services"`) && strings.Contains(j, `"create"`))
		table = table || strings.Contains(j, `"rs-raysync-gateway"`) && strings.Contains(j, `"update"`)
	}
	if !services || !table {
		t.Errorf("controller RBAC: Services in ml %v, the table Secret %v", services, table)
	}
	pr, _, _ := unstructured.NestedSlice(objs["PrometheusRule/"+fullname].Object, "spec", "groups")
	if !strings.Contains(jsonOf(pr), "RaysyncGatewayUpstreamAuthFailures") || !strings.Contains(jsonOf(pr), `up{job=\"rs-raysync-gateway\"}`) {
		t.Error("the PrometheusRule lacks the gateway's alerts, or their job")
	}
	// Off by default: nothing of it.
	out, err = helm(t, "template", "rs", chart, "--namespace", rel, "--set", "authSource.namespace=raysync,authSource.name=ray-token,namespaces={ml}")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "gateway") {
		t.Error("the gateway is rendered although gateway.enabled is false")
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestChartAlertsLinkTheirRunbooks renders the PrometheusRule with the default docs site, with docsURL
// set, and with prometheusRule.runbookURL set: every alert links its own runbook page.
func TestChartAlertsLinkTheirRunbooks(t *testing.T) {
	base := "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true,prometheusRule.enabled=true,gateway.enabled=true"
	for set, want := range map[string]string{
		"": "https://raysync.github.io/raysync/runbooks/%s/",
		",docsURL=https://docs.example.com/platform/raysync":                            "https://docs.example.com/platform/raysync/runbooks/%s/",
		",prometheusRule.runbookURL=https://docs.example.com/raysync/runbooks/{alert}/": "https://docs.example.com/raysync/runbooks/%s/",
	} {
		out, err := helm(t, "template", "raysync", chart, "--namespace", "raysync", "--show-only", "templates/prometheusrule.yaml", "--set", base+set)
		if err != nil {
			t.Fatalf("helm template (%s): %v\n%s", set, err, out)
		}
		var rule struct {
			Spec struct {
				Groups []struct {
					Rules []struct {
						Alert       string
						Annotations map[string]string
					}
				}
			}
		}
		if err := yaml.Unmarshal([]byte(out), &rule); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, g := range rule.Spec.Groups {
			for _, r := range g.Rules {
				n++
				if got, w := r.Annotations["runbook_url"], fmt.Sprintf(want, strings.ToLower(r.Alert)); got != w {
					t.Errorf("%s (%s): runbook_url %q, want %q", r.Alert, set, got, w)
				}
			}
		}
		if n < 17 {
			t.Errorf("%s: %d alerts rendered, want every alert of both groups", set, n)
		}
	}
}

// TestChartNotesSayHowToCheck: after install the chart says what it installed and how to check it, with
// the release's own names (helm install --dry-run=client renders NOTES.txt and creates nothing).
func TestChartNotesSayHowToCheck(t *testing.T) {
	if len(controlPlanes) == 0 {
		t.Skip("helm install --dry-run=client still asks a cluster for its version")
	}
	for set, want := range map[string][]string{
		"namespaces={ml-team,ml-batch}": {"RayClusters in    ml-team, ml-batch", "kubectl -n raysync exec deploy/rs-raysync -- /syncer status",
			"kubectl -n raysync rollout status deploy/rs-raysync", "kubectl -n platform get secret ray-token", "pull secrets      none",
			"rotation          RayService replace, RayCluster hold, RayJob hold", "no ServiceMonitor, no alerts"},
		"allNamespaces=true,gateway.enabled=true,pullSecrets={platform/regcred}": {"RayClusters in    every namespace",
			"rotation          gateway for every cluster (gateway.enabled overrides rotation.policies)", "pull secrets      platform/regcred", "gateway           on"},
	} {
		out, err := helm(t, "install", "rs", chart, "--dry-run=client", "--kubeconfig", controlPlanes[0].Kubeconfig, "--namespace", "raysync", "--set", "authSource.namespace=platform,authSource.name=ray-token,"+set)
		if err != nil {
			t.Fatalf("helm install --dry-run=client (%s): %v\n%s", set, err, out)
		}
		_, notes, ok := strings.Cut(out, "NOTES:")
		if !ok {
			t.Fatalf("%s: no NOTES in:\n%.2000s", set, out)
		}
		for _, w := range want {
			if !strings.Contains(notes, w) {
				t.Errorf("%s: NOTES lack %q:\n%s", set, w, notes)
			}
		}
	}
}

// The webhook's NetworkPolicy: none by default; on request, the webhook port from the API server's
// peers only, metrics and probes from anywhere, and never a webhook rule without peers (which would
// admit everyone).
func TestChartWebhookNetworkPolicy(t *testing.T) {
	base := "authSource.namespace=raysync,authSource.name=ray-token,allNamespaces=true"
	asJSON := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	policies := func(set string) []*unstructured.Unstructured {
		t.Helper()
		out, err := helm(t, "template", "rs", chart, "--namespace", "raysync", "--set", base+set)
		if err != nil {
			t.Fatalf("helm template (%s): %v\n%s", set, err, out)
		}
		var nps []*unstructured.Unstructured
		for _, o := range renderedObjects(t, out) {
			if o.GetKind() == "NetworkPolicy" {
				nps = append(nps, o)
			}
		}
		return nps
	}
	if nps := policies(""); len(nps) != 0 {
		t.Errorf("a NetworkPolicy by default: %v", nps[0].GetName())
	}
	nps := policies(",webhook.networkPolicy.enabled=true,webhook.networkPolicy.from[0].ipBlock.cidr=198.18.0.0/28")
	if len(nps) != 1 {
		t.Fatalf("%d NetworkPolicies, want 1", len(nps))
	}
	got, _, _ := unstructured.NestedFieldCopy(nps[0].Object, "spec")
	want := map[string]any{
		"podSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/name": "raysync", "app.kubernetes.io/instance": "rs"}},
		"policyTypes": []any{"Ingress"},
		"ingress": []any{
			map[string]any{"ports": []any{map[string]any{"port": "webhook"}}, "from": []any{map[string]any{"ipBlock": map[string]any{"cidr": "198.18.0.0/28"}}}},
			map[string]any{"ports": []any{map[string]any{"port": "metrics"}, map[string]any{"port": "health"}}},
		},
	}
	if asJSON(got) != asJSON(want) {
		t.Errorf("NetworkPolicy spec %s, want %s", asJSON(got), asJSON(want))
	}
	if out, err := helm(t, "template", "rs", chart, "--set", base+",webhook.networkPolicy.enabled=true"); err == nil {
		t.Errorf("a webhook NetworkPolicy without peers rendered:\n%.300s", out)
	}
}

// TestChartNamesWhatUninstallLooksFor: `syncer uninstall --name=<name>` derives the webhook's
// certificate Secret (<name>-webhook-tls) and configuration (<name>) from the install's name, so the
// chart names them after its `name` value too — for a release whose `name` differs from its fullname,
// they were named after the fullname and uninstall looked in the wrong place.
func TestChartNamesWhatUninstallLooksFor(t *testing.T) {
	for _, c := range []struct{ release, nameValue, want string }{
		{"raysync", "", "raysync"},
		{"rs", "", "rs-raysync"},
		{"rs", "tenant-a", "tenant-a"},
	} {
		args := []string{"template", c.release, chart, "--namespace", "raysync",
			"--set", "authSource.namespace=raysync,authSource.name=ray-token,namespaces={ml}"}
		if c.nameValue != "" {
			args = append(args, "--set", "name="+c.nameValue)
		}
		out, err := helm(t, args...)
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		var gotArgs []string
		kinds := map[string]bool{}
		for _, o := range renderedObjects(t, out) {
			kinds[o.GetKind()+"/"+o.GetName()] = true
			if o.GetKind() == "Deployment" && !strings.Contains(o.GetName(), "gateway") {
				cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
				for _, a := range cs[0].(map[string]any)["args"].([]any) {
					gotArgs = append(gotArgs, a.(string))
				}
			}
			if o.GetKind() == "Role" || o.GetKind() == "ClusterRole" {
				rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
				for _, r := range rules {
					names, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resourceNames")
					res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
					if slices.Contains(res, "mutatingwebhookconfigurations") && !slices.Equal(names, []string{c.want}) {
						t.Errorf("%s/%s: RBAC on the webhook configuration names %v, want [%s]", c.release, c.nameValue, names, c.want)
					}
				}
			}
		}
		for _, want := range []string{"--name=" + c.want, "--webhook-cert-secret=raysync/" + c.want + "-webhook-tls", "--webhook-configuration=" + c.want} {
			if !slices.Contains(gotArgs, want) {
				t.Errorf("release %s, name %q: no %s in %v", c.release, c.nameValue, want, gotArgs)
			}
		}
		if !kinds["MutatingWebhookConfiguration/"+c.want] {
			t.Errorf("release %s, name %q: no MutatingWebhookConfiguration %s", c.release, c.nameValue, c.want)
		}
	}
}
