package gateway

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// What Ray reads a client's token from (ray/_private/authentication): the HTTP middleware takes
// Authorization, then X-Ray-Authorization, then the cookie; Ray Client's gRPC interceptor only
// the authorization metadata. Each carries "Bearer <token>" (the cookie the bare token).
const (
	cookieName   = "ray-authentication-token"
	bearerPrefix = "Bearer "
	cookieMaxAge = 30 * 24 * 60 * 60 // Ray's own
)

// publicPaths are the dashboard paths Ray serves without a token: forwarded without one.
var publicPaths = map[string]bool{"/": true, "/favicon.ico": true, "/api/authentication_mode": true,
	"/api/healthz": true, "/api/gcs_healthz": true, "/api/local_raylet_healthz": true, "/-/healthz": true}

// Protocols (metric label protocol).
const (
	ProtoHTTP = "http" // Jobs API and dashboard, 8265
	ProtoGRPC = "grpc" // Ray Client, 10001
)

// Results (metric label result).
const (
	Forwarded       = "forwarded"
	Unauthenticated = "unauthenticated" // no credential
	Forbidden       = "forbidden"       // a credential the gateway does not accept
	NoRoute         = "no_route"
	NotReady        = "not_ready"
	UpstreamError   = "upstream_error"
	Authenticated   = "authenticated" // POST /api/authenticate answered by the gateway
)

// Options configure a Gateway.
type Options struct {
	ClusterDomain string // "cluster.local"
	DashboardPort int    // the heads' 8265
	ClientPort    int    // the heads' 10001
	// Proxy, when set, is the HTTP proxy for dashboard requests, and Ray Client connections are
	// tunnelled through it with CONNECT (nil: dial the heads directly).
	Proxy func(*http.Request) (*url.URL, error)
	// Dial, when set, replaces the direct TCP dial (tests map head Services to local listeners).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	Now  func() time.Time
	Log  *zap.Logger
	// Observe records one request (protocol, result, credential, seconds to the answer's headers).
	Observe func(protocol, result string, credential Credential, seconds float64)
	// UpstreamAuthFailure records a cluster refusing the token the gateway forwarded with.
	UpstreamAuthFailure func(protocol string)
}

// Gateway answers clients on behalf of every cluster in its table.
type Gateway struct {
	opts      Options
	table     atomic.Pointer[Table]
	dashboard *httputil.ReverseProxy
	client    *httputil.ReverseProxy
}

