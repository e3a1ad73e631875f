package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// The tokens of this file: what clients hold, and what the two clusters behind the gateway run on.
var (
	clientCurrent  = []byte("client-current-token")
	clientPrevious = []byte("client-previous-token")
	clientPending  = []byte("client-pending-token")
	clusterToken1  = []byte("cluster-token-one")
	clusterToken2  = []byte("cluster-token-two")
)

var testNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func testTable() *Table {
	later, earlier := testNow.Add(time.Hour), testNow.Add(-time.Second)
	return &Table{
		Accept: []Accepted{{Credential: Current, SHA256: Digest(clientCurrent)},
			{Credential: Previous, SHA256: Digest(clientPrevious), Until: &later},
			{Credential: Previous, SHA256: Digest([]byte("expired-token")), Until: &earlier},
			{Credential: Pending, SHA256: Digest(clientPending)}},
		Tokens: map[string][]byte{"t1": clusterToken1, "t2": clusterToken2},
		Routes: map[string]Route{
			"ml/svc":       {Kind: "RayService", Cluster: "svc-abc", Service: "svc-abc-head-svc", Token: "t1"},
			"ml/batch":     {Kind: "RayCluster", Cluster: "batch", Service: "batch-head-svc", Token: "t2"},
			"ml/dup":       {Kind: "RayCluster", Cluster: "dup", Service: "dup-head-svc", Token: "t2"},
			"other/dup":    {Kind: "RayCluster", Cluster: "dup", Service: "dup-head-svc", Token: "t2"},
			"ml/misrouted": {Kind: "RayCluster", Cluster: "misrouted", Service: "misrouted-head-svc", Token: "t1"}, // runs on t2 in fact
		},
	}
}

// ray is a head's dashboard and Ray Client as the gateway sees them: each Service accepts exactly the
// token of its cluster, as Ray does.
type ray struct {
	mu          sync.Mutex
	seen        []*http.Request // dashboard requests as they arrived
	clientCalls int             // Ray Client calls the head accepted
	dash        *httptest.Server
	client      *http.Server
	clientLn    net.Listener
}

var clusterOf = map[string][]byte{"svc-abc-head-svc": clusterToken1, "batch-head-svc": clusterToken2, "dup-head-svc": clusterToken2, "misrouted-head-svc": clusterToken2}

func serviceOf(host string) string { s, _, _ := strings.Cut(host, "."); return s }

func newRay(t *testing.T) *ray {
	r := &ray{}
	r.dash = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.seen = append(r.seen, req.Clone(context.Background()))
		r.mu.Unlock()
		// Ray's middlewares in their order: the token (its own open paths skip it), then path cleaning.
		if !rayOpen(req.URL.Path) {
			switch v := presentedAsRay(req); v {
			case "":
				rayText(w, http.StatusUnauthorized, "Unauthorized: Missing authentication token")
				return
			case "Bearer " + string(clusterOf[serviceOf(req.Host)]):
			default:
				rayText(w, http.StatusForbidden, "Forbidden: Invalid authentication token")
				return
			}
		}
		if strings.HasPrefix(req.URL.Path, "/static") && !strings.HasPrefix(path.Clean(req.URL.Path)+"/", "/static/") {
			rayText(w, http.StatusForbidden, "403: Forbidden")
			return
		}
		switch req.URL.Path {
		case "/worker/traceback":
			rayText(w, http.StatusForbidden, "Profiling is disabled by default for security reasons.")
		case "/static/js/main.js":
			_, _ = io.WriteString(w, "// the dashboard's code")
		case "/upload":
			h := sha256.New()
			n, _ := io.Copy(h, req.Body)
			fmt.Fprintf(w, "%d %x", n, h.Sum(nil))
		case "/stream":
			for i := range 3 {
				fmt.Fprintf(w, "chunk %d\n", i)
				w.(http.Flusher).Flush()
				if i == 0 {
					<-req.Context().Done() // the client reads the first chunk, then hangs up
					return
				}
			}
		case "/ws":
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			_, _ = buf.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			_ = buf.Flush()
			_, _ = io.Copy(conn, buf) // echo
		default:
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: string(clusterOf[serviceOf(req.Host)])})
			http.SetCookie(w, &http.Cookie{Name: "other", Value: "kept"})
			_ = json.NewEncoder(w).Encode(map[string]string{"host": req.Host, "path": req.URL.Path})
		}
	}))
	t.Cleanup(r.dash.Close)
	r.startClient(t, "127.0.0.1:0")
	return r
}

