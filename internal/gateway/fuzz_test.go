package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// clientFrames is a client's bytes: the preface, SETTINGS, then what write writes with the framer
// and the client's encoder (block encodes fields with its dynamic table).
func clientFrames(write func(fr *http2.Framer, block func(fields [][2]string) []byte)) []byte {
	var b bytes.Buffer
	b.WriteString(http2.ClientPreface)
	fr := http2.NewFramer(&b, nil)
	_ = fr.WriteSettings(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 8192})
	var buf bytes.Buffer
	enc := hpack.NewEncoder(&buf)
	write(fr, func(fields [][2]string) []byte {
		buf.Reset()
		for _, f := range fields {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		return append([]byte(nil), buf.Bytes()...)
	})
	return b.Bytes()
}

// clientBytes is what a Ray Client-like client sends: the preface, SETTINGS, a request with auth, a
// message and the end of its stream.
func clientBytes(auth string) []byte {
	return clientFrames(func(fr *http2.Framer, block func([][2]string) []byte) {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(request(auth)), EndHeaders: true})
		_ = fr.WriteData(1, false, frame([]byte("hello")))
		_ = fr.WriteWindowUpdate(0, 1000)
		_ = fr.WriteData(1, true, nil)
		_ = fr.WriteRSTStream(3, http2.ErrCodeCancel)
	})
}

// fuzzSeeds are inputs that try the relay's authentication: credentials under other names and in
// trailers, blocks split, padded and prioritised, streams reused, reset and refused.
func fuzzSeeds() [][]byte {
	good, prev := "Bearer "+string(clientCurrent), "Bearer "+string(clientPrevious)
	return [][]byte{
		clientBytes(good),
		clientBytes("Bearer wrong"),
		clientBytes(""),
		clientFrames(func(fr *http2.Framer, block func([][2]string) []byte) { // names in other cases, cookie crumbs
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, EndHeaders: true, EndStream: true, BlockFragment: block(request(good,
				[2]string{"Authorization", prev}, [2]string{"X-Ray-Authorization", good}, [2]string{"cookie", "a=b"},
				[2]string{"Cookie", cookieName + "=" + string(clientCurrent)}, [2]string{"cookie", cookieName + "=x"}))})
		}),
		clientFrames(func(fr *http2.Framer, block func([][2]string) []byte) { // padded, prioritised, split in CONTINUATIONs
			b := block(request(good))
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: b[:3], PadLength: 7,
				Priority: http2.PriorityParam{StreamDep: 1, Weight: 9}})
			_ = fr.WriteContinuation(1, false, b[3:10])
			_ = fr.WriteContinuation(1, true, b[10:])
			_ = fr.WriteData(1, true, frame([]byte("x")))
		}),
		clientFrames(func(fr *http2.Framer, block func([][2]string) []byte) { // refused, then trailers with a token
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(request(good)), EndHeaders: true})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block(request("Bearer wrong")), EndHeaders: true})
			_ = fr.WriteData(3, false, frame([]byte("x")))
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: block([][2]string{{"authorization", good}}), EndHeaders: true, EndStream: true})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block([][2]string{{"authorization", good}, {"grpc-status", "0"}}), EndHeaders: true, EndStream: true})
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 5, BlockFragment: block(request("")), EndHeaders: true, EndStream: true})
		}),
		clientFrames(func(fr *http2.Framer, block func([][2]string) []byte) { // reset, then the stream again
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(request(good)), EndHeaders: true})
			_ = fr.WriteRSTStream(1, http2.ErrCodeCancel)
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block(request("")), EndHeaders: true})
			_ = fr.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: block(request("")), EndHeaders: true})
		}),
		[]byte(http2.ClientPreface),
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		append([]byte(http2.ClientPreface), 0, 0, 4, 1, 0x25, 0, 0, 0, 1, 0, 0, 0, 1),
	}
}

// presentedStreams is the streams on which the client's bytes present an accepted token (any field named
// authorization, in any case), parsed on their own with x/net's framer; ok is false when those
// bytes are not HTTP/2 that framer reads to their end.
func presentedStreams(in []byte) (streams map[uint32]bool, ok bool) {
	rest, ok := bytes.CutPrefix(in, []byte(http2.ClientPreface))
	if !ok {
		return nil, false
	}
	fr := http2.NewFramer(nil, bytes.NewReader(rest))
	dec := hpack.NewDecoder(4096, nil)
	streams = map[uint32]bool{}
	var block []byte
	for {
		f, err := fr.ReadFrame()
		var se http2.StreamError
		switch {
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return streams, true
		case errors.As(err, &se):
			continue
		case err != nil:
			return nil, false
		}
		switch f := f.(type) {
		case *http2.HeadersFrame:
			block = append(block[:0], f.HeaderBlockFragment()...)
			if !f.HeadersEnded() {
				continue
			}
		case *http2.ContinuationFrame:
			block = append(block, f.HeaderBlockFragment()...)
			if !f.HeadersEnded() {
				continue
			}
		default:
			continue
		}
		fields, err := dec.DecodeFull(block)
		if err != nil {
			return nil, false
		}
		for _, hf := range fields {
			tok, bearer := strings.CutPrefix(hf.Value, bearerPrefix)
			if strings.EqualFold(hf.Name, "authorization") && bearer && testTable().accepts([]byte(tok), testNow) != None {
				streams[f.Header().StreamID] = true
			}
		}
	}
}

