package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// dashboardCall is one request to the gateway's dashboard port and what came of it.
type dashboardCall struct {
	status    int
	body      string
	forwarded []*http.Request // as the cluster received them
}

// do sends a request with a raw request target (so a crafted path reaches the gateway byte for
// byte), host and headers, and reports the answer and what reached the cluster.
func (h *harness) do(t *testing.T, method, target, host string, header map[string]string) dashboardCall {
	t.Helper()
	h.ray.mu.Lock()
	before := len(h.ray.seen)
	h.ray.mu.Unlock()
	conn, err := net.Dial("tcp", h.dash.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, target, host)
	for k, v := range header {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	h.ray.mu.Lock()
	seen := append([]*http.Request(nil), h.ray.seen[before:]...)
	h.ray.mu.Unlock()
	return dashboardCall{status: resp.StatusCode, body: string(body), forwarded: seen}
}

func (h *harness) upstreamFailures() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.upstream)
}

// TestOpenPaths: what Ray serves without a token the gateway forwards without one — to anyone, and
// never with the cluster's token, even for a client that presents a good one — decided on the path as
// Ray's middleware sees it (percent-decoded, not normalised), so a path crafted to leave /static after
// Ray's own check cannot borrow the cluster's credential: Ray's path cleaning refuses it (403).
func TestOpenPaths(t *testing.T) {
	h := newHarness(t, testTable())
	current := map[string]string{"Authorization": "Bearer " + string(clientCurrent)}
	stale := map[string]string{"Cookie": "ray-authentication-token=expired-token"}
	for name, tc := range map[string]struct {
		target string
		header map[string]string
		status int
	}{
		"the dashboard's page":                                        {"/", nil, 200},
		"its scripts, which a browser loads before the login":         {"/static/js/main.js", nil, 200},
		"its scripts, with a stale cookie (Ray ignores it there)":     {"/static/js/main.js", stale, 200},
		"its scripts, with a good token: still without the cluster's": {"/static/js/main.js", current, 200},
		"the authentication mode":                                     {"/api/authentication_mode", nil, 200},
		"a health check":                                              {"/api/gcs_healthz", current, 200},
		"a traversal out of /static":                                  {"/static/../api/jobs/", current, 403},
		"an encoded traversal out of /static":                         {"/static/..%2fapi/jobs/", current, 403},
		"an encoded traversal, without a token":                       {"/static/%2e%2e/api/jobs/", nil, 403},
		"an encoded /static (Ray decodes it too)":                     {"/%73tatic/js/main.js", nil, 200},
	} {
		t.Run(name, func(t *testing.T) {
			c := h.do(t, "GET", tc.target, "svc-gw.ml", tc.header)
			if c.status != tc.status {
				t.Errorf("HTTP %d (%q), want %d", c.status, c.body, tc.status)
			}
			if len(c.forwarded) != 1 {
				t.Fatalf("%d requests reached the cluster, want 1", len(c.forwarded))
			}
			up := c.forwarded[0]
			if a, x := up.Header.Get("Authorization"), up.Header.Get("X-Ray-Authorization"); a != "" || x != "" {
				t.Errorf("forwarded with a credential (Authorization %s, X-Ray-Authorization %s): Ray serves this path without one", redact(a), redact(x))
			}
			if _, err := up.Cookie(cookieName); err == nil {
				t.Error("the client's token cookie reached the cluster")
			}
			if up.RequestURI != tc.target {
				t.Errorf("the cluster received %q, want the path as sent, %q", up.RequestURI, tc.target)
			}
		})
	}
	// What Ray does not serve without a token still needs one, whatever the encoding.
	for _, target := range []string{"/api/jobs/", "/%61pi/jobs/", "/static", "/STATIC/js/main.js", "//static/js/main.js", "/api/healthz/", "/./api/healthz"} {
		if c := h.do(t, "GET", target, "svc-gw.ml", nil); c.status != 401 || len(c.forwarded) != 0 {
			t.Errorf("%s without a token: HTTP %d, %d forwarded; want 401 and nothing forwarded", target, c.status, len(c.forwarded))
		}
	}
	if n := h.upstreamFailures(); n != 0 {
		t.Errorf("%d upstream auth failures counted: Ray's 403 for a traversal is not about the token", n)
	}
}

