package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

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
	TooLarge        = "too_large"     // a body over Ray's own limit, refused before it is read
	BodyFailed      = "body_failed"   // a forwarded body too long, too slow or cut off by the client
)

// Options configure a Gateway.
type Options struct {
	ClusterDomain string // "cluster.local"
	DashboardPort int    // the heads' 8265
	ClientPort    int    // the heads' 10001
	// Proxy, when set, is the HTTP proxy for dashboard requests, and Ray Client connections are
	// tunnelled through it with CONNECT (nil: dial the heads directly).
	Proxy func(*http.Request) (*url.URL, error)
	// ProxyTLS configures TLS to an https:// proxy (nil: the system's roots).
	ProxyTLS *tls.Config
	// Dial, when set, replaces the direct TCP dial (tests map head Services to local listeners).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Limits bound what one client can hold (zero fields: DefaultLimits).
	Limits Limits
	Now    func() time.Time
	Log    *zap.Logger
	// Observe records one request once it is answered (protocol, result, credential, seconds to the
	// answer's headers), and Done when it ends: a streamed answer or a Ray Client session can last
	// hours between the two.
	Observe func(protocol, result string, credential Credential, seconds float64)
	Done    func(protocol string, credential Credential)
	// UpstreamAuthFailure records a cluster refusing the token the gateway forwarded with.
	UpstreamAuthFailure func(protocol string)
	// RefusalSummary is how often, at most, the gateway logs at info which callers it refused for
	// want of an accepted credential (0: every 30 s).
	RefusalSummary time.Duration
}

// Gateway answers clients on behalf of every cluster in its table.
type Gateway struct {
	opts      Options
	table     atomic.Pointer[Table]
	dashboard *httputil.ReverseProxy
	refused   refusals
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
	if o.Done == nil {
		o.Done = func(string, Credential) {}
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
	o.Limits = o.Limits.withDefaults()
	if o.RefusalSummary <= 0 {
		o.RefusalSummary = 30 * time.Second
	}
	g := &Gateway{opts: o}
	// 8265 is HTTP/1.1 upstream: websocket upgrades (the job log tail) need it.
	// The heads are plain HTTP: TLSClientConfig is only ever the https:// proxy's, as for the tunnel.
	h1 := &http.Transport{Proxy: o.Proxy, DialContext: o.Dial, MaxIdleConnsPerHost: 64, TLSClientConfig: o.ProxyTLS,
		IdleConnTimeout: 90 * time.Second, ResponseHeaderTimeout: 0, ForceAttemptHTTP2: false}
	h1.Protocols = new(http.Protocols)
	h1.Protocols.SetHTTP1(true)
	// FlushInterval 0: a response with a length is written once; ReverseProxy flushes streaming ones
	// (no length, text/event-stream) after every write regardless, and upgrades are raw.
	g.dashboard = &httputil.ReverseProxy{Rewrite: rewrite, Transport: h1, BufferPool: copyBuffers{},
		ModifyResponse: g.dashboardResponse, ErrorHandler: g.upstreamFailed}
	return g
}

// copyBuffers lends ReverseProxy its 32 KiB copy buffers instead of allocating one per request.
type copyBuffers struct{}

var copyBufferPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (copyBuffers) Get() []byte  { return *copyBufferPool.Get().(*[]byte) }
func (copyBuffers) Put(b []byte) { copyBufferPool.Put(&b) }

// SetTable makes t the table every new request is answered from.
func (g *Gateway) SetTable(t *Table) {
	t.prepare()
	g.table.Store(t)
}

// Ready reports whether a table was loaded: before it, every request is refused (never forwarded).
func (g *Gateway) Ready() bool { return g.table.Load() != nil }

// upstream is where one request goes, decided with its token from one table. token is nil for a
// request Ray serves without one: it is forwarded with no credential at all.
type upstream struct {
	addr   string
	token  []byte
	rayTLS bool
	name   string // the route's "namespace/name"
}

type upstreamKey struct{}

// route finds the table's route for a request's Host (":authority" for gRPC): "<name>-gw.<namespace>"
// with or without ".svc[.<domain>]" and a port. A bare "<name>-gw" names an object only if one
// namespace has it. Its errors are for callers the gateway has authenticated only.
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
	return upstream{addr: addr, token: t.Tokens[r.Token], rayTLS: r.RayTLS, name: key}, nil
}

