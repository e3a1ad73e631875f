package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The tests of this file speak HTTP/2 frame by frame on both sides of the relay: a client that sends
// exactly the frames a test writes, and a head that records every header block it receives.

// frameHead is a head on a local listener. It sends its SETTINGS, acknowledges the client's and
// pings, records each header block (decoded), and answers each request at once Trailers-Only with
// grpc-status 0. Its framer refuses frames over 16 KiB, as a head that advertised no larger
// SETTINGS_MAX_FRAME_SIZE does.
type frameHead struct {
	ln       net.Listener
	keepOpen bool // answer each request's headers only, leaving its stream open
	mu       sync.Mutex
	blocks   []headBlock
	data     map[uint32]int // DATA bytes by stream
	errs     []error
	conns    []net.Conn
	closed   chan net.Conn // each connection once its reader has ended
}

type headBlock struct {
	stream uint32
	fields []hpack.HeaderField
}

func newFrameHead(t *testing.T) *frameHead {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &frameHead{ln: ln, closed: make(chan net.Conn, 16), data: map[uint32]int{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			go h.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			c.Close()
		}
	})
	return h
}

func (h *frameHead) fail(err error) {
	h.mu.Lock()
	h.errs = append(h.errs, err)
	h.mu.Unlock()
}

func (h *frameHead) serve(c net.Conn) {
	defer func() { c.Close(); h.closed <- c }()
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	fr := http2.NewFramer(c, c)
	fr.SetMaxReadFrameSize(16 << 10)
	_ = fr.WriteSettings()
	dec := hpack.NewDecoder(4096, nil)
	var out bytes.Buffer
	enc := hpack.NewEncoder(&out)
	var block []byte
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				h.fail(err)
			}
			return
		}
		var end bool
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
			continue
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
			continue
		case *http2.DataFrame:
			h.mu.Lock()
			h.data[f.StreamID] += int(f.Length)
			h.mu.Unlock()
			continue
		case *http2.HeadersFrame:
			block, end = append(block[:0], f.HeaderBlockFragment()...), f.HeadersEnded()
		case *http2.ContinuationFrame:
			block, end = append(block, f.HeaderBlockFragment()...), f.HeadersEnded()
		default:
			continue
		}
		if !end {
			continue
		}
		stream := f.Header().StreamID
		fields, err := dec.DecodeFull(block)
		if err != nil {
			h.fail(fmt.Errorf("stream %d: %w", stream, err))
			return
		}
		h.mu.Lock()
		h.blocks = append(h.blocks, headBlock{stream, fields})
		h.mu.Unlock()
		for _, f := range fields {
			if f.Name == ":path" {
				out.Reset()
				answer := [][2]string{{":status", "200"}, {"content-type", "application/grpc"}, {"grpc-status", "0"}}
				if h.keepOpen {
					answer = answer[:2]
				}
				for _, kv := range answer {
					_ = enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]})
				}
				_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: out.Bytes(), EndHeaders: true, EndStream: !h.keepOpen})
			}
		}
	}
}

// received is every header block the head has decoded, and its errors.
func (h *frameHead) received() ([]headBlock, []error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]headBlock(nil), h.blocks...), append([]error(nil), h.errs...)
}

// relayTo serves the gateway's Ray Client port in front of head (every address its head): the
// address to dial.
func relayTo(t *testing.T, head *frameHead, o Options) (string, *ClientServer) {
	o.ClientPort = 10001
	if o.Dial == nil {
		o.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", head.ln.Addr().String())
		}
	}
	g := New(o)
	g.SetTable(testTable())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.ClientServer()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), srv
}

// frameClient is a client that writes the frames it is told to.
type frameClient struct {
	t    *testing.T
	conn net.Conn
	fr   *http2.Framer
	enc  *hpack.Encoder
	buf  bytes.Buffer
	dec  *hpack.Decoder
}

func dialFrames(t *testing.T, addr string) *frameClient {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	c := &frameClient{t: t, conn: conn, fr: http2.NewFramer(conn, conn), dec: hpack.NewDecoder(4096, nil)}
	c.enc = hpack.NewEncoder(&c.buf)
	_, _ = io.WriteString(conn, http2.ClientPreface)
	_ = c.fr.WriteSettings()
	return c
}

// request is a gRPC request's fields to svc-gw.ml with auth ("" for none), then extra.
func request(auth string, extra ...[2]string) [][2]string {
	f := [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/ray.rpc.RayletDriver/GetObject"},
		{":authority", "svc-gw.ml:10001"}, {"content-type", "application/grpc"}, {"te", "trailers"}}
	if auth != "" {
		f = append(f, [2]string{"authorization", auth})
	}
	return append(f, extra...)
}

// block encodes fields with the client's encoder (its dynamic table included).
func (c *frameClient) block(fields [][2]string) []byte {
	c.buf.Reset()
	for _, f := range fields {
		_ = c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return append([]byte(nil), c.buf.Bytes()...)
}

func (c *frameClient) headers(stream uint32, end bool, fields [][2]string) {
	c.t.Helper()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: c.block(fields), EndHeaders: true, EndStream: end}); err != nil {
		c.t.Fatal(err)
	}
}