// TestUnauthenticatedCallersLearnNothing: without a credential the gateway accepts, every address —
// an object behind it, an unknown one, one in several namespaces, one that is not a gateway address
// at all — gets the same answer, and it names nothing.
func TestUnauthenticatedCallersLearnNothing(t *testing.T) {
	h := newHarness(t, testTable())
	hosts := []string{"svc-gw.ml", "nope-gw.ml", "svc-gw.elsewhere.svc.cluster.local:8265", "dup-gw", "svc.ml", "10.0.0.1:8265"}
	for _, cred := range []struct {
		name   string
		header map[string]string
		status int
	}{
		{"no credential", nil, 401},
		{"a wrong token", map[string]string{"Authorization": "Bearer wrong"}, 403},
		{"a revoked token in the cookie", map[string]string{"Cookie": "ray-authentication-token=expired-token"}, 403},
	} {
		for _, path := range []string{"/api/jobs/", "/api/version", "/nope", "/api/healthz"} {
			answers := map[string][]string{}
			for _, host := range hosts {
				c := h.do(t, "GET", path, host, cred.header)
				if path == "/api/healthz" && host == "svc-gw.ml" {
					continue // Ray's own open path on an object that is there: Ray's answer
				}
				key := fmt.Sprintf("%d %s", c.status, c.body)
				answers[key] = append(answers[key], host)
				if c.status != cred.status {
					t.Errorf("%s, %s at %s: HTTP %d %q, want %d", cred.name, path, host, c.status, c.body, cred.status)
				}
				for _, leak := range []string{"ml", "nope", "elsewhere", "dup", "namespace", "RayService"} {
					if strings.Contains(c.body, leak) {
						t.Errorf("%s, %s at %s: the answer %q names %q", cred.name, path, host, c.body, leak)
					}
				}
			}
			if len(answers) != 1 {
				t.Errorf("%s, %s: the answers differ by address: %v", cred.name, path, answers)
			}
		}
	}
	// The gRPC port alike.
	for _, authority := range []string{"svc-gw.ml:10001", "nope-gw.ml:10001", "dup-gw:10001", "10.0.0.1:10001"} {
		if status, _, err := h.call(t, authority, "", nil); err != nil || status != "16" {
			t.Errorf("Ray Client without a token at %s: grpc-status %s (%v), want 16", authority, status, err)
		}
	}
}

// TestBadGatewayNamesNoAddress: when a cluster cannot be reached or refuses the gateway, the client
// learns that, not where the gateway tried.
func TestBadGatewayNamesNoAddress(t *testing.T) {
	tab := testTable()
	tab.Routes["ml/gone"] = Route{Kind: "RayCluster", Cluster: "gone", Service: "gone-head-svc", Token: "t1"}
	h := newHarness(t, tab)
	current := map[string]string{"Authorization": "Bearer " + string(clientCurrent)}
	for _, host := range []string{"gone-gw.ml", "misrouted-gw.ml"} {
		c := h.do(t, "GET", "/api/jobs/", host, current)
		if c.status != http.StatusBadGateway {
			t.Errorf("%s: HTTP %d, want 502", host, c.status)
		}
		for _, leak := range []string{"svc.cluster.local", "head-svc", "127.0.0.1", "dial", "tcp"} {
			if strings.Contains(c.body, leak) {
				t.Errorf("%s: the 502 %q names %q", host, c.body, leak)
			}
		}
	}
	status, _, err := h.call(t, "gone-gw.ml:10001", "Bearer "+string(clientCurrent), [][]byte{[]byte("x")})
	if err == nil && status != "14" {
		t.Errorf("Ray Client to a cluster that is gone: grpc-status %s, want 14", status)
	}
}

// TestOnlyTokenRefusalsCountAsUpstreamAuthFailures: Ray answers 403 for reasons that have nothing to
// do with the token (path cleaning, profiling off); a token holder's request that meets one gets
// Ray's answer and is no upstream auth failure. Only Ray's refusal of the token the gateway
// forwarded with is.
func TestOnlyTokenRefusalsCountAsUpstreamAuthFailures(t *testing.T) {
	h := newHarness(t, testTable())
	current := map[string]string{"Authorization": "Bearer " + string(clientCurrent)}
	for _, tc := range []struct {
		target, host string
		status       int
		counted      bool
	}{
		{"/static/..%2fapi/jobs/", "svc-gw.ml", 403, false},
		{"/worker/traceback", "svc-gw.ml", 403, false},
		{"/api/jobs/", "misrouted-gw.ml", 502, true}, // the table's token is not the cluster's
	} {
		before := h.upstreamFailures()
		c := h.do(t, "GET", tc.target, tc.host, current)
		if c.status != tc.status {
			t.Errorf("%s at %s: HTTP %d %q, want %d", tc.target, tc.host, c.status, c.body, tc.status)
		}
		if counted := h.upstreamFailures() > before; counted != tc.counted {
			t.Errorf("%s at %s: counted as an upstream auth failure: %v, want %v", tc.target, tc.host, counted, tc.counted)
		}
		if tc.status == 403 && !strings.HasPrefix(c.body, "403: Forbidden") && !strings.HasPrefix(c.body, "Profiling") {
			t.Errorf("%s: the client got %q, not Ray's answer", tc.target, c.body)
		}
	}
}