// rewrite sends the request to its upstream with no client credential, and with the cluster's token
// unless Ray serves the request without one.
func rewrite(pr *httputil.ProxyRequest) {
	up := pr.In.Context().Value(upstreamKey{}).(upstream)
	pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", up.addr, up.addr
	stripCredentials(pr.Out)
	if up.token != nil {
		pr.Out.Header.Set("Authorization", bearerPrefix+string(up.token))
	}
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
		rec := g.record(w, ProtoHTTP)
		defer rec.end()
		g.serveDashboard(rec, r)
	})
}

// serveDashboard authenticates first: a caller without a credential the gateway accepts gets Ray's
// own refusal whatever the address, unless Ray itself serves the path without a token; only then is
// the address looked up. The body is read only once the request is forwarded.
func (g *Gateway) serveDashboard(w *recorder, r *http.Request) {
	t := g.table.Load()
	if t == nil {
		w.refuse(r, NotReady, None, http.StatusServiceUnavailable, "raysync gateway: not ready")
		return
	}
	login := r.Method == http.MethodPost && r.URL.Path == "/api/authenticate"
	open := RayServesWithoutToken(r.URL.Path) && !login
	token, present, ok := presented(r.Header, r.Cookies())
	if login { // Ray's login reads Authorization only
		token, present, ok = presented(http.Header{"Authorization": r.Header.Values("Authorization")}, nil)
	}
	cred := None
	if ok {
		cred = t.accepts(token, g.opts.Now())
	}
	// Without an accepted credential only what Ray serves without a token is forwarded, and never a
	// body: none of those paths takes one (the login, which does, is answered here), and a stranger's
	// body is never read.
	if cred == None && (!open || r.ContentLength != 0) {
		w.refuseAsRay(r, present)
		return
	}
	if login {
		// The cookie carries the client's own token, never a cluster's.
		http.SetCookie(w, &http.Cookie{Name: cookieName, Value: string(token), MaxAge: cookieMaxAge, Path: "/",
			HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.answer(Authenticated, cred)
		if r.ContentLength != 0 {
			dropBody(w)
		}
		_, _ = io.WriteString(w, `{"status": "authenticated", "message": "Token is valid"}`)
		return
	}
	up, err := g.route(t, r.Host, g.opts.DashboardPort)
	if err != nil {
		if cred == None { // an open path at an address that is not one: as for any other path
			w.refuseAsRay(r, present)
			return
		}
		w.refuse(r, NoRoute, cred, http.StatusNotFound, "raysync gateway: "+err.Error())
		return
	}
	if r.ContentLength > g.opts.Limits.MaxBodyBytes {
		w.refuse(r, TooLarge, cred, http.StatusRequestEntityTooLarge, "raysync gateway: the body is over Ray's limit")
		return
	}
	if open {
		up.token = nil
	}
	w.answer(Forwarded, cred)
	g.limitBody(w, r)
	g.dashboard.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), upstreamKey{}, up)))
}

// dashboardResponse keeps cluster tokens from clients and catches a cluster refusing the gateway's
// token — Ray's token refusal only: its other 401s and 403s are the client's answer.
func (g *Gateway) dashboardResponse(resp *http.Response) error {
	up, _ := resp.Request.Context().Value(upstreamKey{}).(upstream)
	if up.token != nil && rayRefusedToken(resp) {
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

// rayRefusedToken reports whether resp is the dashboard's token middleware refusing the request,
// told by its status and exact body (the body stays whole for the client).
func rayRefusedToken(resp *http.Response) bool {
	var want string
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		want = rayMissingToken
	case http.StatusForbidden:
		want = rayInvalidToken
	default:
		return false
	}
	if resp.ContentLength > int64(len(want)+1) {
		return false
	}
	head := make([]byte, len(want)+2)
	n, err := io.ReadFull(resp.Body, head)
	head = head[:n]
	resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return false
	}
	return strings.TrimRight(string(head), "\n") == want
}