// answer reads frames (acknowledging SETTINGS) until stream's grpc-status; see is called with
// every other frame.
func (c *frameClient) answer(stream uint32, see func(http2.Frame)) string {
	c.t.Helper()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.t.Fatalf("stream %d: no answer: %v", stream, err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.fr.WriteSettingsAck()
			}
		case *http2.HeadersFrame:
			fields, err := c.dec.DecodeFull(f.HeaderBlockFragment())
			if err != nil {
				c.t.Fatal(err)
			}
			for _, hf := range fields {
				if hf.Name == "grpc-status" && f.StreamID == stream {
					return hf.Value
				}
			}
		default:
			if see != nil {
				see(f)
			}
		}
	}
}

// credentialFields are the fields of a block a server could read a credential from, whatever the
// case of their names.
func credentialFields(fields []hpack.HeaderField) []string {
	var creds []string
	for _, f := range fields {
		switch name := strings.ToLower(f.Name); {
		case name == "authorization", name == "x-ray-authorization", name == "proxy-authorization",
			name == "cookie" && strings.Contains(f.Value, cookieName):
			creds = append(creds, f.Name+": "+f.Value)
		}
	}
	return creds
}

// TestRayClientHeadSeesOnlyTheClustersToken: whatever names a client gives its credentials — any
// case, several fields, cookie crumbs (RFC 9113 8.2.3) — the head reads exactly one credential, the
// cluster's token, and no client token in any field.
func TestRayClientHeadSeesOnlyTheClustersToken(t *testing.T) {
	head := newFrameHead(t)
	addr, _ := relayTo(t, head, Options{})
	c := dialFrames(t, addr)
	good := "Bearer " + string(clientCurrent)
	c.headers(1, true, request(good,
		[2]string{"Authorization", "Bearer " + string(clientPrevious)},
		[2]string{"AUTHORIZATION", good},
		[2]string{"x-ray-authorization", good},
		[2]string{"X-Ray-Authorization", good},
		[2]string{"Proxy-Authorization", good},
		[2]string{"cookie", "a=b"},
		[2]string{"cookie", cookieName + "=" + string(clientCurrent)},
		[2]string{"Cookie", cookieName + "=" + string(clientPending)},
		[2]string{"authorization", "Bearer " + string(clientPrevious)}))
	if s := c.answer(1, nil); s != "0" {
		t.Fatalf("grpc-status %s, want 0", s)
	}
	blocks, errs := head.received()
	if len(errs) > 0 || len(blocks) != 1 {
		t.Fatalf("the head received %d blocks, errors %v", len(blocks), errs)
	}
	want := []string{"authorization: Bearer " + string(clusterToken1)}
	if got := credentialFields(blocks[0].fields); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the head read credentials %q, want only %q", got, want)
	}
	for _, f := range blocks[0].fields {
		for _, tok := range [][]byte{clientCurrent, clientPrevious, clientPending} {
			if strings.Contains(f.Name+f.Value, string(tok)) {
				t.Errorf("a client token reached the head in %s", f.Name)
			}
		}
	}
}

// TestHeaderListOverTheLimitIsNotHeld: a header block of one-byte fields (each an index into the
// static table, or into one large dynamic entry) decodes to a list hundreds of times its size. The
// gateway refuses it, and holds no more than about the limit while finding out: an unauthenticated
// client sends one such block per connection before the gateway knows who it is.
func TestHeaderListOverTheLimitIsNotHeld(t *testing.T) {
	const limit = 64 << 10
	var big bytes.Buffer
	enc := hpack.NewEncoder(&big)
	_ = enc.WriteField(hpack.HeaderField{Name: "x", Value: strings.Repeat("v", 4000)}) // dynamic index 62
	for name, block := range map[string][]byte{
		"static":  bytes.Repeat([]byte{0x82}, limit), // :method GET, 42 bytes decoded per byte
		"dynamic": append(big.Bytes(), bytes.Repeat([]byte{0x80 | 62}, limit-big.Len())...),
	} {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			dec := hpack.NewDecoder(4096, nil)
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := decode(dec, 4096, block, limit)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, errProtocol) {
				t.Fatalf("decode: %v, want the protocol error of a list over the limit", err)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 4*limit {
				t.Errorf("decoding a %d-byte block over the limit allocated %d KiB (want at most %d KiB)", len(block), n>>10, 4*limit>>10)
			}
		})
	}
}

// TestRayClientClosedWhileDialling: a connection closed (Shutdown, Close) while the gateway dials
// its head leaves no connection to the head behind once the dial returns.
func TestRayClientClosedWhileDialling(t *testing.T) {
	head := newFrameHead(t)
	dialling, release := make(chan struct{}), make(chan struct{})
	addr, srv := relayTo(t, head, Options{Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		close(dialling)
		<-release
		return (&net.Dialer{}).DialContext(ctx, "tcp", head.ln.Addr().String())
	}})
	c := dialFrames(t, addr)
	c.headers(1, false, request("Bearer "+string(clientCurrent)))
	select {
	case <-dialling:
	case <-time.After(10 * time.Second):
		t.Fatal("the gateway did not dial")
	}
	srv.Close()
	close(release)
	select {
	case <-head.closed:
	case <-time.After(5 * time.Second):
		t.Error("the connection to the head is still open after the gateway closed its client's")
	}
}

