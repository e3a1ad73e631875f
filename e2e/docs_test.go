package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/cmd/syncer/app"
	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// Docs that run: a fenced block preceded by `<!-- docs-run: NAME -->` is run by these tests as written,
// in bash, against a real API server. What the harness cannot do as a cluster does is said once, here:

// docsChartRef is how the docs name the chart, and docsChart what the tests install instead. Once the
// real node's registry exists, docsChart becomes that registry's oci:// reference (and the quick start's
// step 1, which publishes to it, runs too).
const docsChartRef = "oci://registry.example.com/platform/charts/raysync --version 0.2.0"

func docsChart(root string) string { return filepath.Join(root, chart) }

// docsPublishStep is the quick start's step 1, `make release` to the reader's registry: its run into the
// real node's registry, followed by `helm install oci://…`, is TestRealNodeRelease (e2e/realnode).
var docsPublishStep = regexp.MustCompile(`(?m)^make release VERSION=\S+ REGISTRY=\S+$`)

// docsBlocks returns the blocks of page marked `<!-- docs-run: name -->`, in order.
func docsBlocks(t *testing.T, page, name string) []string {
	t.Helper()
	blocks, err := framework.DocsBlocks(page, name)
	if err != nil {
		t.Fatal(err)
	}
	return blocks
}

// docsShell runs documented commands: real kubectl and helm on the control plane's admin kubeconfig,
// behind a kubectl shim for the two things the stand-in cannot do (it runs no containers and there is
// no Deployment controller): `kubectl exec deploy/<raysync> -- /syncer ARGS` runs the syncer binary with
// the Deployment's arguments, as inside its pod, and `kubectl rollout status deploy/<raysync>` answers
// once the test has started that raysync.
type docsShell struct {
	e    *Env
	dir  string   // the shim's directory: kubectl, helm, and one <ns>.<deploy>.args file per raysync started
	env  []string // the shell's environment
	subs *strings.Replacer
	// procs are the processes standing for Deployments ("<ns>.<deploy>"): `kubectl logs deploy/…` prints
	// what each has logged so far.
	procs map[string]*Syncer
}

const kubectlShim = `#!/usr/bin/env bash
# kubectl for documented commands on the e2e harness (e2e/docs_test.go says why).
ns=default; a=("$@")
for ((i=0; i<${#a[@]}; i++)); do
  case "${a[i]}" in -n|--namespace) ns=${a[i+1]};; --namespace=*) ns=${a[i]#*=};; esac
done
for ((i=0; i<${#a[@]}; i++)); do
  if [ "${a[i]}" = logs ] && [[ "${a[i+1]}" == deploy/* ]]; then
    f="$SHIM_DIR/$ns.${a[i+1]#deploy/}.log"
    [ -f "$f" ] || { echo "docs shim: no process runs for ${a[i+1]} in $ns" >&2; exit 1; }
    for x in "${a[@]}"; do
      if [ "$x" = --previous ] || [ "$x" = -p ]; then
        echo "Error from server (BadRequest): previous terminated container in pod of ${a[i+1]} not found (it never restarted)" >&2; exit 1
      fi
    done
    exec cat "$f"
  fi
  if [ "${a[i]}" = exec ] && [[ "${a[i+1]}" == deploy/* ]]; then
    f="$SHIM_DIR/$ns.${a[i+1]#deploy/}.args"
    [ -f "$f" ] || { echo "docs shim: no raysync runs for ${a[i+1]} in $ns" >&2; exit 1; }
    for ((j=i+2; j<${#a[@]}; j++)); do [ "${a[j]}" = -- ] && break; done
    cmd=("${a[@]:j+2}"); run=(); [ -f "$f.${cmd[0]}" ] && mapfile -t run < "$f.${cmd[0]}"
    POD_NAMESPACE=$ns exec "$SYNCER" "${cmd[0]}" "${run[@]}" "${cmd[@]:1}"
  fi
  if [ "${a[i]}" = rollout ] && [ "${a[i+1]}" = status ] && [[ "${a[i+2]}" == deploy/* ]]; then
    [ -f "$SHIM_DIR/$ns.${a[i+2]#deploy/}.args" ] || { echo "docs shim: no raysync runs for ${a[i+2]} in $ns" >&2; exit 1; }
    echo "deployment \"${a[i+2]#deploy/}\" successfully rolled out"; exit 0
  fi
done
exec "$REAL_KUBECTL" "$@"
`