// New returns a Gateway that answers nothing but "not ready" until SetTable.
func New(o Options) *Gateway {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	if o.Observe == nil {
		o.Observe = func(string, string, Credential, float64) {}
	}
	if o.UpstreamAuthFailure == nil {
		o.UpstreamAuthFailure = func(string) {}
	}
	if o.ClusterDomain == "" {
		o.ClusterDomain = "cluster.local"
	}
	if o.Dial == nil {
		o.Dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	g := &Gateway{opts: o}
	// 8265 is HTTP/1.1 upstream: websocket upgrades (the job log tail) need it.
	h1 := &http.Transport{Proxy: o.Proxy, DialContext: o.Dial, MaxIdleConnsPerHost: 64,
		IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: 0, ForceAttemptHTTP2: false}
	h1.Protocols = new(http.Protocols)
	h1.Protocols.SetHTTP1(true)
	// 10001 is gRPC: HTTP/2 without TLS (prior knowledge), tunnelled when a proxy is set.
	h2c := &http.Transport{DialContext: g.tunnel, IdleConnTimeout: 90 * time.Second}
	h2c.Protocols = new(http.Protocols)
	h2c.Protocols.SetUnencryptedHTTP2(true)
	// FlushInterval 0: a response with a length is written once; ReverseProxy flushes streaming ones
	// (no length, text/event-stream) after every write regardless, and upgrades are raw.
	g.dashboard = &httputil.ReverseProxy{Rewrite: rewrite, Transport: h1,
		ModifyResponse: g.dashboardResponse, ErrorHandler: g.upstreamFailed(ProtoHTTP)}
	g.client = &httputil.ReverseProxy{Rewrite: rewrite, Transport: h2c, FlushInterval: -1,
		ModifyResponse: g.clientResponse, ErrorHandler: g.upstreamFailed(ProtoGRPC)}
	return g
}

// SetTable makes t the table every new request is answered from.
func (g *Gateway) SetTable(t *Table) { g.table.Store(t) }

// Ready reports whether a table was loaded: before it, every request is refused (never forwarded).
func (g *Gateway) Ready() bool { return g.table.Load() != nil }

// upstream is where one request goes, decided with its token from one table.
type upstream struct {
	addr  string
	token []byte
}

type upstreamKey struct{}

// route finds the table's route for a request's Host (":authority" for gRPC): "<name>-gw.<namespace>"
// with or without ".svc[.<domain>]" and a port. A bare "<name>-gw" names an object only if one
// namespace has it.
func (g *Gateway) route(t *Table, host string, port int) (upstream, error) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(host), "."), ".svc."+g.opts.ClusterDomain)
	host = strings.TrimSuffix(host, ".svc")
	name, ns, _ := strings.Cut(host, ".")
	name, ok := strings.CutSuffix(name, "-gw")
	if !ok || name == "" || strings.Contains(ns, ".") {
		return upstream{}, fmt.Errorf("host %q is not <name>-gw.<namespace>", host)
	}
	key := ns + "/" + name
	if ns == "" {
		key = ""
		for k := range t.Routes {
			if _, n, _ := strings.Cut(k, "/"); n == name {
				if key != "" {
					return upstream{}, fmt.Errorf("%s-gw is in several namespaces: use %s-gw.<namespace>", name, name)
				}
				key = k
			}
		}
	}
	r, ok := t.Routes[key]
	if !ok {
		return upstream{}, fmt.Errorf("no RayService or RayCluster %s behind the gateway", strings.TrimPrefix(key, "/"))
	}
	ns, _, _ = strings.Cut(key, "/")
	addr := net.JoinHostPort(r.Service+"."+ns+".svc."+g.opts.ClusterDomain, strconv.Itoa(port))
	return upstream{addr: addr, token: t.Tokens[r.Token]}, nil
}

// rewrite sends the request to its upstream with the cluster's token and no client credential.
func rewrite(pr *httputil.ProxyRequest) {
	up := pr.In.Context().Value(upstreamKey{}).(upstream)
	pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", up.addr, up.addr
	stripCredentials(pr.Out)
	pr.Out.Header.Set("Authorization", bearerPrefix+string(up.token))
}

// stripCredentials removes every way a client can present a token (the cookie, not the others).
func stripCredentials(r *http.Request) {
	r.Header.Del("Authorization")
	r.Header.Del("X-Ray-Authorization")
	r.Header.Del("Proxy-Authorization")
	cookies := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name != cookieName {
			r.AddCookie(c)
		}
	}
}

// presented is the token a dashboard request carries, read as Ray reads it. present is false when
// it carries none; ok is false when it carries one that is not "Bearer <token>".
func presented(h http.Header, cookies []*http.Cookie) (token []byte, present, ok bool) {
	v := h.Get("Authorization")
	if v == "" {
		v = h.Get("X-Ray-Authorization")
	}
	if v == "" {
		for _, c := range cookies {
			if c.Name == cookieName && c.Value != "" {
				v = bearerPrefix + c.Value
				break
			}
		}
	}
	if v == "" {
		return nil, false, false
	}
	t, ok := strings.CutPrefix(v, bearerPrefix)
	return []byte(t), true, ok && t != ""
}