// TestRayClientStreamObservedOnce: a stream the client resets while the gateway notes its answer's
// headers is observed once; the two pumps note the same stream (run with -race: Observe is slow
// here, so the client's reset arrives while the head's pump observes).
func TestRayClientStreamObservedOnce(t *testing.T) {
	head := newFrameHead(t)
	head.keepOpen = true
	var mu sync.Mutex
	observed := 0
	addr, _ := relayTo(t, head, Options{Observe: func(string, string, Credential, float64) {
		time.Sleep(100 * time.Millisecond)
		mu.Lock()
		observed++
		mu.Unlock()
	}})
	c := dialFrames(t, addr)
	go func() { _, _ = io.Copy(io.Discard, c.conn) }()
	c.headers(1, true, request("Bearer "+string(clientCurrent)))
	time.Sleep(30 * time.Millisecond) // the head has answered; its pump is in Observe
	_ = c.fr.WriteRSTStream(1, http2.ErrCodeCancel)
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := observed
		mu.Unlock()
		if n == 1 || time.Now().After(deadline) {
			if n != 1 {
				t.Errorf("a stream observed %d times", n)
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRayClientLargeBlockIsSplitForTheHead: a block small on the client's side (its dynamic table
// holds a 4 KB field, sent 15 times) is re-encoded without the dynamic table to about 50 KB, which
// goes to the head as HEADERS and CONTINUATIONs within its SETTINGS_MAX_FRAME_SIZE.
func TestRayClientLargeBlockIsSplitForTheHead(t *testing.T) {
	head := newFrameHead(t)
	addr, _ := relayTo(t, head, Options{})
	c := dialFrames(t, addr)
	big := strings.Repeat("v", 4000)
	fields := request("Bearer " + string(clientCurrent))
	for range 15 {
		fields = append(fields, [2]string{"x-big", big})
	}
	block := c.block(fields)
	if len(block) > 16<<10/2 {
		t.Fatalf("the client's block is %d bytes: the dynamic table was not used", len(block))
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true, EndStream: true}); err != nil {
		t.Fatal(err)
	}
	if s := c.answer(1, nil); s != "0" {
		t.Fatalf("grpc-status %s", s)
	}
	blocks, errs := head.received()
	if len(errs) > 0 || len(blocks) != 1 {
		t.Fatalf("the head received %d blocks, errors %v", len(blocks), errs)
	}
	n := 0
	for _, f := range blocks[0].fields {
		if f.Name == "x-big" && f.Value == big {
			n++
		}
	}
	if n != 15 {
		t.Errorf("the head read x-big %d times, want 15", n)
	}
}

// TestRayClientDroppedDataIsCredited: a stream the gateway refuses never reaches the head, nor
// does its DATA; the connection's flow-control credit the client spent on that DATA comes back to
// it (a WINDOW_UPDATE on stream 0), since the head never saw it to return it.
func TestRayClientDroppedDataIsCredited(t *testing.T) {
	head := newFrameHead(t)
	addr, _ := relayTo(t, head, Options{})
	c := dialFrames(t, addr)
	c.headers(1, false, request("Bearer "+string(clientCurrent)))
	if s := c.answer(1, nil); s != "0" {
		t.Fatalf("stream 1: grpc-status %s", s)
	}
	c.headers(3, false, request("Bearer wrong"))
	_ = c.fr.WriteData(3, false, make([]byte, 1000))
	_ = c.fr.WriteData(3, true, make([]byte, 500))
	_ = c.fr.WriteData(1, true, make([]byte, 7)) // after the dropped frames, on the stream forwarded
	credit, reset := 0, false
	if s := c.answer(3, nil); s != "16" {
		t.Fatalf("stream 3: grpc-status %s, want 16", s)
	}
	for credit < 1500 {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("credited %d of 1500 bytes: %v", credit, err)
		}
		switch f := f.(type) {
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				credit += int(f.Increment)
			}
		case *http2.RSTStreamFrame:
			reset = reset || f.StreamID == 3 && f.ErrCode == http2.ErrCodeNo
		}
	}
	if credit != 1500 || !reset {
		t.Errorf("credited %d bytes (want 1500), stream 3 reset with NO_ERROR: %v", credit, reset)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		head.mu.Lock()
		on1, on3 := head.data[1], head.data[3]
		head.mu.Unlock()
		if on1 == 7 || time.Now().After(deadline) {
			if on1 != 7 || on3 != 0 {
				t.Errorf("the head received %d DATA bytes on stream 1 (want 7) and %d on the refused stream 3", on1, on3)
			}
			break
		}
		time.Sleep(time.Millisecond)
	}
	if blocks, _ := head.received(); len(blocks) != 1 {
		t.Errorf("the head received %d header blocks, want stream 1's only", len(blocks))
	}
}
