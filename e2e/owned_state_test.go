package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/internal/kuberay"
)

// The Secrets raysync owns (its ledger and the gateway's table) and the commands that change them,
// against a real API server: every change is decided from the objects as they are, at once.

// TestGatewayTableFollowsTheObjects: one cluster behind the gateway, the canonical token rotated
// (policy gateway: the cluster keeps its token, clients may use the new and, within its grace, the
// previous one). The one-shot commands' --dry-run writes nothing; `syncer revoke-previous` makes the
// gateway refuse the previous token at once (the time from the revocation to the first refusal is
// measured); the table is put back when deleted (a gateway replica started meanwhile becomes ready)
// or edited.
func TestGatewayTableFollowsTheObjects(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	ns := env.Namespace()
	t1, t2 := env.NewToken(), env.NewToken()
	env.PutSource(ns, "ray-token", tokenData(t1))
	table := types.NamespacedName{Namespace: ns, Name: "raysync-gateway"}
	flags := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, "--rotation-policy-raycluster=gateway", "--gateway-table=" + table.String()}
	env.StartSyncer(append(flags, "--gateway-service=raysync-gateway.raysync.svc.cluster.local", "--gateway-grace=1h")...)
	env.CreateRayCluster(rayCluster(ns, "c1"))
	env.WaitPodsReady(ns, kuberay.ClusterLabel+"=c1", 1, 2*time.Minute)
	g := env.StartGateway(table)
	waitRoutes(t, g, 1)
	env.PutSource(ns, "ray-token", tokenData(t2))
	for _, tok := range []string{t2, t1} {
		env.waitGatewayStatus(g, ns, "c1", tok, http.StatusOK, 30*time.Second)
	}
	ledger := types.NamespacedName{Namespace: ns, Name: "raysync-rotations"}

	t.Run("dry-run writes nothing", func(t *testing.T) {
		env := env.With(t)
		before := env.resourceVersions(ns)
		for _, cmd := range [][]string{{"revoke-previous", "--dry-run"}, {"rotate", "--all", "--dry-run"}} {
			out, code := env.syncerCLI(cmd[0], append(flags, cmd[1:]...)...)
			if code != 0 || !strings.Contains(out, "would") {
				t.Errorf("syncer %s: exit %d (want 0, saying what it would do)\n%s", strings.Join(cmd, " "), code, out)
			}
		}
		if after := env.resourceVersions(ns); after != before {
			t.Errorf("the dry runs changed objects:\nbefore %s\nafter  %s", before, after)
		}
		if code := env.viaGateway(g, ns, "c1", "/api/jobs/", t1); code != http.StatusOK {
			t.Errorf("the previous token after revoke-previous --dry-run: %d, want 200", code)
		}
	})

	t.Run("revoke-previous ends the previous token at once", func(t *testing.T) {
		env := env.With(t)
		start := time.Now()
		out, code := env.syncerCLI("revoke-previous", flags...)
		done := time.Now()
		if code != 0 {
			t.Fatalf("syncer revoke-previous: exit %d\n%s", code, out)
		}
		var refused time.Time
		_ = wait.PollUntilContextTimeout(env.ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			if env.viaGateway(g, ns, "c1", "/api/jobs/", t1) == http.StatusForbidden {
				refused = time.Now()
				return true, nil
			}
			return false, nil
		})
		if refused.IsZero() {
			t.Fatalf("the gateway still accepts the revoked token 30 s after syncer revoke-previous")
		}
		// "At once", with TestRevokePreviousOnAQuietFleet's ceiling (a revocation that waited for an
		// event or a resync would exceed it).
		if took := refused.Sub(start); took > 3*time.Second {
			t.Errorf("the gateway refused the revoked token %s after syncer revoke-previous started: not at once (at most 3 s)", took.Round(time.Millisecond))
		}
		t.Logf("MEASURE revoke-previous kuberay=%s command_s=%.3f revoke_to_first_refusal_s=%.3f command_exit_to_first_refusal_s=%.3f",
			env.KubeRayVersion, done.Sub(start).Seconds(), refused.Sub(start).Seconds(), refused.Sub(done).Seconds())
		if code := env.viaGateway(g, ns, "c1", "/api/jobs/", t2); code != http.StatusOK {
			t.Errorf("the current token after the revocation: %d, want 200", code)
		}
		if v, _ := env.Kube.CoreV1().Secrets(ledger.Namespace).Get(env.ctx, ledger.Name, metav1.GetOptions{}); v == nil || v.Labels["raysync.dev/managed-by"] != "raysync" {
			t.Error("the ledger lost raysync's mark")
		}
	})

	t.Run("a deleted table is put back and a replica started meanwhile becomes ready", func(t *testing.T) {
		env := env.With(t)
		cur, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, table.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Kube.CoreV1().Secrets(ns).Delete(env.ctx, table.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		back := env.WaitSecret(ns, table.Name, 30*time.Second, func(s *corev1.Secret) bool { return s.UID != cur.UID })
		t.Logf("MEASURE gateway-table-restored kuberay=%s deleted_to_back_s=%.3f", env.KubeRayVersion, time.Since(start).Seconds())
		if string(back.Data["table.json"]) != string(cur.Data["table.json"]) {
			t.Error("the table put back differs from the one deleted")
		}
		fresh := env.StartGateway(table) // waits for /readyz
		if code := env.viaGateway(fresh, ns, "c1", "/api/jobs/", t2); code != http.StatusOK {
			t.Errorf("the new replica with the current token: %d", code)
		}
	})

	t.Run("an edited table is put back", func(t *testing.T) {
		env := env.With(t)
		cur, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, table.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edited := cur.DeepCopy()
		edited.Data["table.json"] = []byte(`{"accept":[],"routes":{}}`)
		if _, err := env.Kube.CoreV1().Secrets(ns).Update(env.ctx, edited, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		env.WaitSecret(ns, table.Name, 30*time.Second, func(s *corev1.Secret) bool { return string(s.Data["table.json"]) == string(cur.Data["table.json"]) })
		env.waitGatewayStatus(g, ns, "c1", t2, http.StatusOK, 30*time.Second)
	})

	t.Run("uninstall --dry-run --yes deletes nothing", func(t *testing.T) {
		env := env.With(t)
		before := env.resourceVersions(ns)
		out, code := env.uninstall(append(flags, "--dry-run", "--yes")...)
		if code == 2 || !strings.Contains(out, "would delete Secret "+ledger.String()) {
			t.Errorf("syncer uninstall --dry-run --yes: exit %d\n%s", code, out)
		}
		if after := env.resourceVersions(ns); after != before {
			t.Errorf("uninstall --dry-run changed objects:\nbefore %s\nafter  %s", before, after)
		}
	})
}

// resourceVersions lists every Secret and Service of ns with its resourceVersion, and whether a
// rotation is requested on each RayCluster.
func (e *Env) resourceVersions(ns string) string {
	e.t.Helper()
	var b strings.Builder
	secrets, err := e.Kube.CoreV1().Secrets(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range secrets.Items {
		fmt.Fprintf(&b, "secret/%s=%s ", s.Name, s.ResourceVersion)
	}
	services, err := e.Kube.CoreV1().Services(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, s := range services.Items {
		fmt.Fprintf(&b, "service/%s=%s ", s.Name, s.ResourceVersion)
	}
	clusters, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for _, c := range clusters.Items {
		// (not its resourceVersion: KubeRay writes its status)
		_, marked := c.GetAnnotations()["raysync.dev/rotate"]
		fmt.Fprintf(&b, "raycluster/%s rotate-requested=%v ", c.GetName(), marked)
	}
	return b.String()
}

// waitGatewayStatus waits until a GET of obj's Jobs API through the gateway with token answers want.
func (e *Env) waitGatewayStatus(g *gatewayProc, ns, obj, token string, want int, timeout time.Duration) {
	e.t.Helper()
	last := 0
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		last = e.viaGateway(g, ns, obj, "/api/jobs/", token)
		return last == want, nil
	})
	if err != nil {
		e.t.Fatalf("through the gateway to %s: %d, want %d", obj, last, want)
	}
}

// TestFlagsNamingOneSecretTwiceAreRefused: a typo that gives two of raysync's roles one Secret (the
// rotation ledger or the webhook certificate naming the canonical source, a pull secret or the ledger)
// is refused at start (exit 2) and erases nothing; a ledger flag naming someone else's Secret that no
// other flag names is left untouched (Warning TargetNotOwned), and raysync keeps projecting tokens.
func TestFlagsNamingOneSecretTwiceAreRefused(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	ns := env.Namespace()
	t1 := env.NewToken()
	env.PutSource(ns, "ray-token", tokenData(t1))
	env.PutSecret(ns, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
	theirs := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "theirs", Namespace: ns}, Data: map[string][]byte{"k": []byte("v")}}
	if _, err := env.Kube.CoreV1().Secrets(ns).Create(env.ctx, theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	base := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, "--leader-elect=false"}
	for name, extra := range map[string][]string{
		"ledger names the source":      {"--rotation-ledger=" + ns + "/ray-token"},
		"ledger names a pull secret":   {"--pull-secret=" + ns + "/regcred", "--rotation-ledger=" + ns + "/regcred"},
		"webhook certificate = source": {"--webhook-addr=127.0.0.1:0", "--webhook-ips=127.0.0.1", "--webhook-cert-secret=" + ns + "/ray-token"},
		"webhook certificate = ledger": {"--webhook-addr=127.0.0.1:0", "--webhook-ips=127.0.0.1", "--webhook-cert-secret=" + ns + "/book", "--rotation-ledger=" + ns + "/book"},
	} {
		t.Run(name, func(t *testing.T) {
			env := env.With(t)
			out, code := env.runSyncerBriefly(5*time.Second, append(base, extra...)...)
			if code != 2 || !strings.Contains(out, "Secret of its own") {
				t.Errorf("exit %d, want 2 with a reason\n%s", code, lastLines(out, 10))
			}
			for _, n := range []string{"ray-token", "regcred"} {
				s, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, n, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if len(s.Data) != 1 || (n == "ray-token" && string(s.Data["auth_token"]) != t1) {
					t.Errorf("Secret %s was changed: keys %v", n, keys(s.Data))
				}
			}
		})
	}
	t.Run("a ledger flag naming someone else's Secret", func(t *testing.T) {
		env := env.With(t)
		env.StandIn()
		env.StartSyncer(append(base[:2], "--rotation-ledger="+ns+"/theirs")...)
		env.WaitEventMessage(ns, "theirs", "TargetNotOwned", 30*time.Second, "not raysync's")
		env.CreateRayCluster(rayCluster(ns, "c1"))
		env.WaitSecret(ns, "c1", 30*time.Second, holds(t1))
		s, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "theirs", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Data) != 1 || string(s.Data["k"]) != "v" || len(s.Labels) != 0 {
			t.Errorf("someone else's Secret was written: keys %v labels %v", keys(s.Data), s.Labels)
		}
	})
}

