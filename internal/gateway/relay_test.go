package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Transport is a Ray Client-like HTTP/2 client without TLS that keeps one connection per address.
func h2Transport(t *testing.T) *http.Transport {
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// unary is one gRPC call on tr (one message, half-closed at once): its status.
func (h *harness) unary(t *testing.T, tr *http.Transport, authority, auth string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+h.clientAddr+"/ray.rpc.RayletDriver/GetObject", bytes.NewReader(frame([]byte("x"))))
	req.Host = authority
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("%s: %v", authority, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if s := resp.Header.Get("Grpc-Status"); s != "" {
		return s
	}
	return resp.Trailer.Get("Grpc-Status")
}

// TestRayClientConnectionCarriesManyStreams: one connection, many calls — each authenticated on
// its own (a wrong token on a later call is refused; the calls around it are not), header
// compression followed across all of them, and the head never sees a client credential.
func TestRayClientConnectionCarriesManyStreams(t *testing.T) {
	h := newHarness(t, testTable())
	tr := h2Transport(t)
	good, prev := "Bearer "+string(clientCurrent), "Bearer "+string(clientPrevious)
	for i, tc := range []struct{ auth, want string }{{good, "0"}, {good, "0"}, {"Bearer wrong", "16"}, {prev, "0"}, {"", "16"}, {good, "0"}} {
		if got := h.unary(t, tr, "svc-gw.ml:10001", tc.auth); got != tc.want {
			t.Errorf("call %d: grpc-status %s, want %s", i, got, tc.want)
		}
	}
	// Concurrent streams on the same connection.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got := h.unary(t, tr, "svc-gw.ml:10001", good); got != "0" {
				t.Errorf("a concurrent call: grpc-status %s", got)
			}
		}()
	}
	wg.Wait()
	h.ray.mu.Lock()
	calls := h.ray.clientCalls
	h.ray.mu.Unlock()
	if calls != 12 {
		t.Errorf("the head accepted %d calls, want the 12 the gateway accepted", calls)
	}
	// Another address on the same connection is not this connection's cluster.
	if got := h.unary(t, tr, "batch-gw.ml:10001", good); got != "5" {
		t.Errorf("another address on the connection: grpc-status %s, want 5 (NOT_FOUND)", got)
	}
}

// TestRayClientSlowAndIdleClients: on the Ray Client port, a connection that says nothing, one that
// sends its preface and no request, and one whose stream is refused all end; none is held.
func TestRayClientSlowAndIdleClients(t *testing.T) {
	h := newHarnessWith(t, testTable(), Limits{HeaderTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond})
	ends := func(name string, conn net.Conn) {
		t.Helper()
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second)) // generous: the limits are 200 ms
		if _, err := io.Copy(io.Discard, conn); err != nil {
			t.Errorf("%s: the gateway did not end the connection: %v", name, err)
		}
	}
	silent, err := net.Dial("tcp", h.clientAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ends("a connection that says nothing", silent)

	preface, _ := net.Dial("tcp", h.clientAddr)
	defer preface.Close()
	_, _ = io.WriteString(preface, http2.ClientPreface)
	fr := http2.NewFramer(preface, preface)
	_ = fr.WriteSettings()
	ends("a preface and no request", preface)

	// A request with a wrong token that announces a body and never sends it.
	refused, _ := net.Dial("tcp", h.clientAddr)
	defer refused.Close()
	_, _ = io.WriteString(refused, http2.ClientPreface)
	fr = http2.NewFramer(refused, refused)
	_ = fr.WriteSettings()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/ray.rpc.RayletDriver/Datapath"},
		{":authority", "svc-gw.ml:10001"}, {"content-type", "application/grpc"}, {"authorization", "Bearer wrong"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	var status string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == "grpc-status" {
			status = f.Value
		}
	})
	_ = refused.SetDeadline(time.Now().Add(10 * time.Second))
	for status == "" {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("a refused stream: no answer: %v", err)
		}
		if hf, ok := f.(*http2.HeadersFrame); ok {
			_, _ = dec.Write(hf.HeaderBlockFragment())
		}
	}
	if status != "16" {
		t.Errorf("a wrong token: grpc-status %s, want 16", status)
	}
	ends("a refused stream", refused)

	// After a call, the connection is idle and closed.
	tr := h2Transport(t)
	if got := h.unary(t, tr, "svc-gw.ml:10001", "Bearer "+string(clientCurrent)); got != "0" {
		t.Fatalf("grpc-status %s", got)
	}
	deadline := time.Now().Add(10 * time.Second)
	for h.clientLimiter.Open() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := h.clientLimiter.Open(); n != 0 {
		t.Errorf("%d connections open after the idle timeout", n)
	}
}

