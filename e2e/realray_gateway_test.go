package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/kuberay"
)

// gatewayFront is what the cluster's DNS gives a client: <name>-gw.<namespace>.svc.cluster.local is
// the gateway. On loopback, as a forward proxy for Ray's own clients (HTTP_PROXY, grpc_proxy): a
// request for port 8265 goes to the gateway's dashboard listener with its Host kept, a CONNECT to
// port 10001 becomes a tunnel to its Ray Client listener. And as an address of its own for one object
// (for clients that ignore proxies, as aiohttp does for Ray's log tail): a request sent to it directly
// reaches the gateway as if sent to http://<direct>-gw.<namespace>.svc.cluster.local:8265. Nothing else
// is reachable through it.
func (e *Env) gatewayFront(g *gatewayProc, direct string) string {
	e.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	isGateway := func(hostport, port string) bool {
		h, p, err := net.SplitHostPort(hostport)
		return err == nil && p == port && strings.Contains(h, "-gw.")
	}
	dashboard := &httputil.ReverseProxy{FlushInterval: -1, Rewrite: func(r *httputil.ProxyRequest) {
		r.Out.URL.Scheme, r.Out.URL.Host = "http", g.DashboardAddr
		r.Out.Host = r.In.Host
	}}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodConnect && isGateway(r.Host, "10001"):
			up, err := net.DialTimeout("tcp", g.ClientAddr, 5*time.Second)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				up.Close()
				return
			}
			_, _ = conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
			go func() { _, _ = io.Copy(up, buf); up.(*net.TCPConn).CloseWrite() }()
			_, _ = io.Copy(conn, up)
			conn.Close()
			up.Close()
		case r.Method != http.MethodConnect && r.URL.Host == "": // sent to the front itself
			r.Host = direct + ":8265"
			dashboard.ServeHTTP(w, r)
		case r.Method != http.MethodConnect && isGateway(r.Host, "8265"):
			dashboard.ServeHTTP(w, r)
		default:
			http.Error(w, "not a gateway address: "+r.Host, http.StatusBadGateway)
		}
	})}
	go func() { _ = srv.Serve(l) }()
	e.t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