// Dashboard serves the Jobs API and dashboard (the heads' 8265).
func (g *Gateway) Dashboard() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := g.opts.Now()
		result, cred := g.serveDashboard(w, r)
		g.opts.Observe(ProtoHTTP, result, cred, g.opts.Now().Sub(start).Seconds())
	})
}

func (g *Gateway) serveDashboard(w http.ResponseWriter, r *http.Request) (string, Credential) {
	t := g.table.Load()
	if t == nil {
		http.Error(w, "raysync gateway: not ready", http.StatusServiceUnavailable)
		return NotReady, None
	}
	cred := None
	if !publicPaths[r.URL.Path] || (r.URL.Path == "/api/authenticate" && r.Method == http.MethodPost) {
		token, present, ok := presented(r.Header, r.Cookies())
		if r.URL.Path == "/api/authenticate" {
			token, present, ok = presented(http.Header{"Authorization": r.Header.Values("Authorization")}, nil)
		}
		if !present {
			http.Error(w, "Unauthorized: Missing authentication token", http.StatusUnauthorized)
			return Unauthenticated, None
		}
		if ok {
			cred = t.accepts(token, g.opts.Now())
		}
		if cred == None {
			http.Error(w, "Forbidden: Invalid authentication token", http.StatusForbidden)
			return Forbidden, None
		}
		if r.URL.Path == "/api/authenticate" && r.Method == http.MethodPost {
			// The cookie carries the client's own token, never a cluster's.
			http.SetCookie(w, &http.Cookie{Name: cookieName, Value: string(token), MaxAge: cookieMaxAge, Path: "/",
				HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			_, _ = io.WriteString(w, `{"status": "authenticated", "message": "Token is valid"}`)
			return Authenticated, cred
		}
	}
	up, err := g.route(t, r.Host, g.opts.DashboardPort)
	if err != nil {
		http.Error(w, "raysync gateway: "+err.Error(), http.StatusNotFound)
		return NoRoute, cred
	}
	rec := &recorder{ResponseWriter: w, result: Forwarded}
	g.dashboard.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), upstreamKey{}, up)))
	return rec.result, cred
}

// dashboardResponse keeps cluster tokens from clients and catches a cluster refusing the gateway.
func (g *Gateway) dashboardResponse(resp *http.Response) error {
	if (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) && !publicPaths[resp.Request.URL.Path] {
		g.opts.UpstreamAuthFailure(ProtoHTTP)
		return errUpstreamRefused
	}
	var keep []string
	for _, v := range resp.Header.Values("Set-Cookie") {
		if c, err := http.ParseSetCookie(v); err == nil && c.Name == cookieName {
			continue
		}
		keep = append(keep, v)
	}
	resp.Header.Del("Set-Cookie")
	for _, v := range keep {
		resp.Header.Add("Set-Cookie", v)
	}
	return nil
}

var errUpstreamRefused = errors.New("the cluster refused the token the gateway forwarded with")

// Client serves Ray Client (the heads' 10001): gRPC over HTTP/2 without TLS.
func (g *Gateway) Client() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := g.opts.Now()
		result, cred := g.serveClient(w, r)
		g.opts.Observe(ProtoGRPC, result, cred, g.opts.Now().Sub(start).Seconds())
	})
}

// gRPC status codes the gateway answers with.
const (
	grpcNotFound        = 5
	grpcUnavailable     = 14
	grpcUnauthenticated = 16
)

func (g *Gateway) serveClient(w http.ResponseWriter, r *http.Request) (string, Credential) {
	if r.ProtoMajor != 2 {
		http.Error(w, "raysync gateway: Ray Client speaks gRPC over HTTP/2", http.StatusHTTPVersionNotSupported)
		return NoRoute, None
	}
	t := g.table.Load()
	if t == nil {
		grpcError(w, grpcUnavailable, "raysync gateway: not ready")
		return NotReady, None
	}
	v := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(v, bearerPrefix)
	cred := None
	if ok && token != "" {
		cred = t.accepts([]byte(token), g.opts.Now())
	}
	if cred == None {
		grpcError(w, grpcUnauthenticated, "Invalid or missing authentication token") // Ray's own message
		if v == "" {
			return Unauthenticated, None
		}
		return Forbidden, None
	}
	up, err := g.route(t, r.Host, g.opts.ClientPort)
	if err != nil {
		grpcError(w, grpcNotFound, "raysync gateway: "+err.Error())
		return NoRoute, cred
	}
	rec := &recorder{ResponseWriter: w, result: Forwarded}
	g.client.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), upstreamKey{}, up)))
	return rec.result, cred
}