// TestRayClientPortAnswersHTTP1: an HTTP/1 client on the Ray Client port learns what it is.
func TestRayClientPortAnswersHTTP1(t *testing.T) {
	h := newHarness(t, testTable())
	resp, err := http.Get("http://" + h.clientAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusHTTPVersionNotSupported || !strings.Contains(string(body), "gRPC over HTTP/2") {
		t.Errorf("HTTP %d %q, want 505", resp.StatusCode, body)
	}
}

// TestConnectionCap: beyond MaxConnections a port refuses at once (HTTP/1.1: a 503), and serves
// again once a connection ends.
func TestConnectionCap(t *testing.T) {
	h := newHarnessWith(t, testTable(), Limits{MaxConnections: 2})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := LimitConnections(ln, 2, HTTPRefusal)
	refused := 0
	var mu sync.Mutex
	lim.Refused = func() { mu.Lock(); refused++; mu.Unlock() }
	srv := h.gw.DashboardServer()
	go func() { _ = srv.Serve(lim) }()
	t.Cleanup(func() { srv.Close() })
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for lim.Open() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a third connection: %v %v, want 503", resp, err)
	}
	c.Close()
	mu.Lock()
	if refused != 1 {
		t.Errorf("%d refusals counted, want 1", refused)
	}
	mu.Unlock()
	held[0].Close()
	for lim.Open() > 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/api/healthz", nil)
	req.Host = "svc-gw.ml"
	resp, err = (&http.Client{Transport: &http.Transport{}}).Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("once a connection ended: %v %v", resp, err)
	}
	resp.Body.Close()
	held[1].Close()
}

// TestRayClientDrain: on shutdown, a stream in flight ends normally while the gateway accepts no
// new connection.
func TestRayClientDrain(t *testing.T) {
	h := newHarness(t, testTable())
	tr := h2Transport(t)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "http://"+h.clientAddr+"/ray.rpc.RayletDriver/Datapath", pr)
	req.Host = "svc-gw.ml:10001"
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Authorization", "Bearer "+string(clientCurrent))
	go func() { _, _ = pw.Write(frame([]byte("one"))) }()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := readMsg(resp.Body); err != nil || string(m) != "one" {
		t.Fatalf("before the drain: %q %v", m, err)
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- h.clientServer.Shutdown(ctx)
	}()
	time.Sleep(50 * time.Millisecond) // the GOAWAY reaches the client meanwhile; the stream goes on
	if _, err := pw.Write(frame([]byte("two"))); err != nil {
		t.Fatal(err)
	}
	if m, err := readMsg(resp.Body); err != nil || string(m) != "two" {
		t.Fatalf("during the drain: %q %v", m, err)
	}
	pw.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if s := resp.Trailer.Get("Grpc-Status"); s != "0" {
		t.Errorf("the stream ended with grpc-status %q", s)
	}
	if err := <-done; err != nil {
		t.Errorf("shutdown: %v", err)
	}
	if _, err := net.DialTimeout("tcp", h.clientAddr, time.Second); err == nil {
		t.Error("a new connection was accepted after shutdown")
	}
}