// viaGateway GETs path on obj's gateway address with token, decodes a JSON answer into into (if not
// nil) and returns the HTTP status.
func (e *Env) viaGateway(g *gatewayProc, ns, obj, path, token string, into ...any) int {
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodGet, "http://"+g.DashboardAddr+path, nil)
	req.Host = obj + "-gw." + ns + ".svc.cluster.local:8265"
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if len(into) > 0 && resp.StatusCode == http.StatusOK {
		_ = json.NewDecoder(resp.Body).Decode(into[0])
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestRealRayThroughTheGateway: Ray's own clients — `ray job submit`, `ray job logs`, the
// JobSubmissionClient SDK and Ray Client (ray://, gRPC on 10001) — reach a real-Ray cluster only
// through the gateway's address, with the canonical token, which is not the token the cluster runs
// on after a rotation. With the rotation policy gateway the cluster is never moved: its Secret and its
// processes keep the first token (a call straight at the head with the new one is refused by Ray),
// while every client with the new token, or the previous one in its grace, is served by Ray through
// the gateway. A wrong token is refused by the gateway, which never forwards it.
func TestRealRayThroughTheGateway(t *testing.T) {
	if len(controlPlanes) == 0 {
		t.Skip("no control plane")
	}
	env := newEnv(t, newestKubeRay())
	env.longer(15 * time.Minute)
	ns, srcNS := env.RealRayNamespace(), env.Namespace()
	t1 := env.NewToken()
	env.PutSource(srcNS, "ray-token", tokenData(t1))
	table := types.NamespacedName{Namespace: srcNS, Name: "raysync-gateway"}
	// With the webhook, as the chart runs raysync: the cluster's Secret is born on the canonical token.
	// Without it raysync races KubeRay for the Secret and recycles a raced head once 35 s old, which
	// here came after the head served (502s, a restart on another token: a CI run of 2026-12-07).
	args := append([]string{"--auth-source=" + srcNS + "/ray-token", "--namespaces=" + ns, "--rotation-policy-raycluster=gateway",
		"--gateway-table=" + table.String(), "--gateway-service=raysync-gateway.raysync.svc.cluster.local", "--gateway-grace=1h"},
		env.webhookFor(srcNS, ns)...)
	s := env.StartSyncer(args...)
	env.waitCABundle(args)
	g := env.StartGateway(table)
	front := env.gatewayFront(g, "jobs-gw."+ns+".svc.cluster.local")

	env.CreateRayCluster(realRayCluster(ns, "jobs"))
	env.WaitPodsReady(ns, kuberay.ClusterLabel+"=jobs,"+kuberay.NodeTypeLabel+"=head", 1, 5*time.Minute)
	env.waitDashboard(headURL(ns, "jobs-head-svc"), t1)
	env.waitGateway(g, ns, "jobs", t1)
	address := "http://jobs-gw." + ns + ".svc.cluster.local:8265"
	client := "ray://jobs-gw." + ns + ".svc.cluster.local:10001"

	// Every Ray client through the gateway, with the token the cluster runs on.
	throughGateway := func(token, when string) (jobSeconds, clientSeconds float64, jobID string) {
		t.Helper()
		began := time.Now()
		out, code := env.rayCLIVia(front, 2*time.Minute, token, "job", "submit", "--address", address, "--no-wait", "--", "python", "-c", "print('answer', 6*7)")
		m := submittedJob.FindStringSubmatch(out)
		if code != 0 || m == nil {
			t.Fatalf("%s: ray job submit through the gateway: exit %d\n%s", when, code, lastLines(out, 15))
		}
		var st string
		err := wait.PollUntilContextTimeout(env.ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
			var info struct {
				Status string `json:"status"`
			}
			if env.viaGateway(g, ns, "jobs", "/api/jobs/"+m[1], token, &info) == http.StatusOK {
				st = info.Status
			}
			return st == "SUCCEEDED" || st == "FAILED" || st == "STOPPED", nil
		})
		if err != nil || st != "SUCCEEDED" {
			out, code := env.rayCLIVia(front, time.Minute, token, "job", "status", "--address", address, m[1])
			logs, _ := env.rayCLIVia(front, time.Minute, token, "job", "logs", "--address", address, m[1])
			t.Fatalf("%s: job %s through the gateway: %q (%v); ray job status: exit %d\n%s\nlogs:\n%s", when, m[1], st, err, code, lastLines(out, 8), lastLines(logs, 8))
		}
		jobSeconds = time.Since(began).Seconds()
		if out, code := env.rayCLIVia(front, time.Minute, token, "job", "logs", "--address", address, m[1]); code != 0 || !strings.Contains(out, "answer 42") {
			t.Errorf("%s: ray job logs through the gateway: exit %d\n%s", when, code, lastLines(out, 10))
		}
		// `ray job submit` without --no-wait follows the logs over a websocket (aiohttp, which ignores
		// HTTP_PROXY): straight at the address.
		if out, code := env.rayCLIVia("", 2*time.Minute, token, "job", "submit", "--address", front, "--", "python", "-c", "print('followed', 6*7)"); code != 0 ||
			!strings.Contains(out, "followed 42") || !strings.Contains(out, "succeeded") {
			t.Errorf("%s: ray job submit following its logs through the gateway: exit %d\n%s", when, code, lastLines(out, 15))
		}
		began = time.Now()
		out, code = env.rayPythonVia(front, 3*time.Minute, token, fmt.Sprintf(`
from ray.job_submission import JobSubmissionClient
print("sdk sees", len(JobSubmissionClient(%q).list_jobs()) >= 1)
import ray
ray.init(%q)
print("ray client says", ray.get(ray.remote(num_cpus=0)(lambda: 42).remote()))
`, address, client))
		if code != 0 || !strings.Contains(out, "sdk sees True") || !strings.Contains(out, "ray client says 42") {
			t.Errorf("%s: the Jobs SDK and Ray Client through the gateway: exit %d\n%s", when, code, lastLines(out, 15))
		}
		return jobSeconds, time.Since(began).Seconds(), m[1]
	}
	job1, client1, _ := throughGateway(t1, "before the rotation")
	env.dashboardLogin(front, t1)
	if code := env.viaGateway(g, ns, "jobs", "/api/jobs/", env.NewToken()); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("a wrong token through the gateway: HTTP %d, want 401 or 403", code)
	}
	if out, code := env.rayCLIVia(front, time.Minute, env.NewToken(), "job", "list", "--address", address); code == 0 {
		t.Errorf("ray job list with a wrong token through the gateway succeeded:\n%s", lastLines(out, 5))
	}

	// Rotation: the policy gateway moves no cluster; the gateway accepts the new token at once.
	before := env.WaitSecret(ns, "jobs", 10*time.Second, holds(t1))
	t2 := env.NewToken()
	rotated := time.Now()
	env.PutSource(srcNS, "ray-token", tokenData(t2))
	env.waitGateway(g, ns, "jobs", t2)
	accepted := time.Since(rotated)
	if code := env.rayAPI(headURL(ns, "jobs-head-svc"), "/api/jobs/", t2, nil); code != http.StatusUnauthorized && code != http.StatusForbidden {
		t.Errorf("straight at the head, the new token: HTTP %d; Ray should refuse it (the cluster runs on the first)", code)
	}
	job2, client2, jobID := throughGateway(t2, "after the rotation, new token")
	env.dashboardLogin(front, t2)
	// The cluster runs on t1; clients hold t2.
	t.Run("open paths as real Ray decides them", func(t *testing.T) { env.gatewayOpenPaths(t, g, ns, "jobs", t1, t2) })
	t.Run("the dashboard in a browser", func(t *testing.T) { env.dashboardInBrowser(t, front, t2, jobID) })
	if code := env.viaGateway(g, ns, "jobs", "/api/jobs/", t1); code != http.StatusOK {
		t.Errorf("the previous token in its grace through the gateway: HTTP %d, want 200", code)
	}
	if cur := env.WaitSecret(ns, "jobs", time.Second, nil); cur.ResourceVersion != before.ResourceVersion {
		t.Error("the cluster's Secret was written: the policy gateway must move no cluster")
	}
	env.AssertStartedWith(ns, t1, "jobs")
	if v := s.MetricSum("raysync_rotations_performed_total"); v != 0 {
		t.Errorf("%v rotations performed: the policy gateway performs none", v)
	}
	if v := g.MetricSum("raysync_gateway_upstream_auth_failures_total"); v != 0 {
		t.Errorf("Ray refused the gateway %v times", v)
	}
	t.Logf("MEASURE real-ray-gateway kuberay=%s job_submit_to_logs_s=%.1f/%.1f sdk_and_ray_client_s=%.1f/%.1f new_token_accepted_after_s=%.1f",
		env.KubeRayVersion, job1, job2, client1, client2, accepted.Seconds())
}