// clientResponse catches a cluster refusing the gateway's token, in a Trailers-Only answer (a
// refusal is one) or in the trailers of a longer one.
func (g *Gateway) clientResponse(resp *http.Response) error {
	if resp.Header.Get("Grpc-Status") == strconv.Itoa(grpcUnauthenticated) {
		g.opts.UpstreamAuthFailure(ProtoGRPC)
		resp.Header.Set("Grpc-Status", strconv.Itoa(grpcUnavailable))
		resp.Header.Set("Grpc-Message", url.PathEscape("raysync gateway: the cluster refused the gateway's token"))
		return nil
	}
	resp.Body = &trailerWatch{ReadCloser: resp.Body, resp: resp, failed: func() { g.opts.UpstreamAuthFailure(ProtoGRPC) }}
	return nil
}

type trailerWatch struct {
	io.ReadCloser
	resp   *http.Response
	failed func()
	done   bool
}

func (t *trailerWatch) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if err == io.EOF && !t.done {
		t.done = true
		if t.resp.Trailer.Get("Grpc-Status") == strconv.Itoa(grpcUnauthenticated) {
			t.failed()
		}
	}
	return n, err
}

// grpcError answers a gRPC call with a status and no message (Trailers-Only).
func grpcError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/grpc")
	w.Header().Set("Grpc-Status", strconv.Itoa(code))
	w.Header().Set("Grpc-Message", url.PathEscape(msg))
	w.WriteHeader(http.StatusOK)
}

func (g *Gateway) upstreamFailed(protocol string) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		if rec, ok := w.(*recorder); ok {
			rec.result = UpstreamError
		}
		if !errors.Is(err, context.Canceled) {
			g.opts.Log.Info("upstream failed", zap.String("host", r.Host), zap.String("protocol", protocol), zap.Error(err))
		}
		if protocol == ProtoGRPC {
			grpcError(w, grpcUnavailable, "raysync gateway: cluster unreachable")
			return
		}
		status := http.StatusBadGateway
		http.Error(w, "raysync gateway: "+err.Error(), status)
	}
}

// recorder notes the result of a forwarded request (an upstream failure turns it to UpstreamError).
type recorder struct {
	http.ResponseWriter
	result string
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// tunnel dials addr directly, or through the HTTP proxy with CONNECT when one is set.
func (g *Gateway) tunnel(ctx context.Context, network, addr string) (net.Conn, error) {
	var proxy *url.URL
	if g.opts.Proxy != nil {
		p, err := g.opts.Proxy(&http.Request{URL: &url.URL{Scheme: "http", Host: addr}})
		if err != nil {
			return nil, err
		}
		proxy = p
	}
	if proxy == nil {
		return g.opts.Dial(ctx, network, addr)
	}
	conn, err := g.opts.Dial(ctx, "tcp", proxy.Host)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: addr}, Host: addr, Header: http.Header{}}
	br := bufio.NewReader(conn)
	resp, err := func() (*http.Response, error) {
		if err := req.Write(conn); err != nil {
			return nil, err
		}
		return http.ReadResponse(br, req)
	}()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("proxy CONNECT %s: %s", addr, resp.Status)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	resp.Body.Close()
	_ = conn.SetDeadline(time.Time{})
	return &bufferedConn{Conn: conn, r: br}, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