// TestRayClientGetsTheServerPrefaceFirst: gRPC's C core (Ray Client's Python side) waits for the
// server's SETTINGS before its first call, which tells the gateway where to go: the gateway sends
// its own at once, then passes the head's on, and the client's ACK of the gateway's never reaches
// the head (Go's and gRPC's servers close a connection on an ACK of SETTINGS they never sent).
func TestRayClientGetsTheServerPrefaceFirst(t *testing.T) {
	h := newHarness(t, testTable())
	conn, err := net.Dial("tcp", h.clientAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(conn, http2.ClientPreface)
	fr := http2.NewFramer(conn, conn)
	_ = fr.WriteSettings()
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatalf("no server preface before the first call: %v", err)
	}
	if s, ok := f.(*http2.SettingsFrame); !ok || s.IsAck() {
		t.Fatalf("first frame %v, want the server's SETTINGS", f)
	}
	_ = fr.WriteSettingsAck()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/ray.rpc.RayletDriver/GetObject"},
		{":authority", "svc-gw.ml:10001"}, {"content-type", "application/grpc"}, {"te", "trailers"},
		{"authorization", "Bearer " + string(clientCurrent)}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true})
	_ = fr.WriteData(1, true, frame([]byte("x")))
	var status string
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == "grpc-status" {
			status = f.Value
		}
	})
	acks := 0
	for status == "" {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the call got no status: %v", err)
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			_, _ = dec.Write(f.HeaderBlockFragment())
		case *http2.SettingsFrame:
			if f.IsAck() {
				acks++
			} else {
				_ = fr.WriteSettingsAck() // the head's
			}
		case *http2.GoAwayFrame:
			t.Fatalf("GOAWAY %v", f.ErrCode)
		}
	}
	if status != "0" || acks != 1 {
		t.Errorf("grpc-status %s, %d SETTINGS ACKs (want 0 and the head's one ACK of the client's SETTINGS)", status, acks)
	}
}

// rawClient opens a Ray Client connection by hand: the preface, SETTINGS with window (the initial
// stream window; 0: the default) and, with window, the whole connection window opened.
func rawClient(t *testing.T, addr string, window uint32) (net.Conn, *http2.Framer) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10) // a small receive buffer: what the client leaves unread fills it fast
	}
	_, _ = io.WriteString(conn, http2.ClientPreface)
	fr := http2.NewFramer(conn, conn)
	var settings []http2.Setting
	if window > 0 {
		settings = append(settings, http2.Setting{ID: http2.SettingInitialWindowSize, Val: window})
	}
	_ = fr.WriteSettings(settings...)
	if window > 0 {
		_ = fr.WriteWindowUpdate(0, window-65535)
	}
	return conn, fr
}

// openStream sends the headers of an authorized Ray Client call on stream id, leaving it open.
func openStream(fr *http2.Framer, id uint32) error { return openCall(fr, id, "Datapath", false) }

// openCall sends the headers of an authorized call of method on stream id.
func openCall(fr *http2.Framer, id uint32, method string, end bool) error {
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/ray.rpc.RayletDriver/" + method},
		{":authority", "svc-gw.ml:10001"}, {"content-type", "application/grpc"}, {"authorization", "Bearer " + string(clientCurrent)}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: end})
}

// A client that opens its flow-control windows, asks for a server stream and never reads: the head's
// messages fill its socket, and the gateway's write to it blocks. Each write has WriteTimeout: the
// connection (and the head's) is cut off then, instead of being pinned until TCP gives up (with the
// idle GOAWAY blocked behind it). (Writes to the head have the same deadline; a Go HTTP/2 server never
// stops reading its socket, so no test head here can make them block.)
func TestRayClientThatNeverReadsIsCutOff(t *testing.T) {
	h := newHarnessWith(t, testTable(), Limits{WriteTimeout: 300 * time.Millisecond})
	_, fr := rawClient(t, h.clientAddr, 1<<31-1)
	if err := openCall(fr, 1, "Flood", true); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for h.clientLimiter.Open() > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := h.clientLimiter.Open(); n != 0 {
		t.Errorf("%d connections still held 20 s after the client stopped reading (write timeout 300 ms)", n)
	}
}