// rayOpen is Ray 2.60's list of paths served without a token (the test's own copy).
func rayOpen(p string) bool {
	switch p {
	case "/", "/favicon.ico", "/api/authentication_mode", "/api/authenticate", "/api/healthz", "/api/gcs_healthz", "/api/local_raylet_healthz", "/-/healthz":
		return true
	}
	return strings.HasPrefix(p, "/static/")
}

// presentedAsRay is the credential Ray reads: Authorization, X-Ray-Authorization, the cookie.
func presentedAsRay(req *http.Request) string {
	if v := req.Header.Get("Authorization"); v != "" {
		return v
	}
	if v := req.Header.Get("X-Ray-Authorization"); v != "" {
		return v
	}
	if c, err := req.Cookie("ray-authentication-token"); err == nil && c.Value != "" {
		return "Bearer " + c.Value
	}
	return ""
}

// rayText answers as aiohttp's web.Response(status, text) does.
func rayText(w http.ResponseWriter, status int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, text)
}

// startClient serves Ray Client's gRPC: every message echoed, then grpc-status 0; a wrong token is
// refused Trailers-Only with UNAUTHENTICATED, as Ray's interceptor does.
func (r *ray) startClient(t *testing.T, addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if a := req.Header.Values("Authorization"); len(a) != 1 || a[0] != "Bearer "+string(clusterOf[serviceOf(req.Host)]) {
			grpcError(w, grpcUnauthenticated, "Invalid or missing authentication token")
			return
		}
		r.mu.Lock()
		r.clientCalls++
		r.mu.Unlock()
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		if strings.HasSuffix(req.URL.Path, "/Flood") { // a server stream: messages until the client goes
			msg := frame(bytes.Repeat([]byte("x"), 16<<10))
			for req.Context().Err() == nil {
				if _, err := w.Write(msg); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
			return
		}
		for {
			msg, err := readMsg(req.Body)
			if err != nil {
				break
			}
			_, _ = w.Write(frame(msg))
			w.(http.Flusher).Flush()
		}
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	r.client, r.clientLn = srv, ln
	t.Cleanup(func() { srv.Close() })
}

// grpcError answers a gRPC call Trailers-Only, as Ray's interceptor does a refusal.
func grpcError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", strconv.Itoa(code))
	w.Header().Set("Grpc-Message", url.PathEscape(msg))
	w.WriteHeader(http.StatusOK)
}

func frame(msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

func readMsg(r io.Reader) ([]byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, binary.BigEndian.Uint32(h[1:]))
	_, err := io.ReadFull(r, msg)
	return msg, err
}

// harness is a gateway in front of one ray, with what it observed.
type harness struct {
	ray        *ray
	gw         *Gateway
	dash       *httptest.Server
	clientAddr string
	mu         sync.Mutex
	results    []string               // "protocol result credential"
	seconds    []float64              // each result's latency as observed
	upstream   []string               // protocols of upstream auth failures
	clock      time.Time              // the gateway's now
	logs       *observer.ObservedLogs // what the gateway logged, debug included

	clientServer  *ClientServer
	clientLimiter *ConnLimiter
}

func (h *harness) now() time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.clock
}

func (h *harness) advance(d time.Duration) {
	h.mu.Lock()
	h.clock = h.clock.Add(d)
	h.mu.Unlock()
}

func newHarness(t *testing.T, table *Table) *harness { return newHarnessWith(t, table, Limits{}) }