// fuzzHead is the head of one input: it reads what the relay sends and notes what no head may see.
type fuzzHead struct {
	dialled  chan struct{} // closed when the relay dials
	done     chan struct{}
	problems []string
	requests []uint32 // streams whose request (first header block) reached the head
}

func (h *fuzzHead) serve(c net.Conn) {
	defer close(h.done)
	defer c.Close()
	br := bufio.NewReader(c)
	if _, err := io.ReadFull(br, make([]byte, len(http2.ClientPreface))); err != nil {
		return
	}
	dec := hpack.NewDecoder(4096, nil)
	dec.SetAllowedMaxDynamicTableSize(0) // the gateway's encoder has no dynamic table
	var hb [9]byte
	var block []byte
	for {
		fh, err := readFrameHeader(br, &hb)
		if err != nil {
			return
		}
		payload := make([]byte, fh.length)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		switch fh.typ {
		case frameHeaders:
			if fh.flags&(flagPadded|flagPriority) != 0 {
				h.problems = append(h.problems, fmt.Sprintf("stream %d: a HEADERS frame the gateway did not write", fh.stream))
			}
			block = payload
		case frameContinuation:
			block = append(block, payload...)
		case framePushPromise:
			h.problems = append(h.problems, "a PUSH_PROMISE reached the head")
			continue
		default:
			continue
		}
		if fh.flags&flagEndHeaders == 0 {
			continue
		}
		fields, err := dec.DecodeFull(block)
		if err != nil {
			h.problems = append(h.problems, fmt.Sprintf("stream %d: a header block the gateway did not encode: %v", fh.stream, err))
			return
		}
		var want []string // a stream's first block is its request, with the cluster's token; later ones none
		if !slices.Contains(h.requests, fh.stream) {
			h.requests = append(h.requests, fh.stream)
			want = []string{"authorization: Bearer " + string(clusterToken1)}
		}
		if got := credentialFields(fields); strings.Join(got, "\n") != strings.Join(want, "\n") {
			h.problems = append(h.problems, fmt.Sprintf("stream %d: the head read credentials %q, want %q", fh.stream, got, want))
		}
	}
}

// tokensIn reports which of the clusters' tokens the gateway's bytes to a client carry, in the
// clear or in a header block.
func tokensIn(out []byte) []string {
	var found []string
	check := func(s string) {
		for _, tok := range [][]byte{clusterToken1, clusterToken2} {
			if strings.Contains(s, string(tok)) {
				found = append(found, string(tok))
			}
		}
	}
	check(string(out))
	rest := out
	dec := hpack.NewDecoder(4096, nil)
	var block []byte
	for len(rest) >= 9 {
		fh := parseFrameHeader(rest)
		if len(rest) < 9+int(fh.length) {
			break
		}
		payload := rest[9 : 9+fh.length]
		rest = rest[9+fh.length:]
		switch fh.typ {
		case frameHeaders:
			block = append(block[:0], payload...)
		case frameContinuation:
			block = append(block, payload...)
		default:
			continue
		}
		if fh.flags&flagEndHeaders != 0 {
			fields, _ := dec.DecodeFull(block)
			for _, f := range fields {
				check(f.Name + f.Value)
			}
		}
	}
	return found
}

// FuzzRelay: whatever a client sends on the Ray Client port, the relay neither panics nor hangs once
// the client has gone; a request reaches the head only on a stream where the client presented an
// accepted token, and with the cluster's token as its only credential; every header block the head
// reads is the gateway's own; and no cluster token reaches the client.
func FuzzRelay(f *testing.F) {
	for _, in := range fuzzSeeds() {
		f.Add(in)
	}
	var mu sync.Mutex
	var head *fuzzHead // the current input's
	g := New(Options{ClientPort: 10001, Now: func() time.Time { return testNow },
		Limits: Limits{HeaderTimeout: time.Second, IdleTimeout: time.Second},
		Dial: func(context.Context, string, string) (net.Conn, error) {
			h, gw := net.Pipe()
			mu.Lock()
			close(head.dialled)
			go head.serve(h)
			mu.Unlock()
			return gw, nil
		}})
	g.SetTable(testTable())
	f.Fuzz(func(t *testing.T, in []byte) {
		mu.Lock()
		head = &fuzzHead{dialled: make(chan struct{}), done: make(chan struct{})}
		h := head
		mu.Unlock()
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { g.newRelay(server).run(); close(done) }()
		var out bytes.Buffer
		read := make(chan struct{})
		go func() { _, _ = io.Copy(&out, client); close(read) }()
		_ = client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		_, _ = client.Write(in)
		client.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the relay still runs after its client went")
		}
		<-read
		select {
		case <-h.dialled:
			<-h.done // the relay has closed its end
		default:
		}
		for _, p := range h.problems {
			t.Error(p)
		}
		if streams, ok := presentedStreams(in); ok {
			for _, s := range h.requests {
				if !streams[s] {
					t.Errorf("stream %d reached the head without an accepted token", s)
				}
			}
		}
		if found := tokensIn(out.Bytes()); len(found) > 0 {
			t.Errorf("the client received a cluster's token")
		}
	})
}