// One connection has at most MaxStreams streams open: the next is refused (REFUSED_STREAM, which gRPC
// retries) and never reaches the head; the streams already open go on.
func TestRayClientStreamCap(t *testing.T) {
	h := newHarnessWith(t, testTable(), Limits{MaxStreams: 2})
	conn, fr := rawClient(t, h.clientAddr, 0)
	for _, id := range []uint32{1, 3, 5} {
		if err := openStream(fr, id); err != nil {
			t.Fatal(err)
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no REFUSED_STREAM for the third stream: %v", err)
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok {
			if rst.StreamID != 5 || rst.ErrCode != http2.ErrCodeRefusedStream {
				t.Errorf("RST_STREAM on %d with %v, want on 5 with REFUSED_STREAM", rst.StreamID, rst.ErrCode)
			}
			break
		}
	}
	time.Sleep(100 * time.Millisecond)
	h.ray.mu.Lock()
	calls := h.ray.clientCalls
	h.ray.mu.Unlock()
	if calls != 2 {
		t.Errorf("the head accepted %d calls, want the 2 under the cap", calls)
	}
}

// TestRayClientToAClusterOnRayTLSIsRefusedWithWhy (issue 36 item 3): a cluster whose Ray runs with
// RAY_USE_TLS takes Ray Client only over mutual TLS (Ray's add_port_to_grpc_server requires a client
// certificate of its CA). The relay speaks HTTP/2 without TLS, so it answers an authenticated call
// FAILED_PRECONDITION, saying why, and never dials the head; an unauthenticated caller learns
// nothing of it; other clusters are relayed as before.
func TestRayClientToAClusterOnRayTLSIsRefusedWithWhy(t *testing.T) {
	table := testTable()
	r := table.Routes["ml/batch"]
	r.RayTLS = true
	table.Routes["ml/batch"] = r
	h := newHarness(t, table)
	tr := h2Transport(t)
	call := func(auth string) (status, msg string) {
		req, _ := http.NewRequest("POST", "http://"+h.clientAddr+"/ray.rpc.RayletDriver/GetObject", bytes.NewReader(frame([]byte("x"))))
		req.Host = "batch-gw.ml:10001"
		req.Header.Set("Content-Type", "application/grpc")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		status, msg = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
		if status == "" {
			status, msg = resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message")
		}
		msg, _ = url.PathUnescape(msg) // grpc-message is percent-encoded
		return status, msg
	}
	if status, msg := call("Bearer " + string(clientCurrent)); status != "9" || !strings.Contains(msg, "RAY_USE_TLS") || !strings.Contains(msg, "ml/batch") {
		t.Errorf("authenticated call: grpc-status %s %q, want 9 (FAILED_PRECONDITION) naming ml/batch and RAY_USE_TLS", status, msg)
	}
	if status, msg := call(""); status != "16" || strings.Contains(msg, "RAY_USE_TLS") {
		t.Errorf("unauthenticated call: grpc-status %s %q, want 16 and nothing about the cluster", status, msg)
	}
	h.ray.mu.Lock()
	calls := h.ray.clientCalls
	h.ray.mu.Unlock()
	if calls != 0 {
		t.Errorf("the head's Ray Client port was reached %d times", calls)
	}
	// Another cluster on the same gateway is relayed as before.
	if got := h.unary(t, h2Transport(t), "svc-gw.ml:10001", "Bearer "+string(clientCurrent)); got != "0" {
		t.Errorf("a cluster without RAY_USE_TLS: grpc-status %s, want 0", got)
	}
}