// newHarnessWith is newHarness with limits (zero fields: the defaults).
func newHarnessWith(t *testing.T, table *Table, limits Limits, opts ...func(*Options)) *harness {
	h := &harness{ray: newRay(t), clock: testNow}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	h.gw = New(withOptions(opts, Options{DashboardPort: 8265, ClientPort: 10001, Now: h.now, Limits: limits, Log: zap.New(core),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			if strings.HasPrefix(addr, "gone-head-svc.") { // a head that is not there: refused
				return d.DialContext(ctx, network, "127.0.0.1:1")
			}
			if strings.HasSuffix(addr, ":10001") {
				return d.DialContext(ctx, network, h.ray.clientLn.Addr().String())
			}
			return d.DialContext(ctx, network, h.ray.dash.Listener.Addr().String())
		},
		Observe: func(p, r string, c Credential, seconds float64) {
			h.mu.Lock()
			h.results = append(h.results, p+" "+r+" "+string(c))
			h.seconds = append(h.seconds, seconds)
			h.mu.Unlock()
		},
		UpstreamAuthFailure: func(p string) { h.mu.Lock(); h.upstream = append(h.upstream, p); h.mu.Unlock() },
	}))
	if table != nil {
		h.gw.SetTable(table)
	}
	h.dash = httptest.NewUnstartedServer(nil)
	h.dash.Config = h.gw.DashboardServer()
	h.dash.Start()
	t.Cleanup(h.dash.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.clientLimiter = LimitConnections(ln, h.gw.opts.Limits.MaxConnections, nil)
	srv := h.gw.ClientServer()
	h.clientServer = srv
	go func() { _ = srv.Serve(h.clientLimiter) }()
	t.Cleanup(func() { srv.Close() })
	h.clientAddr = ln.Addr().String()
	return h
}

func (h *harness) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.results)
}

// after is the result observed after the first n (the handler records it once it has answered, which
// may be just after the client has its answer).
func (h *harness) after(n int) string {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		h.mu.Lock()
		if len(h.results) > n {
			r := h.results[n]
			h.mu.Unlock()
			return r
		}
		h.mu.Unlock()
	}
	return ""
}

func TestAccepts(t *testing.T) {
	tab := testTable()
	for name, tc := range map[string]struct {
		token []byte
		at    time.Time
		want  Credential
	}{
		"current":                         {clientCurrent, testNow, Current},
		"previous within its grace":       {clientPrevious, testNow, Previous},
		"previous after its grace":        {clientPrevious, testNow.Add(2 * time.Hour), None},
		"an expired entry":                {[]byte("expired-token"), testNow, None},
		"pending, before clients have it": {clientPending, testNow, Pending},
		"a cluster's own token":           {clusterToken1, testNow, None},
		"empty":                           {nil, testNow, None},
		"a prefix of the current token":   {clientCurrent[:5], testNow, None},
	} {
		t.Run(name, func(t *testing.T) {
			if got := tab.accepts(tc.token, tc.at); got != tc.want {
				t.Errorf("accepts = %q, want %q", got, tc.want)
			}
		})
	}
	// Revoking the previous token is publishing a table without it.
	revoked := testTable()
	revoked.Accept = revoked.Accept[:1]
	if got := revoked.accepts(clientPrevious, testNow); got != None {
		t.Errorf("revoked previous token accepted as %q", got)
	}
}

func TestRoute(t *testing.T) {
	g := New(Options{})
	tab := testTable()
	for host, want := range map[string]string{
		"svc-gw.ml":                             "svc-abc-head-svc.ml.svc.cluster.local:8265",
		"svc-gw.ml.svc":                         "svc-abc-head-svc.ml.svc.cluster.local:8265",
		"svc-gw.ml.svc.cluster.local:8265":      "svc-abc-head-svc.ml.svc.cluster.local:8265",
		"SVC-GW.ML.SVC.CLUSTER.LOCAL.":          "svc-abc-head-svc.ml.svc.cluster.local:8265",
		"svc-gw:8265":                           "svc-abc-head-svc.ml.svc.cluster.local:8265", // one namespace has it
		"batch-gw.ml":                           "batch-head-svc.ml.svc.cluster.local:8265",
		"dup-gw":                                "error: in several namespaces",
		"svc.ml":                                "error: not <name>-gw",
		"nope-gw.ml":                            "error: no RayService or RayCluster ml/nope",
		"svc-gw.ml.example.com":                 "error: not <name>-gw",
		"svc-gw.other":                          "error: no RayService or RayCluster other/svc",
		"-gw.ml":                                "error: not <name>-gw",
		"127.0.0.1:8265":                        "error: not <name>-gw",
		"svc-abc-head-svc.ml.svc.cluster.local": "error: not <name>-gw",
	} {
		up, err := g.route(tab, host, 8265)
		got := up.addr
		if err != nil {
			got = "error: " + err.Error()
		}
		if strings.HasPrefix(want, "error: ") {
			if err == nil || !strings.Contains(got, strings.TrimPrefix(want, "error: ")) {
				t.Errorf("%s: %s, want %s", host, got, want)
			}
			continue
		}
		if got != want {
			t.Errorf("%s: %s, want %s", host, got, want)
		}
	}
}