// waitGateway waits until the gateway forwards token's calls for obj and Ray answers them.
func (e *Env) waitGateway(g *gatewayProc, ns, obj, token string) {
	e.t.Helper()
	last := 0
	if err := wait.PollUntilContextTimeout(e.ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		last = e.viaGateway(g, ns, obj, "/api/version", token)
		return last == http.StatusOK, nil
	}); err != nil {
		e.t.Fatalf("the gateway never served %s/%s with the token (last HTTP %d)", ns, obj, last)
	}
}

// dashboardLogin is the dashboard's login as a browser does it, at a gateway address: POST
// /api/authenticate with the token, then the Jobs API with only the cookie it set, which must hold the
// client's own token (never the cluster's), and Ray answers.
func (e *Env) dashboardLogin(address, token string) {
	e.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	req, _ := http.NewRequestWithContext(e.ctx, http.MethodPost, address+"/api/authenticate", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	u, _ := url.Parse(address)
	var cookie string
	for _, k := range jar.Cookies(u) {
		if k.Name == "ray-authentication-token" {
			cookie = k.Value
		}
	}
	if resp.StatusCode != http.StatusOK || cookie != token {
		e.t.Errorf("dashboard login through the gateway: HTTP %d, cookie holds the client's token: %v", resp.StatusCode, cookie == token)
		return
	}
	resp, err = c.Get(address + "/api/jobs/")
	if err != nil {
		e.t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		e.t.Errorf("the Jobs API with the login cookie through the gateway: HTTP %d", resp.StatusCode)
	}
}

// rawGet sends GET target to addr (a head through the stand-in's proxy when viaProxy, else the
// gateway's dashboard address with host), the request target byte for byte, with an Authorization
// token if any; it returns the status and the body.
func (e *Env) rawGet(t *testing.T, addr, host, target, token string, viaProxy bool) (int, string) {
	t.Helper()
	dial, requestTarget := addr, target
	if viaProxy {
		u, _ := url.Parse(e.StandIn().ClientProxyURL)
		dial, requestTarget = u.Host, "http://"+host+target
	}
	conn, err := net.DialTimeout("tcp", dial, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	auth := ""
	if token != "" {
		auth = "Authorization: Bearer " + token + "\r\n"
	}
	if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n", requestTarget, host, auth); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("GET %s: %v", target, err)
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// gatewayOpenPaths checks the gateway's open paths against real Ray, row by row
// (gateway.RayOpenPathCases): straight at the head without a token, Ray's token middleware lets
// exactly the open rows through; through the gateway, a caller without a token gets Ray's own answer
// on those and Ray's 401 on the rest, and a client with its canonical token (not the one the cluster
// runs on) gets, on an open row, what Ray answers without any token — the gateway never adds the
// cluster's — and on the others what Ray answers the cluster's token.
func (e *Env) gatewayOpenPaths(t *testing.T, g *gatewayProc, ns, obj, clusterToken, clientToken string) {
	head := obj + "-head-svc." + ns + ".svc.cluster.local:8265"
	gw := obj + "-gw." + ns + ".svc.cluster.local:8265"
	const missing = "Unauthorized: Missing authentication token"
	for _, c := range gateway.RayOpenPathCases {
		direct, body := e.rawGet(t, "", head, c.Target, "", true)
		if needs := direct == http.StatusUnauthorized && body == missing; needs == c.Open {
			t.Errorf("%s: real Ray without a token answers %d %q: open %v, the gateway's table says %v", c.Target, direct, trim(body), !needs, c.Open)
			continue
		}
		anon, anonBody := e.rawGet(t, g.DashboardAddr, gw, c.Target, "", false)
		with, _ := e.rawGet(t, g.DashboardAddr, gw, c.Target, clientToken, false)
		want := direct
		if !c.Open {
			want, _ = e.rawGet(t, "", head, c.Target, clusterToken, true)
			if anon != http.StatusUnauthorized || anonBody != missing {
				t.Errorf("%s through the gateway without a token: %d %q, want Ray's 401", c.Target, anon, trim(anonBody))
			}
		} else if anon != direct {
			t.Errorf("%s through the gateway without a token: %d, real Ray %d", c.Target, anon, direct)
		}
		if with != want {
			t.Errorf("%s through the gateway with the client's token: %d, want %d (what Ray answers %s)", c.Target, with, want,
				map[bool]string{true: "without a token", false: "the cluster's token"}[c.Open])
		}
		t.Logf("%-36s open=%-5v ray without a token %d, through the gateway %d / with a token %d", c.Target, c.Open, direct, anon, with)
	}
}

func trim(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// dashboardInBrowser opens the dashboard through the gateway in headless Chromium (Debian's), logs in
// with the canonical token as a person would, and waits for the jobs page to show jobID; the
// screenshot is kept in e2e/artifacts.
func (e *Env) dashboardInBrowser(t *testing.T, front, token, jobID string) {
	tool, err := framework.EnsureBrowser(e.ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	root, _ := framework.RepoRoot()
	shot := filepath.Join(root, "e2e", "artifacts", "gateway-dashboard-jobs.png")
	if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
		t.Fatal(err)
	}
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(e.ctx, tool, "-url", front, "-token-file", tokenFile, "-expect", jobID,
		"-screenshot", shot, "-chromium", framework.Chromium, "-timeout", "3m").Output()
	if err != nil {
		t.Fatalf("browser: %v", err)
	}
	var r struct {
		LoginAsked, LoggedIn, JobsShown, CookieHoldsToken bool
		Title, Error                                      string
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("browser output: %v", err)
	}
	if strings.Contains(string(out), token) {
		t.Fatal("the browser's report holds the token")
	}
	if !r.LoginAsked || !r.LoggedIn || !r.JobsShown || !r.CookieHoldsToken || r.Error != "" {
		t.Errorf("the dashboard through the gateway in Chromium: %+v (screenshot %s)", r, shot)
		return
	}
	t.Logf("Chromium: the dashboard (%q) asked for a token, logged in with the canonical one and showed job %s; screenshot %s", r.Title, jobID, shot)
}