type readCloser struct {
	io.Reader
	io.Closer
}

var errUpstreamRefused = errors.New("the cluster refused the token the gateway forwarded with")

// gRPC status codes the gateway answers Ray Client with.
const (
	grpcNotFound        = 5
	grpcFailedPrecond   = 9
	grpcUnavailable     = 14
	grpcUnauthenticated = 16
)

// upstreamFailed answers a request the cluster did not answer, or answered by refusing the gateway's
// token. The client learns which, never where the gateway tried (that is logged).
func (g *Gateway) upstreamFailed(w http.ResponseWriter, r *http.Request, err error) {
	rec, _ := w.(*recorder)
	if rec != nil && rec.bodyFailed.Load() {
		rec.result = BodyFailed
		text(w, http.StatusBadRequest, "raysync gateway: the request's body was too long, too slow or cut off")
		return
	}
	if rec != nil {
		rec.result = UpstreamError
	}
	if !errors.Is(err, context.Canceled) {
		g.opts.Log.Info("upstream failed", zap.String("host", r.Host), zap.String("protocol", ProtoHTTP), zap.Error(err))
	}
	msg := "raysync gateway: the cluster did not answer"
	if errors.Is(err, errUpstreamRefused) {
		msg = "raysync gateway: the cluster refused the gateway's token"
	}
	text(w, http.StatusBadGateway, msg)
}