func TestDashboard(t *testing.T) {
	h := newHarness(t, testTable())
	bearer := func(tok []byte) string { return "Bearer " + string(tok) }
	for name, tc := range map[string]struct {
		method, path, host string
		header             map[string]string
		cookie             string
		wantStatus         int
		wantResult         string
		forwarded          bool
	}{
		"no credential: 401, as Ray":                    {path: "/api/jobs/", wantStatus: 401, wantResult: "http unauthenticated none"},
		"the current token":                             {path: "/api/jobs/", header: map[string]string{"Authorization": bearer(clientCurrent)}, wantStatus: 200, wantResult: "http forwarded current", forwarded: true},
		"the previous token in X-Ray-Authorization":     {path: "/api/jobs/", header: map[string]string{"X-Ray-Authorization": bearer(clientPrevious)}, wantStatus: 200, wantResult: "http forwarded previous", forwarded: true},
		"the pending token in the cookie":               {path: "/api/jobs/", cookie: string(clientPending), wantStatus: 200, wantResult: "http forwarded pending", forwarded: true},
		"a wrong token: 403, as Ray":                    {path: "/api/jobs/", header: map[string]string{"Authorization": bearer([]byte("wrong"))}, wantStatus: 403, wantResult: "http forbidden none"},
		"a cluster's own token is no client credential": {path: "/api/jobs/", header: map[string]string{"Authorization": bearer(clusterToken1)}, wantStatus: 403, wantResult: "http forbidden none"},
		"not Bearer: 403, as Ray":                       {path: "/api/jobs/", header: map[string]string{"Authorization": "Basic " + string(clientCurrent)}, wantStatus: 403, wantResult: "http forbidden none"},
		"Authorization wins over X-Ray-Authorization":   {path: "/api/jobs/", header: map[string]string{"Authorization": bearer([]byte("wrong")), "X-Ray-Authorization": bearer(clientCurrent)}, wantStatus: 403, wantResult: "http forbidden none"},
		"a public path needs no token":                  {path: "/api/healthz", wantStatus: 200, wantResult: "http forwarded none", forwarded: true},
		"the other cluster, by its own token":           {path: "/api/jobs/", host: "batch-gw.ml.svc", header: map[string]string{"Authorization": bearer(clientCurrent)}, wantStatus: 200, wantResult: "http forwarded current", forwarded: true},
		"an unknown object: 404":                        {path: "/api/jobs/", host: "nope-gw.ml", header: map[string]string{"Authorization": bearer(clientCurrent)}, wantStatus: 404, wantResult: "http no_route current"},
		"unauthenticated before routing":                {path: "/api/jobs/", host: "nope-gw.ml", wantStatus: 401, wantResult: "http unauthenticated none"},
		"a cluster refusing the gateway's token: 502":   {path: "/api/jobs/", host: "misrouted-gw.ml", header: map[string]string{"Authorization": bearer(clientCurrent)}, wantStatus: 502, wantResult: "http upstream_error current", forwarded: true},
		"login with the current token":                  {method: "POST", path: "/api/authenticate", header: map[string]string{"Authorization": bearer(clientCurrent)}, wantStatus: 200, wantResult: "http authenticated current"},
		"login without a token: 401":                    {method: "POST", path: "/api/authenticate", wantStatus: 401, wantResult: "http unauthenticated none"},
		"login reads only Authorization, as Ray":        {method: "POST", path: "/api/authenticate", header: map[string]string{"X-Ray-Authorization": bearer(clientCurrent)}, wantStatus: 401, wantResult: "http unauthenticated none"},
		"login with a wrong token: 403":                 {method: "POST", path: "/api/authenticate", header: map[string]string{"Authorization": bearer([]byte("wrong"))}, wantStatus: 403, wantResult: "http forbidden none"},
	} {
		t.Run(name, func(t *testing.T) {
			h.ray.mu.Lock()
			before := len(h.ray.seen)
			h.ray.mu.Unlock()
			n := h.count()
			method := tc.method
			if method == "" {
				method = "GET"
			}
			req, _ := http.NewRequest(method, h.dash.URL+tc.path, nil)
			req.Host = "svc-gw.ml.svc.cluster.local:8265"
			if tc.host != "" {
				req.Host = tc.host
			}
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			req.AddCookie(&http.Cookie{Name: "other", Value: "client"})
			if tc.cookie != "" {
				req.AddCookie(&http.Cookie{Name: cookieName, Value: tc.cookie})
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.wantStatus {
				t.Errorf("status %d (%s), want %d", resp.StatusCode, body, tc.wantStatus)
			}
			if got := h.after(n); got != tc.wantResult {
				t.Errorf("observed %q, want %q", got, tc.wantResult)
			}
			for _, c := range resp.Cookies() {
				if c.Name == cookieName && (c.Value == string(clusterToken1) || c.Value == string(clusterToken2)) {
					t.Error("a cluster's token reached the client in a cookie")
				}
			}
			if tc.path == "/api/authenticate" && resp.StatusCode == 200 {
				var got *http.Cookie
				for _, c := range resp.Cookies() {
					if c.Name == cookieName {
						got = c
					}
				}
				if got == nil || got.Value != string(clientCurrent) || !got.HttpOnly || got.SameSite != http.SameSiteStrictMode {
					t.Errorf("login cookie %+v: want the client's own token, HttpOnly, SameSite Strict", got)
				}
			}
			h.ray.mu.Lock()
			seen := h.ray.seen[before:]
			h.ray.mu.Unlock()
			if tc.forwarded != (len(seen) == 1) {
				t.Fatalf("forwarded %d requests, want forwarded=%v", len(seen), tc.forwarded)
			}
			if !tc.forwarded {
				return
			}
			up := seen[0]
			want := "Bearer " + string(clusterOf[serviceOf(up.Host)])
			switch {
			case rayOpen(tc.path):
				want = "" // Ray serves it without a token: the cluster's is never added
			case resp.StatusCode == http.StatusBadGateway:
				want = "Bearer " + string(clusterToken1) // the table's (wrong) token for it
			}
			if up.Header.Get("Authorization") != want || up.Header.Get("X-Ray-Authorization") != "" {
				t.Errorf("upstream credentials: Authorization %q, X-Ray-Authorization %q; want only the cluster's token",
					redact(up.Header.Get("Authorization")), redact(up.Header.Get("X-Ray-Authorization")))
			}
			for _, c := range up.Cookies() {
				if c.Name == cookieName {
					t.Error("the client's token cookie reached the cluster")
				}
			}
			if c, err := up.Cookie("other"); err != nil || c.Value != "client" {
				t.Error("the client's other cookies were not forwarded")
			}
			if resp.StatusCode == 200 && tc.path == "/api/jobs/" {
				var other bool
				for _, c := range resp.Cookies() {
					other = other || c.Name == "other"
				}
				if !other {
					t.Error("the cluster's other cookies did not reach the client")
				}
			}
		})
	}
	if len(h.upstream) != 1 || h.upstream[0] != ProtoHTTP {
		t.Errorf("upstream auth failures %v, want one (http)", h.upstream)
	}
}

// redact keeps test output free of tokens.
func redact(v string) string {
	if v == "" {
		return ""
	}
	return fmt.Sprintf("<%d bytes>", len(v))
}

func TestNotReadyRefusesEverything(t *testing.T) {
	h := newHarness(t, nil)
	req, _ := http.NewRequest("GET", h.dash.URL+"/api/healthz", nil)
	req.Host = "svc-gw.ml"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || len(h.ray.seen) != 0 {
		t.Errorf("before a table: %d, %d forwarded; want 503 and nothing forwarded", resp.StatusCode, len(h.ray.seen))
	}
	status, _, _ := h.call(t, "svc-gw.ml:10001", "Bearer "+string(clientCurrent), [][]byte{[]byte("x")})
	if status != "14" {
		t.Errorf("Ray Client before a table: grpc-status %s, want 14", status)
	}
}

// call makes one Ray Client call through the gateway: msgs sent one by one, each echo read before
// the next is sent (a bidirectional stream), and the final grpc-status.
func (h *harness) call(t *testing.T, authority, auth string, msgs [][]byte) (status string, echoed [][]byte, err error) {
	t.Helper()
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "http://"+h.clientAddr+"/ray.rpc.RayletDriver/Datapath", pr)
	req.Host = authority
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	type result struct {
		resp *http.Response
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		done <- result{resp, err}
	}()
	// The first message goes out before the response headers: gRPC clients do not wait for them (a
	// stream answered at once, Trailers-Only, may have ended before it is written).
	if len(msgs) > 0 {
		if _, err := pw.Write(frame(msgs[0])); err != nil && !errors.Is(err, io.ErrClosedPipe) {
			return "", nil, err
		}
	}
	r := <-done
	if r.err != nil {
		return "", nil, r.err
	}
	defer r.resp.Body.Close()
	if s := r.resp.Header.Get("Grpc-Status"); s != "" { // Trailers-Only
		pw.Close()
		return s, nil, nil
	}
	for i := range msgs {
		if i > 0 {
			if _, err := pw.Write(frame(msgs[i])); err != nil {
				return "", echoed, err
			}
		}
		m, err := readMsg(r.resp.Body)
		if err != nil {
			return "", echoed, err
		}
		echoed = append(echoed, m)
	}
	pw.Close()
	if _, err := io.Copy(io.Discard, r.resp.Body); err != nil {
		return "", echoed, err
	}
	return r.resp.Trailer.Get("Grpc-Status"), echoed, nil
}