// TestSlowClientsHoldNothing: a client that announces a body and never sends it, or that connects and
// says nothing, is answered or cut off; neither holds a connection for ever.
func TestSlowClientsHoldNothing(t *testing.T) {
	h := newHarness(t, testTable())
	for name, request := range map[string]string{
		"an unauthenticated POST that never sends its body":   "POST /api/jobs/ HTTP/1.1\r\nHost: svc-gw.ml\r\nContent-Length: 1000\r\n\r\n",
		"a wrong token, a body announced and never sent":      "PUT /api/packages/x HTTP/1.1\r\nHost: svc-gw.ml\r\nAuthorization: Bearer wrong\r\nContent-Length: 100\r\n\r\n",
		"an unknown address, a body announced, chunked":       "POST /api/jobs/ HTTP/1.1\r\nHost: nope-gw.ml\r\nTransfer-Encoding: chunked\r\n\r\n",
		"a path Ray serves without a token, a body announced": "POST /static/js/main.js HTTP/1.1\r\nHost: svc-gw.ml\r\nContent-Length: 10\r\n\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := net.Dial("tcp", h.dash.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second)) // generous: the answer is immediate
			if _, err := io.WriteString(conn, request); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != 401 && resp.StatusCode != 403 {
				t.Errorf("HTTP %d, want 401 or 403", resp.StatusCode)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("the connection stays open after refusing a request whose body it never read: %v", err)
			}
		})
	}
	if len(h.ray.seen) != 0 {
		t.Errorf("%d requests reached the cluster", len(h.ray.seen))
	}
}

// TestStreamsAreObservedAtTheirHeaders: the latency is the time to the answer's headers, and a
// request is counted (with its credential) as soon as it is answered, not when a stream ends hours
// later: a Ray Client session or a streamed answer on the previous token shows while it is open.
func TestStreamsAreObservedAtTheirHeaders(t *testing.T) {
	h := newHarness(t, testTable())

	// Ray Client: a bidirectional stream, open.
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "http://"+h.clientAddr+"/ray.rpc.RayletDriver/Datapath", pr)
	req.Host = "svc-gw.ml:10001"
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Authorization", "Bearer "+string(clientPrevious))
	n := h.count()
	go func() { _, _ = pw.Write(frame([]byte("hello"))) }()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := readMsg(resp.Body); err != nil {
		t.Fatal(err)
	}
	if got := h.after(n); got != "grpc forwarded previous" {
		t.Errorf("while the Ray Client stream is open, observed %q; want it counted on the previous token", got)
	}
	h.advance(time.Hour) // the session lasts
	pw.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	// A streamed dashboard answer: the first chunk arrives, the rest would take for ever.
	n2 := h.count()
	sreq, _ := http.NewRequest("GET", h.dash.URL+"/stream", nil)
	sreq.Host = "svc-gw.ml"
	sreq.Header.Set("Authorization", "Bearer "+string(clientCurrent))
	sresp, err := http.DefaultClient.Do(sreq)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(sresp.Body).ReadString('\n'); err != nil || line != "chunk 0\n" {
		t.Fatalf("first chunk %q, %v", line, err)
	}
	if got := h.after(n2); got != "http forwarded current" {
		t.Errorf("while the streamed answer is open, observed %q", got)
	}
	h.advance(time.Hour)
	sresp.Body.Close()

	deadline := time.Now().Add(5 * time.Second)
	for h.count() < n2+1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, s := range h.seconds[n:] {
		if s != 0 {
			t.Errorf("%s: %.0f s observed; want the time to its headers (0 on this clock), not the stream's length", h.results[n+i], s)
		}
	}
}

// TestRayServesWithoutToken: the gateway's decision on each of Ray's open-path cases, made on the
// path as Go's server parses the request target (decoded, not normalised) — the cases e2e checks
// against real Ray.
func TestRayServesWithoutToken(t *testing.T) {
	for _, c := range RayOpenPathCases {
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + c.Target + " HTTP/1.1\r\nHost: x\r\n\r\n")))
		if err != nil {
			t.Fatalf("%s: %v", c.Target, err)
		}
		if got := RayServesWithoutToken(req.URL.Path); got != c.Open {
			t.Errorf("%s (path %q): served without a token: %v, Ray: %v", c.Target, req.URL.Path, got, c.Open)
		}
	}
}