func newDocsShell(e *Env, subs ...string) *docsShell {
	e.t.Helper()
	root, _ := framework.RepoRoot()
	dir := e.t.TempDir()
	syncer, err := buildSyncer()
	if err != nil {
		e.t.Fatal(err)
	}
	helmPath, err := framework.EnsureHelm(context.Background(), e.t.Logf)
	if err != nil {
		e.t.Fatal(err)
	}
	real, err := exec.LookPath("kubectl")
	if err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kubectl"), []byte(kubectlShim), 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.Symlink(helmPath, filepath.Join(dir, "helm")); err != nil {
		e.t.Fatal(err)
	}
	env := append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"), "KUBECONFIG="+e.Kubeconfig, "SHIM_DIR="+dir, "SYNCER="+syncer, "REAL_KUBECTL="+real,
		"HELM_CACHE_HOME="+e.t.TempDir(), "HELM_CONFIG_HOME="+e.t.TempDir(), "HELM_DATA_HOME="+e.t.TempDir())
	// The chart from the checkout, with the image a release would have set in it.
	chartHere := docsChart(root) + " --set image.repository=" + releasedImage
	return &docsShell{e: e, dir: dir, env: env, subs: strings.NewReplacer(append([]string{docsChartRef, chartHere}, subs...)...), procs: map[string]*Syncer{}}
}

// run runs one documented block as a reader would, stopping at the first failing command (bash -e; a
// pipeline's status is its last command's, as in an interactive shell), and returns its output.
func (d *docsShell) run(block string, extraEnv ...string) string {
	d.e.t.Helper()
	out, err := d.try(block, extraEnv...)
	if err != nil {
		d.e.t.Fatalf("documented commands failed: %v\n--- commands\n%s--- output\n%s", err, d.subs.Replace(block), d.redact(out))
	}
	return out
}

// redact hides, in what the test logs, the digests of the test's secrets that documented commands
// print on purpose (raysync.dev/token-sha256, and the one-liner that compares with it).
func (d *docsShell) redact(s string) string {
	for _, v := range d.e.secrets {
		sum := sha256.Sum256([]byte(v))
		full := hex.EncodeToString(sum[:])
		s = strings.ReplaceAll(strings.ReplaceAll(s, full, "<sha256 of a secret>"), full[:16], "<digest of a secret>")
	}
	return s
}

func (d *docsShell) try(block string, extraEnv ...string) (string, error) {
	d.e.t.Helper()
	return d.shell([]string{"-e"}, block, extraEnv...)
}