func TestRayClient(t *testing.T) {
	h := newHarness(t, testTable())
	msgs := [][]byte{[]byte("one"), []byte("two"), bytes.Repeat([]byte("x"), 100_000)}
	for name, tc := range map[string]struct {
		authority, auth string
		wantStatus      string
		wantResult      string
	}{
		"the current token: a bidirectional stream, with its trailers": {"svc-gw.ml.svc:10001", "Bearer " + string(clientCurrent), "0", "grpc forwarded current"},
		"the previous token":                                   {"svc-gw.ml:10001", "Bearer " + string(clientPrevious), "0", "grpc forwarded previous"},
		"no token: UNAUTHENTICATED, as Ray":                    {"svc-gw.ml:10001", "", "16", "grpc unauthenticated none"},
		"a wrong token: UNAUTHENTICATED":                       {"svc-gw.ml:10001", "Bearer wrong", "16", "grpc forbidden none"},
		"an unknown object: NOT_FOUND":                         {"nope-gw.ml:10001", "Bearer " + string(clientCurrent), "5", "grpc no_route current"},
		"a cluster refusing the gateway: UNAVAILABLE, counted": {"misrouted-gw.ml:10001", "Bearer " + string(clientCurrent), "14", "grpc forwarded current"},
	} {
		t.Run(name, func(t *testing.T) {
			n := h.count()
			status, echoed, err := h.call(t, tc.authority, tc.auth, msgs)
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.wantStatus {
				t.Errorf("grpc-status %s, want %s", status, tc.wantStatus)
			}
			if tc.wantStatus == "0" && (len(echoed) != len(msgs) || !bytes.Equal(echoed[2], msgs[2])) {
				t.Errorf("echoed %d of %d messages", len(echoed), len(msgs))
			}
			if got := h.after(n); got != tc.wantResult {
				t.Errorf("observed %q, want %q", got, tc.wantResult)
			}
		})
	}
	if len(h.upstream) != 1 || h.upstream[0] != ProtoGRPC {
		t.Errorf("upstream auth failures %v, want one (grpc)", h.upstream)
	}
}