// text answers as Ray's aiohttp does (web.Response(text=...)).
func text(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// recorder notes how a request was answered and observes it at its answer's headers (a stream can
// last for ever after them), then once more when it ends.
type recorder struct {
	http.ResponseWriter
	g        *Gateway
	protocol string
	start    time.Time
	result   string
	cred     Credential
	observed bool
	// bodyFailed is set (by whoever reads the request's body) when the client's body failed.
	bodyFailed atomic.Bool
}

func (g *Gateway) record(w http.ResponseWriter, protocol string) *recorder {
	return &recorder{ResponseWriter: w, g: g, protocol: protocol, start: g.opts.Now(), result: UpstreamError, cred: None}
}

// answer sets what the request's answer will be counted as.
func (r *recorder) answer(result string, cred Credential) { r.result, r.cred = result, cred }

func (r *recorder) observe() {
	if !r.observed {
		r.observed = true
		r.g.opts.Observe(r.protocol, r.result, r.cred, r.g.opts.Now().Sub(r.start).Seconds())
	}
}

func (r *recorder) end() {
	r.observe()
	r.g.opts.Done(r.protocol, r.cred)
}

// refuse answers the gateway's own refusal without reading the request's body: a connection whose
// body was not read is closed after the answer (net/http would otherwise wait to discard it), so a
// client that announced one and never sends it holds nothing.
func (r *recorder) refuse(req *http.Request, result string, cred Credential, status int, msg string) {
	r.answer(result, cred)
	r.g.logRefused(r.protocol, result, req.Host, req.RemoteAddr)
	if req.ContentLength != 0 {
		dropBody(r)
	}
	text(r, status, msg)
}

// logRefused says which caller a refusal for want of an accepted credential went to: each one at
// debug, and at info a summary per window of RefusalSummary (the callers by address, host, protocol
// and result, with counts), so that finding a refused client needs no change of log level. Never
// what the caller presented.
func (g *Gateway) logRefused(protocol, result, host, remote string) {
	if result != Unauthenticated && result != Forbidden {
		return
	}
	g.opts.Log.Debug("refused", zap.String("result", result), zap.String("protocol", protocol),
		zap.String("host", host), zap.String("remote", remote))
	if ip, _, err := net.SplitHostPort(remote); err == nil {
		remote = ip // a caller, not each of its connections
	}
	if len(host) > 256 {
		host = host[:256] // the caller's to choose: a name is at most 253, the summary's memory stays bounded
	}
	g.refused.add(refusedCaller{Remote: remote, Host: host, Protocol: protocol, Result: result}, g.opts.RefusalSummary, g.logRefusals)
}

// refusedCaller is one line of the refusal summary.
type refusedCaller struct {
	Remote, Host, Protocol, Result string
}

// maxRefusedCallers bounds the summary's memory under a flood of forged callers: past it, refusals
// are only counted.
const maxRefusedCallers = 1000

// refusals counts refused callers over one summary window; the window's first refusal schedules
// its summary (no timer runs while nobody is refused).
type refusals struct {
	mu      sync.Mutex
	callers map[refusedCaller]int
	others  int // refusals of callers past maxRefusedCallers
}

func (r *refusals) add(c refusedCaller, window time.Duration, flush func(map[refusedCaller]int, int)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.callers == nil {
		r.callers = map[refusedCaller]int{}
		time.AfterFunc(window, func() {
			r.mu.Lock()
			callers, others := r.callers, r.others
			r.callers, r.others = nil, 0
			r.mu.Unlock()
			flush(callers, others)
		})
	}
	if _, ok := r.callers[c]; ok || len(r.callers) < maxRefusedCallers {
		r.callers[c]++
	} else {
		r.others++
	}
}

// logRefusals logs one window's refused callers at info, the most refused first, at most 20 of them.
func (g *Gateway) logRefusals(callers map[refusedCaller]int, others int) {
	type entry struct {
		refusedCaller
		n int
	}
	list := make([]entry, 0, len(callers))
	total := others
	for c, n := range callers {
		list = append(list, entry{c, n})
		total += n
	}
	sort.Slice(list, func(i, j int) bool {
		if list[i].n != list[j].n {
			return list[i].n > list[j].n
		}
		return fmt.Sprint(list[i].refusedCaller) < fmt.Sprint(list[j].refusedCaller)
	})
	shown := list[:min(len(list), 20)]
	fields := []zap.Field{zap.Int("refusals", total), zap.Int("callers", len(list)), zap.String("window", g.opts.RefusalSummary.String())}
	if others > 0 {
		fields = append(fields, zap.Int("refusalsOfUnlistedCallers", others))
	}
	fields = append(fields, zap.Array("top", zapcore.ArrayMarshalerFunc(func(enc zapcore.ArrayEncoder) error {
		for _, e := range shown {
			_ = enc.AppendObject(zapcore.ObjectMarshalerFunc(func(o zapcore.ObjectEncoder) error {
				o.AddString("remote", e.Remote)
				o.AddString("host", e.Host)
				o.AddString("protocol", e.Protocol)
				o.AddString("result", e.Result)
				o.AddInt("count", e.n)
				return nil
			}))
		}
		return nil
	})))
	g.opts.Log.Info("refused callers", fields...)
}

// dropBody makes the answer the request's last: its body is never read.
func dropBody(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	_ = http.NewResponseController(w).SetReadDeadline(time.Now())
}

// refuseAsRay answers a caller without an accepted credential as Ray does: 401 without one, 403 with
// one it does not accept.
func (r *recorder) refuseAsRay(req *http.Request, present bool) {
	if !present {
		r.refuse(req, Unauthenticated, None, http.StatusUnauthorized, rayMissingToken)
		return
	}
	r.refuse(req, Forbidden, None, http.StatusForbidden, rayInvalidToken)
}

func (r *recorder) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		r.observe()
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.observe()
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	r.observe()
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack is a websocket upgrade's answer (ReverseProxy writes the 101 on the hijacked connection).
func (r *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	r.observe()
	return http.NewResponseController(r.ResponseWriter).Hijack()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