func keys(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// runSyncerBriefly runs the controller with args for at most d (then SIGTERM) and returns its output
// and exit code (-1: it was still running).
func (e *Env) runSyncerBriefly(d time.Duration, args ...string) (string, int) {
	e.t.Helper()
	path, err := buildSyncer()
	if err != nil {
		e.t.Fatal(err)
	}
	ports, err := freePortPair()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(path, append([]string{"--kubeconfig=" + e.Kubeconfig, fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1])}, args...)...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var werr error
	select {
	case werr = <-done:
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		return out.String(), -1
	}
	var exit *exec.ExitError
	if errors.As(werr, &exit) {
		return out.String(), exit.ExitCode()
	}
	return out.String(), 0
}

// TestDrainKeepsProbesAndMetrics: on SIGTERM the controller and the gateway keep their probe and
// metrics servers up until they exit: /readyz answers 503 during the drain delay (not connection
// refused), /healthz 200 (liveness must not kill a draining pod), /metrics stays scrapeable.
func TestDrainKeepsProbesAndMetrics(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	ns := env.Namespace()
	env.PutSource(ns, "ray-token", tokenData(env.NewToken()))
	for name, start := range map[string]func(*Env) *Syncer{
		"controller": func(env *Env) *Syncer {
			return env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--drain-delay=3s")
		},
		"gateway": func(env *Env) *Syncer {
			return env.startBinary(env.Kubeconfig, "/healthz", nil, []string{"gateway"}, "--table-secret="+ns+"/raysync-gateway",
				"--dashboard-addr=127.0.0.1:0", "--client-addr=127.0.0.1:0", "--drain-delay=3s")
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := start(env.With(t))
			sent := time.Now()
			if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)     // the signal reaches the process
			answers := map[string]map[string]int{} // path -> outcome -> count
			for time.Since(sent) < 2500*time.Millisecond {
				for _, u := range []string{s.ProbeURL + "/readyz", s.ProbeURL + "/healthz", s.MetricsURL} {
					path := u[strings.LastIndex(u, "/"):]
					if answers[path] == nil {
						answers[path] = map[string]int{}
					}
					answers[path][probe(u)]++
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Logf("during the drain: %v", answers)
			for path, want := range map[string]string{"/readyz": "503", "/healthz": "200", "/metrics": "200"} {
				if a := answers[path]; len(a) != 1 || a[want] == 0 {
					t.Errorf("%s during the drain: %v, want only %s", path, a, want)
				}
			}
			select {
			case <-s.done:
				t.Errorf("exited %.1f s after SIGTERM, within its drain delay", time.Since(sent).Seconds())
			case <-time.After(time.Until(sent.Add(2900 * time.Millisecond))):
			}
			select {
			case <-s.done:
			case <-time.After(10 * time.Second):
				t.Error("still running 13 s after SIGTERM")
			}
		})
	}
}