// TestRefusalsAreLoggedAtDebugWithoutTheCredential: every call refused for want of an accepted
// credential (401/403 over HTTP, UNAUTHENTICATED over Ray Client) is logged at debug with its result,
// the object it asked for and the caller's address (what the RaysyncGatewayRefusingClients runbook
// greps for), and no field holds what the caller presented.
func TestRefusalsAreLoggedAtDebugWithoutTheCredential(t *testing.T) {
	h := newHarness(t, testTable())
	wrong := "wrong-but-maybe-someones-real-token"
	h.do(t, "GET", "/api/jobs/", "svc-gw.ml.svc:8265", nil)
	h.do(t, "GET", "/api/jobs/", "svc-gw.ml.svc:8265", map[string]string{"Authorization": "Bearer " + wrong})
	h.do(t, "POST", "/api/authenticate", "batch-gw.ml:8265", map[string]string{"Authorization": "Bearer " + wrong, "Content-Length": "0"})
	for _, auth := range []string{"", "Bearer " + wrong} {
		if _, _, err := h.call(t, "svc-gw.ml.svc:10001", auth, [][]byte{[]byte("one")}); err != nil {
			t.Fatal(err)
		}
	}
	h.do(t, "GET", "/api/jobs/", "svc-gw.ml.svc:8265", map[string]string{"Authorization": "Bearer " + string(clientCurrent)}) // accepted: not logged
	want := []string{
		"http unauthenticated svc-gw.ml.svc:8265",
		"http forbidden svc-gw.ml.svc:8265",
		"http forbidden batch-gw.ml:8265",
		"grpc unauthenticated svc-gw.ml.svc:10001",
		"grpc forbidden svc-gw.ml.svc:10001",
	}
	var got []string
	for _, e := range h.logs.FilterMessage("refused").All() {
		f := e.ContextMap()
		if e.Level != zapcore.DebugLevel {
			t.Errorf("logged at %s, want debug: a refusal per call at info floods the log", e.Level)
		}
		if r, _ := f["remote"].(string); !strings.HasPrefix(r, "127.0.0.1:") {
			t.Errorf("remote %q: the caller's address is what finds the client", r)
		}
		got = append(got, fmt.Sprintf("%v %v %v", f["protocol"], f["result"], f["host"]))
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("refusals logged:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, e := range h.logs.All() {
		for k, v := range e.ContextMap() {
			if s := fmt.Sprint(v); strings.Contains(s, wrong) || strings.Contains(s, string(clientCurrent)) {
				t.Errorf("log %q field %s holds a credential", e.Message, k)
			}
		}
	}
}

func withOptions(opts []func(*Options), o Options) Options {
	for _, f := range opts {
		f(&o)
	}
	return o
}

// TestRefusedCallersAreSummarizedAtInfo (issue 37 item 4): finding which client the gateway refuses
// needs no debug level, hence no rollout. Once per window the gateway logs at info the callers it
// refused (address without port, host, protocol, result, count; the most refused first), never what
// they presented; a flood of distinct callers is bounded (past 1,000 they are only counted), and a
// window without refusals logs nothing.
func TestRefusedCallersAreSummarizedAtInfo(t *testing.T) {
	h := newHarnessWith(t, testTable(), Limits{}, func(o *Options) { o.RefusalSummary = 300 * time.Millisecond })
	wrong := "wrong-but-maybe-someones-real-token"
	for range 3 {
		h.do(t, "GET", "/api/jobs/", "svc-gw.ml.svc:8265", map[string]string{"Authorization": "Bearer " + wrong})
	}
	h.do(t, "GET", "/api/jobs/", "batch-gw.ml:8265", nil)
	if _, _, err := h.call(t, "svc-gw.ml.svc:10001", "Bearer "+wrong, [][]byte{[]byte("one")}); err != nil {
		t.Fatal(err)
	}
	h.do(t, "GET", "/api/jobs/", "svc-gw.ml.svc:8265", map[string]string{"Authorization": "Bearer " + string(clientCurrent)}) // accepted
	summaries := func() []observer.LoggedEntry {
		return h.logs.FilterMessage("refused callers").All()
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(summaries()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	got := summaries()
	if len(got) != 1 {
		t.Fatalf("%d summaries, want 1 for the window", len(got))
	}
	e := got[0]
	if e.Level != zapcore.InfoLevel {
		t.Errorf("summary at %s, want info", e.Level)
	}
	b, _ := json.Marshal(e.ContextMap())
	want := `{"callers":3,"refusals":5,"top":[{"count":3,"host":"svc-gw.ml.svc:8265","protocol":"http","remote":"127.0.0.1","result":"forbidden"},` +
		`{"count":1,"host":"batch-gw.ml:8265","protocol":"http","remote":"127.0.0.1","result":"unauthenticated"},` +
		`{"count":1,"host":"svc-gw.ml.svc:10001","protocol":"grpc","remote":"127.0.0.1","result":"forbidden"}],"window":"300ms"}`
	if string(b) != want {
		t.Errorf("summary\n %s\nwant\n %s", b, want)
	}
	if strings.Contains(string(b), wrong) || strings.Contains(string(b), string(clientCurrent)) {
		t.Error("the summary holds a credential")
	}
	// Nothing refused in the next window: nothing logged.
	time.Sleep(600 * time.Millisecond)
	if n := len(summaries()); n != 1 {
		t.Errorf("%d summaries after a quiet window, want still 1", n)
	}

	// A flood of distinct callers: the summary's memory is bounded.
	var r refusals
	flushed := make(chan [2]int, 1)
	for i := range maxRefusedCallers + 500 {
		r.add(refusedCaller{Remote: fmt.Sprint("198.18.", i/256, ".", i%256)}, 50*time.Millisecond, func(c map[refusedCaller]int, others int) { flushed <- [2]int{len(c), others} })
	}
	if got := <-flushed; got != [2]int{maxRefusedCallers, 500} {
		t.Errorf("callers kept, others counted: %v, want [%d 500]", got, maxRefusedCallers)
	}
}

func TestLargeUploadIsStreamed(t *testing.T) {
	h := newHarness(t, testTable())
	const size = 100 << 20 // Ray's limit for a working_dir package
	body := io.LimitReader(zeros{}, size)
	req, _ := http.NewRequest("PUT", h.dash.URL+"/upload", body)
	req.Host = "svc-gw.ml"
	req.Header.Set("Authorization", "Bearer "+string(clientCurrent))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	sum := sha256.Sum256(make([]byte, size))
	if want := fmt.Sprintf("%d %s", size, hex.EncodeToString(sum[:])); string(got) != want {
		t.Errorf("upstream received %s, want %s", got, want)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestStreamedResponseArrivesAsWritten(t *testing.T) {
	h := newHarness(t, testTable())
	req, _ := http.NewRequest("GET", h.dash.URL+"/stream", nil)
	req.Host = "svc-gw.ml"
	req.Header.Set("Authorization", "Bearer "+string(clientCurrent))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The upstream writes one chunk and waits for the client to hang up: the chunk must arrive first.
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != "chunk 0\n" {
		t.Fatalf("first chunk %q, %v", line, err)
	}
}

func TestWebsocketUpgrade(t *testing.T) {
	h := newHarness(t, testTable())
	conn, err := net.Dial("tcp", h.dash.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: svc-gw.ml\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", clientCurrent)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for _, msg := range []string{"tail line 1\n", "tail line 2\n"} {
		_, _ = io.WriteString(conn, msg)
		got, err := br.ReadString('\n')
		if err != nil || got != msg {
			t.Fatalf("echo %q, %v; want %q", got, err, msg)
		}
	}
}

func TestRayClientReconnectsAfterACutConnection(t *testing.T) {
	h := newHarness(t, testTable())
	auth := "Bearer " + string(clientCurrent)
	if status, _, err := h.call(t, "svc-gw.ml:10001", auth, [][]byte{[]byte("before")}); err != nil || status != "0" {
		t.Fatalf("before the cut: %s %v", status, err)
	}
	addr := h.ray.clientLn.Addr().String()
	h.ray.client.Close() // the head's connection is cut (the pod goes)
	status, _, err := h.call(t, "svc-gw.ml:10001", auth, [][]byte{[]byte("during")})
	if err == nil && status != "14" {
		t.Errorf("while the head is gone: grpc-status %s, want 14 (UNAVAILABLE) or a failed stream", status)
	}
	h.ray.startClient(t, addr) // the head is back, at the same address
	if status, echoed, err := h.call(t, "svc-gw.ml:10001", auth, [][]byte{[]byte("after")}); err != nil || status != "0" || len(echoed) != 1 {
		t.Fatalf("after the head is back: %s %v %v", status, echoed, err)
	}
}

func TestDecodeRefusesAnIncompleteTable(t *testing.T) {
	good := testTable()
	b, _ := good.Encode()
	if _, err := Decode(b); err != nil {
		t.Fatalf("a good table: %v", err)
	}
	for name, mutate := range map[string]func(*Table){
		"a route without its token": func(t *Table) { t.Routes["ml/x"] = Route{Cluster: "x", Service: "x-head-svc", Token: "nope"} },
		"a route without a Service": func(t *Table) { t.Routes["ml/x"] = Route{Cluster: "x", Token: "t1"} },
		"a digest that is not one":  func(t *Table) { t.Accept[0].SHA256 = "abc" },
	} {
		tab := testTable()
		mutate(tab)
		b, _ := tab.Encode()
		if _, err := Decode(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := Decode([]byte("{")); err == nil {
		t.Error("malformed JSON decoded")
	}
}