// shell runs block with bash's options opts, after writing what each process standing for a
// Deployment has logged so far where the kubectl shim finds it.
func (d *docsShell) shell(opts []string, block string, extraEnv ...string) (string, error) {
	d.e.t.Helper()
	for key, p := range d.procs {
		if err := os.WriteFile(filepath.Join(d.dir, key+".log"), []byte(p.out.String()), 0o600); err != nil {
			d.e.t.Fatal(err)
		}
	}
	script := d.subs.Replace(block)
	cmd := exec.Command("bash", append(opts, "-c", script)...)
	cmd.Env = append(append([]string{}, d.env...), extraEnv...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	d.e.t.Logf("$ %s\n%s", strings.ReplaceAll(strings.TrimSpace(script), "\n", "\n$ "), d.redact(out.String()))
	for _, v := range d.e.secrets {
		if len(v) >= 8 && strings.Contains(out.String(), v) {
			d.e.t.Errorf("a documented command printed a secret value")
		}
	}
	return out.String(), err
}

// startDeployments starts raysync, as its pod would run, for every raysync Deployment of ns not started yet:
// the Deployment's arguments (servers on loopback), its ServiceAccount, POD_NAMESPACE; and records the
// arguments `kubectl exec deploy/… -- /syncer` gets in the pod.
func (d *docsShell) startDeployments(ns string) {
	d.e.t.Helper()
	deps, err := d.e.Kube.AppsV1().Deployments(ns).List(d.e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=raysync"})
	if err != nil {
		d.e.t.Fatal(err)
	}
	for _, dep := range deps.Items {
		argsFile := filepath.Join(d.dir, dep.Namespace+"."+dep.Name+".args")
		if _, err := os.Stat(argsFile); err == nil {
			continue
		}
		run := deploymentArgs(&dep)
		kubeconfig, _ := d.e.serviceAccountKubeconfig(dep.Namespace, dep.Spec.Template.Spec.ServiceAccountName)
		d.procs[dep.Namespace+"."+dep.Name] = d.e.startBinary(kubeconfig, "/readyz", []string{"POD_NAMESPACE=" + dep.Namespace}, nil, append(run, "--leader-election-retry-period=500ms")...)
		// What each command inherits in the pod (cmd/syncer/app's InheritedFlags, from the Deployment's own arguments).
		for _, cmd := range []string{"status", "rotate", "adopt", "pause", "resume", "uninstall", "revoke-previous"} {
			inPod := app.InheritedFlags(cmd, dep.Spec.Template.Spec.Containers[0].Args)
			if err := os.WriteFile(argsFile+"."+cmd, []byte(strings.Join(append(inPod, "--kubeconfig="+kubeconfig), "\n")+"\n"), 0o600); err != nil {
				d.e.t.Fatal(err)
			}
		}
		if err := os.WriteFile(argsFile, nil, 0o600); err != nil {
			d.e.t.Fatal(err)
		}
	}
}

// deploymentArgs are the raysync container's arguments as the test runs them: servers the test binds
// on loopback dropped, the webhook on a free loopback port.
func deploymentArgs(dep *appsv1.Deployment) (run []string) {
	for _, a := range dep.Spec.Template.Spec.Containers[0].Args {
		switch {
		case strings.HasPrefix(a, "--metrics-bind-address"), strings.HasPrefix(a, "--health-probe-bind-address"):
			continue
		case strings.HasPrefix(a, "--webhook-addr="):
			run = append(run, "--webhook-addr=127.0.0.1:0")
		default:
			run = append(run, a)
		}
	}
	return run
}

// TestDocsQuickStart runs the README's and docs' quick start (steps 2-6) as written, on a control plane
// of its own (it uses the docs' namespace names): create the token, helm install, check, compare digests.
func TestDocsQuickStart(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("starts a control plane of its own")
	}
	cp, err := framework.Start(context.Background(), framework.Options{KubeRayVersion: controlPlanes[0].KubeRayVersion, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	env := newEnv(t, cp)
	sh := newDocsShell(env)
	// The reader's own namespace with Ray clusters exists already.
	if _, err := env.Kube.CoreV1().Namespaces().Create(env.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml-team"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	blocks := docsBlocks(t, "getting-started/helm.md", "quickstart")
	if len(blocks) != 6 {
		t.Fatalf("the quick start has %d marked blocks, want its 6 steps", len(blocks))
	}
	if !docsPublishStep.MatchString(blocks[0]) {
		t.Fatalf("step 1 no longer publishes to a registry: %s", blocks[0])
	}
	// Step 1 runs in TestRealNodeRelease; here the chart comes from the checkout (docsChart).
	sh.run(blocks[1])
	src, err := env.Kube.CoreV1().Secrets("raysync").Get(env.ctx, "ray-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := env.Secret(string(src.Data["auth_token"]))
	if len(token) != 64 {
		t.Fatalf("step 2 wrote a token of %d characters, want 64 hex characters and no newline", len(token))
	}
	sh.run(blocks[2])
	sh.startDeployments("raysync")
	if out := sh.run(blocks[3]); !strings.Contains(out, "successfully rolled out") || !strings.Contains(out, "raysync/ray-token") {
		t.Errorf("step 4 printed no rollout and no source:\n%s", out)
	}
	// The reader's RayCluster: raysync gives its Secret the canonical token and its digest.
	rc := env.CreateRayCluster(rayCluster("ml-team", "my-cluster"))
	env.WaitSecret("ml-team", kuberay.CheckName(rc.GetName()), time.Minute, holds(token))
	sum := sha256.Sum256([]byte(token))
	digest := hex.EncodeToString(sum[:8])
	if out := sh.run(blocks[4]); !strings.Contains(out, "(dry run: nothing changed)") || !strings.Contains(out, "adopted in raysync/raysync-control: adopt=all") {
		t.Errorf("step 5 did not preview, then adopt:\n%s", out)
	}
	out := sh.run(blocks[5])
	if strings.Count(out, digest) != 2 {
		t.Errorf("step 6 should show the cluster's digest and the canonical token's, both the canonical token's:\n%s", sh.redact(out))
	}
}

// TestDocsRotationBlockedRunbook makes a restart block the wave (the restarted cluster's new pods never
// start), then runs the RaysyncRotationBlocked runbook's commands as written: they name the blocked
// cluster and show why; once the cause is fixed, the runbook's confirmation passes.
func TestDocsRotationBlockedRunbook(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	rel, src, cns := env.Namespace(), env.Namespace(), env.Namespace()
	release := "rs-" + rel
	env.PutSource(src, "ray-token", tokenData(env.NewToken()))
	set := "authSource.namespace=" + src + ",authSource.name=ray-token,namespaces={" + cns + "},rbac.scope=namespaces,webhook.enabled=false," +
		"rotation.timeout=10s,rotation.policies.rayCluster=restart"
	out, err := helm(t, "template", release, chart, "--namespace", rel, "--set", set)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	env.kubectlApply(out)
	t.Cleanup(func() { env.kubectlDeleteClusterScoped(out) })
	sh := newDocsShell(env, "NS=raysync RELEASE=raysync", "NS="+rel+" RELEASE="+release+"-raysync")
	sh.startDeployments(rel)

	env.CreateRayCluster(rayCluster(cns, "batch"))
	env.WaitPodsReady(cns, kuberay.ClusterLabel+"=batch", 2, time.Minute)
	// The fault: after the restart's suspend, no new pod of this namespace starts.
	never := func(v *string) {
		ns, err := env.Kube.CoreV1().Namespaces().Get(env.ctx, cns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if v == nil {
			delete(ns.Annotations, framework.StandInStart)
		} else {
			if ns.Annotations == nil {
				ns.Annotations = map[string]string{}
			}
			ns.Annotations[framework.StandInStart] = *v
		}
		if _, err := env.Kube.CoreV1().Namespaces().Update(env.ctx, ns, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n := "never"
	never(&n)
	env.PutSource(src, "ray-token", tokenData(env.NewToken()))
	env.WaitEvent(cns, "batch", "RotationBlocked", 2*time.Minute)

	// Step 1: the runbook names the blocked cluster; steps 1 and 2a read its Event and its state.
	rb := docsBlocks(t, "runbooks/raysyncrotationblocked.md", "rotationblocked")
	// What the reader set at the top of the runbook and in step 1 (each block runs in a shell of its own).
	vars := []string{"NS=" + rel, "RELEASE=" + release + "-raysync", "CNS=" + cns, "CLUSTER=batch", "OWNER=batch"}
	if got := sh.run(rb[0], vars...); !strings.Contains(got, cns+" batch RayCluster/batch policy=restart since=") {
		t.Errorf("step 1 does not name the blocked cluster:\n%s", got)
	}
	if got := sh.run(rb[1], vars...); !strings.Contains(got, "RotationBlocked") {
		t.Errorf("step 1 shows no RotationBlocked Event:\n%s", got)
	}
	if got := sh.run(rb[2], vars...); !strings.Contains(got, "Pending") {
		t.Errorf("step 2a does not show the cluster's new pods waiting:\n%s", got)
	}
	// The cause fixed (here: the stand-in starts pods again; KubeRay recreates the ones that waited).
	never(nil)
	if err := env.Kube.CoreV1().Pods(cns).DeleteCollection(env.ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=batch"}); err != nil {
		t.Fatal(err)
	}
	confirm := docsBlocks(t, "runbooks/raysyncrotationblocked.md", "rotationblocked-confirm")[0]
	var last string
	err = wait.PollUntilContextTimeout(env.ctx, 2*time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		o, err := sh.try(confirm, vars...)
		last = o
		return err == nil && strings.HasPrefix(o, "0\n") && strings.Contains(o, "RotationCompleted"), nil
	})
	if err != nil {
		t.Fatalf("step 4 never confirmed the wave unblocked: %v\n%s", err, sh.redact(last))
	}
}

// shBlocks returns every ```sh block of page, in order.
func shBlocks(t *testing.T, page string) []string {
	t.Helper()
	root, _ := framework.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur strings.Builder
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case !in && strings.TrimSpace(line) == "```sh":
			in, cur = true, strings.Builder{}
		case in && strings.HasPrefix(line, "```"):
			blocks, in = append(blocks, cur.String()), false
		case in:
			cur.WriteString(line + "\n")
		}
	}
	return blocks
}

// docsDrift are what a command prints when the docs name a flag, a resource, an object, a file or a
// JSON path that does not exist.
var docsDrift = []string{"error:", "Error from server", "No such file", "command not found", "unknown flag", "unknown command",
	"unknown shorthand", "docs shim:", "jq: ", "Usage:", "not found"}

// TestDocsRunbooksRun runs every command of every runbook as written (each ```sh block in a shell of
// its own, with the variables a reader sets at its top) against raysync installed from the chart with
// its webhook and gateway: each command must run without an error that says the docs name something
// that is not there (a flag, a resource, an object, a JSON path), and each page's commands must show
// what the page says they show. The RaysyncRotationBlocked runbook runs through a real incident in
// TestDocsRotationBlockedRunbook; what the harness cannot serve is allowed by name, page by page.
func TestDocsRunbooksRun(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	rel, src, cns := env.Namespace(), env.Namespace(), env.Namespace()
	release := "rs-" + rel
	fullname := release + "-raysync"
	token := env.NewToken()
	env.PutSource(src, "ray-token", tokenData(token))
	crt, key := env.ClientCert(time.Now().Add(-time.Hour), time.Now().Add(30*24*time.Hour))
	env.PutSecret(src, "autoscaler-tls", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": crt, "tls.key": key})
	set := "authSource.namespace=" + src + ",authSource.name=ray-token,namespaces={" + cns + "},rbac.scope=namespaces,webhook.enabled=true,gateway.enabled=true"
	out, err := helm(t, "template", release, chart, "--namespace", rel, "--set", set)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	env.kubectlApply(out)
	t.Cleanup(func() { env.kubectlDeleteClusterScoped(out) })
	sh := newDocsShell(env,
		"NS=raysync RELEASE=raysync", "NS="+rel+" RELEASE="+fullname,
		"CNS=ml-team CLUSTER=my-cluster SECRET=my-cluster", "CNS="+cns+" CLUSTER=c1 SECRET=c1",
		"CNS=ml-team CLUSTER=my-cluster", "CNS="+cns+" CLUSTER=c1",
		"CNS=ml-team", "CNS="+cns,
		"SRC_NS=raysync SRC=ray-token", "SRC_NS="+src+" SRC=ray-token",
		"SRC_NS=raysync SRC=autoscaler-tls", "SRC_NS="+src+" SRC=autoscaler-tls")
	sh.startDeployments(rel)
	// At info, as the chart runs it: the refusing-clients page finds the callers in the summary.
	gw := env.StartGateway(types.NamespacedName{Namespace: rel, Name: fullname + "-gateway"}, "--log-level=info", "--refusal-summary=1s")
	sh.procs[rel+"."+fullname+"-gateway"] = gw.Syncer
	env.CreateRayCluster(rayCluster(cns, "c1"))
	env.WaitSecret(cns, "c1", time.Minute, holds(token))
	// Two callers the gateway refuses (no token; a wrong one), for the refusing-clients page to find.
	wrong := env.NewToken()
	for _, auth := range []string{"", "Bearer " + wrong} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+gw.DashboardAddr+"/api/jobs/", nil)
		req.Host = "c1-gw." + cns + ".svc.cluster.local:8265"
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
			t.Fatalf("the gateway answered a caller (token: %t): %s, want 401 or 403", auth != "", resp.Status)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the refusal summary's window (--refusal-summary=1s)
	sum := sha256.Sum256([]byte(token))
	digest := hex.EncodeToString(sum[:8])

	vars := []string{"NS=" + rel, "RELEASE=" + fullname, "CNS=" + cns, "CLUSTER=c1", "SECRET=c1", "SRC_NS=" + src, "SRC=ray-token", "RAY_AUTH_TOKEN=" + token,
		"PREVIOUS_TOKEN=" + token} // wrong-token.md puts "the previous token" back: here the one in place
	pages := map[string]struct {
		shows   []string // what the page's commands print, together
		allowed []string // errors the harness gives where a cluster would not
		exits   []int    // each block's exit status, in order (nil: every block exits 0)
	}{
		"index.md":              {shows: []string{cns, "c1"}},
		"client-auth-errors.md": {shows: []string{digest + "\n" + digest + "\n", "c1"}},
		"raysyncautoscalercertexpiringsoon.md": {shows: []string{"notAfter="},
			allowed: []string{`the server doesn't have a resource type "certificate"`}, exits: []int{1}}, // no cert-manager here
		"raysyncclustersbehind.md": {shows: []string{" " + cns + "/c1 policy=gateway"}}, // run last, after a rotation
		"raysyncrotationpaused.md": {shows: []string{"SOURCE"}},
		"stop-the-wave.md": {shows: []string{"paused:", "PAUSED", "wave stopped", "resumed"},
			exits: []int{1, 0}}, // syncer status exits 1 while paused (it needs you), as the page says
		"wrong-token.md": {shows: []string{"paused:", "secret/ray-token replaced", "resumed"}},
		"raysyncdown.md": {shows: []string{"Name:", fullname},
			allowed: []string{"previous terminated container"}, exits: []int{1}}, // a raysync that never restarted
		"raysyncgatewaydown.md":            {shows: []string{fullname + "-gateway", "gateway"}},
		"raysyncgatewayrefusingclients.md": {shows: []string{`"msg":"refused callers"`, `"result":"forbidden"`, `"result":"unauthenticated"`, `"host":"c1-gw.` + cns}},
		"raysyncgatewaytableinvalid.md": {shows: []string{fullname + "-gateway", "--gateway-table"},
			exits: []int{1}}, // a raysync that publishes its table logs nothing about it: the last grep finds nothing
		"raysyncgatewayupstreamauthfailures.md": {shows: []string{cns}},
		"raysyncnoleader.md":                    {shows: []string{"holderIdentity", "leader", "yes"}},
		"raysyncpodsrecycledrepeatedly.md":      {shows: []string{"manager:"}},
		"raysyncpodsstartedwithoutconfig.md":    {shows: []string{"ENDPOINTS", cns}},
		"raysyncsourceinvalid.md":               {shows: []string{cns}},
		"raysyncstalepods.md":                   {shows: []string{cns}},
		"raysynctargetsoutofsync.md":            {shows: []string{"Name:", "c1"}},
		"raysyncwebhookcertexpiringsoon.md":     {shows: []string{"notAfter="}},
		"raysyncwebhookinvalidreviews.md":       {shows: []string{fullname}},
		"raysyncwebhookslow.md": {shows: []string{"requests"},
			allowed: []string{"Metrics API not available"}}, // no metrics-server here
	}
	root, _ := framework.RepoRoot()
	all, err := filepath.Glob(filepath.Join(root, "docs", "runbooks", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	// run runs page's blocks; done says whether what they printed shows everything the table says.
	run := func(t *testing.T, page string) (out string, exits []int) {
		blocks := shBlocks(t, "runbooks/"+page)
		if len(blocks) == 0 {
			t.Fatalf("%s has no commands", page)
		}
		var got strings.Builder
		for _, b := range blocks {
			// Without -e, as a reader pastes them: a grep that finds nothing does not stop the rest.
			// The block's status is its last command's, which the page promises (0 unless listed).
			o, err := sh.shell(nil, b, vars...)
			var exit *exec.ExitError
			switch {
			case errors.As(err, &exit):
				exits = append(exits, exit.ExitCode())
			case err != nil:
				t.Fatal(err)
			default:
				exits = append(exits, 0)
			}
			got.WriteString(o)
		}
		return got.String(), exits
	}
	check := func(t *testing.T, page, out string, exits []int) {
		want := pages[page]
		if w := want.exits; !slices.Equal(exits, w) && !(w == nil && !slices.ContainsFunc(exits, func(c int) bool { return c != 0 })) {
			t.Errorf("the blocks of %s exited %v, want %v (nil: all 0)", page, exits, w)
		}
		for _, line := range strings.Split(out, "\n") {
			if !slices.ContainsFunc(docsDrift, func(d string) bool { return strings.Contains(line, d) }) ||
				slices.ContainsFunc(want.allowed, func(a string) bool { return strings.Contains(line, a) }) {
				continue
			}
			t.Errorf("a command of %s failed as written: %s", page, sh.redact(line))
		}
		for _, s := range want.shows {
			if !strings.Contains(out, s) {
				t.Errorf("the commands of %s did not show %q", page, sh.redact(s))
			}
		}
		if strings.Contains(out, wrong) {
			t.Errorf("the commands of %s printed a caller's credential", page)
		}
	}
	for _, path := range all {
		page := filepath.Base(path)
		if page == "raysyncrotationblocked.md" || page == "raysyncclustersbehind.md" {
			continue
		}
		if _, ok := pages[page]; !ok {
			t.Errorf("runbook %s is not run by this test: add it to the table", page)
			continue
		}
		t.Run(strings.TrimSuffix(page, ".md"), func(t *testing.T) {
			out, exits := run(t, page)
			check(t, page, out, exits)
		})
	}
	// Last: a new canonical token leaves c1 (policy gateway) behind, which that page lists.
	t.Run("raysyncclustersbehind", func(t *testing.T) {
		page := "raysyncclustersbehind.md"
		env.PutSource(src, "ray-token", tokenData(env.NewToken()))
		var out string
		var exits []int
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
			if out, exits = run(t, page); strings.Contains(out, cns+"/c1") || time.Now().After(deadline) {
				break
			}
		}
		check(t, page, out, exits)
	})
}