// probe GETs u and says what came back: the status code, or "refused".
func probe(u string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		return "refused"
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return fmt.Sprint(resp.StatusCode)
}

// TestDryRunControllerTakesNoLease: the controller under --dry-run writes nothing, a Lease included
// (it took one, and so kept the real raysync of that name from leading), and still plans as a leader.
func TestDryRunControllerTakesNoLease(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	ns := env.Namespace()
	env.PutSource(ns, "ray-token", tokenData(env.NewToken()))
	s := env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns, "--dry-run", "--leader-elect=true", "--leader-election-namespace="+ns)
	env.CreateRayCluster(rayCluster(ns, "dry"))
	waitOutput(t, s, "dry-run: would create Secret", 30*time.Second)
	leases, err := env.Kube.CoordinationV1().Leases(ns).List(env.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Items) != 0 {
		t.Errorf("a dry run took Lease %s", leases.Items[0].Name)
	}
	if strings.Contains(s.Output(), "--dry-run: refused") {
		t.Errorf("a dry run tried to write:\n%s", lastLines(s.Output(), 20))
	}
}

// TestRevokePreviousOnAQuietFleet: as the black-box run found it, on a fleet where nothing else moves
// (a cluster whose pods never start: no pod, Secret or status change wakes raysync up), the
// revocation alone must make the gateway refuse the previous token at once.
func TestRevokePreviousOnAQuietFleet(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	env.StandIn()
	// raysync's own namespace (the source, the ledger, the table) is not one it watches for clusters,
	// as installed: no watch of the clusters' namespace sees the ledger change.
	ns, own := env.NamespaceWithoutKubelet(), env.Namespace()
	t1, t2 := env.NewToken(), env.NewToken()
	env.PutSource(own, "ray-token", tokenData(t1))
	table := types.NamespacedName{Namespace: own, Name: "raysync-gateway"}
	flags := []string{"--auth-source=" + own + "/ray-token", "--namespaces=" + ns, "-n", own, "--rotation-policy-raycluster=gateway", "--gateway-table=" + table.String()}
	env.StartSyncer(append(flags, "--gateway-service=raysync-gateway.raysync.svc.cluster.local", "--gateway-grace=1h")...)
	env.CreateRayCluster(rayCluster(ns, "quiet"))
	env.WaitSecret(ns, "quiet", 30*time.Second, holds(t1))
	g := env.StartGateway(table)
	waitRoutes(t, g, 1)
	env.PutSource(own, "ray-token", tokenData(t2))
	// Accepted: forwarded to a head that is not there (a 5xx); refused: 403.
	accepted := func(tok string) bool { code := env.viaGateway(g, ns, "quiet", "/api/jobs/", tok); return code >= 500 }
	if err := wait.PollUntilContextTimeout(env.ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return accepted(t1) && accepted(t2), nil
	}); err != nil {
		t.Fatalf("the gateway does not accept the new and the previous token: %d, %d", env.viaGateway(g, ns, "quiet", "/api/jobs/", t2), env.viaGateway(g, ns, "quiet", "/api/jobs/", t1))
	}
	time.Sleep(3 * time.Second) // the fleet settles
	start := time.Now()
	if out, code := env.syncerCLI("revoke-previous", flags...); code != 0 {
		t.Fatalf("syncer revoke-previous: exit %d\n%s", code, out)
	}
	done := time.Now()
	var refused time.Time
	_ = wait.PollUntilContextTimeout(env.ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		if env.viaGateway(g, ns, "quiet", "/api/jobs/", t1) == http.StatusForbidden {
			refused = time.Now()
			return true, nil
		}
		return false, nil
	})
	if refused.IsZero() {
		t.Fatal("the gateway still accepts the revoked token 30 s after syncer revoke-previous")
	}
	// "At once": measured 0.23 s from the command's start (docs/concepts/gateway.md); 3 s leaves room
	// for a loaded machine, and a revocation that waited for the next event or resync would exceed it.
	if took := refused.Sub(start); took > 3*time.Second {
		t.Errorf("the gateway refused the revoked token %s after syncer revoke-previous started: not at once (at most 3 s)", took.Round(time.Millisecond))
	}
	t.Logf("MEASURE revoke-previous-quiet kuberay=%s revoke_to_first_refusal_s=%.3f command_exit_to_first_refusal_s=%.3f",
		env.KubeRayVersion, refused.Sub(start).Seconds(), refused.Sub(done).Seconds())
	if !accepted(t2) {
		t.Error("the current token is refused after the revocation")
	}
}
