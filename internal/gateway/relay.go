package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/http2/hpack"
)

// Ray Client's port is relayed frame by frame, not proxied request by request: a client connection
// is paired with one connection to the head its first request names, and every frame but a header
// block passes through as it came (DATA, flow control, settings, pings), so a stream costs the
// gateway about what a TCP relay costs. Header blocks are decoded, checked and encoded again: each
// new stream is authenticated against the current table, the client's credential is replaced by the
// cluster's token, and the head's answers are checked for a refusal of that token. Both directions
// are re-encoded without HPACK's dynamic table, so the gateway can answer a stream itself (a
// refusal) without disturbing either peer's decoder.

// HTTP/2 frame types and flags (RFC 9113).
const (
	frameData         = 0x0
	frameHeaders      = 0x1
	framePriority     = 0x2
	frameRSTStream    = 0x3
	frameSettings     = 0x4
	framePushPromise  = 0x5
	framePing         = 0x6
	frameGoAway       = 0x7
	frameWindowUpdate = 0x8
	frameContinuation = 0x9

	flagEndStream  = 0x1
	flagAck        = 0x1
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20

	settingHeaderTableSize = 0x1
	settingMaxFrameSize    = 0x5

	errCodeNo            = 0x0
	errCodeRefusedStream = 0x7

	defaultMaxFrameSize = 16384
	clientPreface       = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

var errProtocol = errors.New("HTTP/2 protocol error")

// relayBuffer is each direction's read buffer once a connection is admitted: the frames that pass
// through unchanged are written from it as they arrived, whole runs of them in one write, so a
// 64 KiB message costs one read and one write. relayWriteBuffer holds what the gateway writes itself
// (header blocks, settings).
var (
	relayBuffer      = 128 << 10
	relayWriteBuffer = 16 << 10
)

// peekAll takes what br holds already.
func peekAll(br *bufio.Reader) []byte {
	b, _ := br.Peek(br.Buffered())
	return append([]byte(nil), b...)
}

type frameHeader struct {
	length uint32
	typ    byte
	flags  byte
	stream uint32
}

func readFrameHeader(r *bufio.Reader, buf *[9]byte) (frameHeader, error) {
	if _, err := io.ReadFull(r, buf[:]); err != nil {
		return frameHeader{}, err
	}
	return parseFrameHeader(buf[:]), nil
}

func appendFrameHeader(b []byte, h frameHeader) []byte {
	return append(b, byte(h.length>>16), byte(h.length>>8), byte(h.length), h.typ, h.flags,
		byte(h.stream>>24), byte(h.stream>>16), byte(h.stream>>8), byte(h.stream))
}

// ClientServer relays Ray Client connections (the heads' 10001: gRPC over HTTP/2 without TLS).
type ClientServer struct {
	g      *Gateway
	mu     sync.Mutex
	ln     net.Listener
	relays map[*relay]struct{}
	closed bool
	done   chan struct{} // closed when the last relay ends after Shutdown
}

// ClientServer returns the server for Ray Client.
func (g *Gateway) ClientServer() *ClientServer {
	return &ClientServer{g: g, relays: map[*relay]struct{}{}, done: make(chan struct{})}
}

// ErrServerClosed is what Serve returns after Shutdown or Close.
var ErrServerClosed = errors.New("gateway: Ray Client server closed")

// Serve relays every connection ln accepts until Shutdown or Close.
func (s *ClientServer) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		r := s.g.newRelay(c)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			continue
		}
		s.relays[r] = struct{}{}
		s.mu.Unlock()
		go func() {
			r.run()
			s.mu.Lock()
			delete(s.relays, r)
			if s.closed && len(s.relays) == 0 {
				s.closeDone()
			}
			s.mu.Unlock()
		}()
	}
}

func (s *ClientServer) closeDone() {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
}

// Shutdown stops accepting, tells every client to open no new stream here (GOAWAY), and waits for
// the streams in flight to end, or ctx; then closes what is left.
func (s *ClientServer) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for r := range s.relays {
		go r.drain() // a client that does not read must not hold the others, nor Close
	}
	if len(s.relays) == 0 {
		s.closeDone()
	}
	s.mu.Unlock()
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		s.Close()
		return ctx.Err()
	}
}

// Close closes the listener and every connection at once.
func (s *ClientServer) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for r := range s.relays {
		r.close()
	}
	if len(s.relays) == 0 {
		s.closeDone()
	}
	return nil
}

// relay is one client connection and, once its first stream is accepted, its head's.
type relay struct {
	g *Gateway

	client net.Conn
	cr     *bufio.Reader
	cwmu   sync.Mutex // the client's writer and its encoder: both directions write to the client
	cw     *bufio.Writer
	cenc   *hpack.Encoder
	cbuf   bytes.Buffer
	cdec   *hpack.Decoder // the client's header blocks (read by the client's pump only)

	up   net.Conn
	ur   *bufio.Reader
	uw   *bufio.Writer // written by the client's pump only
	uenc *hpack.Encoder
	ubuf bytes.Buffer
	udec *hpack.Decoder // the head's header blocks (read by the head's pump only)

	authority   string   // the first stream's, which every stream of the connection must name
	target      upstream // where the connection goes, with which token
	ownSettings int      // SETTINGS the gateway sent the client itself, whose ACKs it drops (client's pump only)

	// What each peer accepts, learnt from the SETTINGS passing through.
	clientMaxFrame atomic.Uint32 // the client's SETTINGS_MAX_FRAME_SIZE: frames the gateway writes to it
	upMaxFrame     atomic.Uint32
	clientTable    atomic.Uint32 // the client's SETTINGS_HEADER_TABLE_SIZE: the head may encode with up to this
	upTable        atomic.Uint32

	mu        sync.Mutex
	streams   map[uint32]*relayStream // the streams forwarded and not over: nothing of any other goes to the head
	lastID    uint32                  // the highest stream the client opened
	opened    bool                    // the head is dialled and the pumps run
	closed    bool                    // close has run: a head dialled since is closed at once
	draining  bool
	idle      *time.Timer
	closeOnce sync.Once
}

// relayStream is one forwarded stream, for the metrics.
type relayStream struct {
	rec        *streamRecord
	clientDone bool // the client ended its side
	upDone     bool // the head ended its side
}

// streamRecord observes one stream as recorder does a request.
type streamRecord struct {
	g        *Gateway
	start    time.Time
	result   string
	cred     Credential
	observed atomic.Bool // both pumps observe: the head's at its answer, either at the stream's end
	ended    bool        // set by the one that removes the stream from relay.streams
}

func (s *streamRecord) observe() {
	if s.observed.CompareAndSwap(false, true) {
		s.g.opts.Observe(ProtoGRPC, s.result, s.cred, s.g.opts.Now().Sub(s.start).Seconds())
	}
}

func (s *streamRecord) end() {
	if !s.ended {
		s.ended = true
		s.observe()
		s.g.opts.Done(ProtoGRPC, s.cred)
	}
}

func (g *Gateway) newRelay(c net.Conn) *relay {
	c = writeDeadlineConn{Conn: c, timeout: g.opts.Limits.WriteTimeout}
	// Small buffers until a stream is admitted: an unauthenticated connection costs little.
	r := &relay{g: g, client: c, cr: bufio.NewReaderSize(c, 4<<10), cw: bufio.NewWriterSize(c, 4<<10),
		streams: map[uint32]*relayStream{}}
	r.cenc = hpack.NewEncoder(&r.cbuf)
	r.cenc.SetMaxDynamicTableSizeLimit(0)
	r.uenc = hpack.NewEncoder(&r.ubuf)
	r.uenc.SetMaxDynamicTableSizeLimit(0)
	r.cdec = hpack.NewDecoder(4096, nil)
	r.cdec.SetMaxStringLength(g.opts.Limits.MaxHeaderBytes)
	r.udec = hpack.NewDecoder(4096, nil)
	r.udec.SetMaxStringLength(g.opts.Limits.MaxHeaderBytes)
	for _, v := range []*atomic.Uint32{&r.clientMaxFrame, &r.upMaxFrame} {
		v.Store(defaultMaxFrameSize)
	}
	for _, v := range []*atomic.Uint32{&r.clientTable, &r.upTable} {
		v.Store(4096)
	}
	return r
}

// run serves the connection to its end.
func (r *relay) run() {
	defer r.close()
	_ = r.client.SetReadDeadline(time.Now().Add(r.g.opts.Limits.HeaderTimeout))
	pending, first, err := r.handshake()
	if err != nil {
		if !errors.Is(err, io.EOF) && !isClosed(err) {
			r.g.opts.Log.Debug("Ray Client connection refused", zap.Error(err))
		}
		return
	}
	if !r.open(pending, first) {
		return
	}
	_ = r.client.SetReadDeadline(time.Time{})
	r.cwmu.Lock()
	r.cr = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(peekAll(r.cr)), r.client), relayBuffer)
	r.cw = bufio.NewWriterSize(r.client, relayWriteBuffer)
	r.cwmu.Unlock()
	r.mu.Lock()
	r.opened = true
	draining := r.draining
	r.mu.Unlock()
	if draining {
		r.drain()
	}
	errc := make(chan error, 2)
	go func() { errc <- r.fromClient() }()
	go func() { errc <- r.fromHead() }()
	err = <-errc
	r.close()
	<-errc
	if err != nil && !errors.Is(err, io.EOF) && !isClosed(err) {
		r.g.opts.Log.Debug("Ray Client connection ended", zap.Error(err))
	}
}

func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }

// close ends both connections and every stream still open.
func (r *relay) close() {
	r.closeOnce.Do(func() {
		r.client.Close()
		r.mu.Lock()
		r.closed = true
		if r.up != nil {
			r.up.Close()
		}
		if r.idle != nil {
			r.idle.Stop()
		}
		streams := r.streams
		r.streams = map[uint32]*relayStream{}
		r.mu.Unlock()
		for _, s := range streams {
			s.rec.end()
		}
	})
}

// drain tells the client to open no new stream (the connection ends with its last stream).
func (r *relay) drain() {
	r.mu.Lock()
	r.draining = true
	last, open, opened := r.lastID, len(r.streams), r.opened
	r.mu.Unlock()
	if opened {
		r.writeClient(func(b []byte) []byte { return appendGoAway(b, last, errCodeNo) })
	}
	if open == 0 {
		r.close()
	}
}

// handshake reads the client's preface and frames up to its first complete header block, within
// HeaderTimeout and MaxHeaderBytes. pending are the frames before it (settings, window updates,
// pings), passed on once the head is dialled.
func (r *relay) handshake() (pending []byte, first headerBlock, err error) {
	if start, err := r.cr.Peek(3); err != nil {
		return nil, first, err
	} else if string(start) != clientPreface[:3] {
		// An HTTP/1 client: answered in its language.
		_, _ = io.WriteString(r.client, "HTTP/1.1 505 HTTP Version Not Supported\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n"+
			"Content-Length: 51\r\n\r\nraysync gateway: Ray Client speaks gRPC over HTTP/2")
		return nil, first, errors.New("not HTTP/2")
	}
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(r.cr, preface); err != nil {
		return nil, first, err
	}
	if string(preface) != clientPreface {
		return nil, first, errors.New("not an HTTP/2 connection preface")
	}
	// The server's preface at once, without a head yet: clients (gRPC's C core) wait for it before
	// their first call. Empty, it changes no default, so the head's own SETTINGS, passed on later,
	// start from the same state; the client's ACK of this one is the gateway's to drop.
	r.writeClient(func(b []byte) []byte { return appendFrameHeader(b, frameHeader{typ: frameSettings}) })
	r.ownSettings++
	var hb [9]byte
	limit := r.g.opts.Limits.MaxHeaderBytes
	for {
		h, err := readFrameHeader(r.cr, &hb)
		if err != nil {
			return nil, first, err
		}
		switch h.typ {
		case frameHeaders:
			first, err = r.readHeaderBlock(h, r.cr)
			return pending, first, err
		case frameSettings, frameWindowUpdate, framePing, framePriority:
			if int(h.length)+len(pending) > limit {
				return nil, first, errProtocol
			}
			payload := make([]byte, h.length)
			if _, err := io.ReadFull(r.cr, payload); err != nil {
				return nil, first, err
			}
			switch {
			case h.typ == frameSettings && h.flags&flagAck != 0 && r.ownSettings > 0:
				r.ownSettings-- // the ACK of the gateway's own SETTINGS
				continue
			case h.typ == frameSettings && h.flags&flagAck == 0:
				r.noteSettings(payload, &r.clientMaxFrame, &r.clientTable)
			}
			pending = append(appendFrameHeader(pending, h), payload...)
		default:
			return nil, first, errProtocol
		}
	}
}

// headerBlock is one HEADERS frame with its CONTINUATIONs, padding and priority removed.
type headerBlock struct {
	stream    uint32
	endStream bool
	block     []byte
}

// readHeaderBlock reads a header block whose HEADERS frame header is h, up to MaxHeaderBytes.
func (r *relay) readHeaderBlock(h frameHeader, br *bufio.Reader) (headerBlock, error) {
	limit := uint32(r.g.opts.Limits.MaxHeaderBytes)
	if h.length > limit || h.stream == 0 {
		return headerBlock{}, errProtocol
	}
	p := make([]byte, h.length)
	if _, err := io.ReadFull(br, p); err != nil {
		return headerBlock{}, err
	}
	pad := 0
	if h.flags&flagPadded != 0 {
		if len(p) < 1 {
			return headerBlock{}, errProtocol
		}
		pad, p = int(p[0]), p[1:]
	}
	if h.flags&flagPriority != 0 {
		if len(p) < 5 {
			return headerBlock{}, errProtocol
		}
		p = p[5:]
	}
	if pad > len(p) {
		return headerBlock{}, errProtocol
	}
	b := headerBlock{stream: h.stream, endStream: h.flags&flagEndStream != 0, block: p[:len(p)-pad]}
	var hb [9]byte
	for end := h.flags&flagEndHeaders != 0; !end; {
		c, err := readFrameHeader(br, &hb)
		if err != nil {
			return headerBlock{}, err
		}
		if c.typ != frameContinuation || c.stream != h.stream || uint32(len(b.block))+c.length > limit {
			return headerBlock{}, errProtocol
		}
		n := len(b.block)
		b.block = append(b.block, make([]byte, c.length)...)
		if _, err := io.ReadFull(br, b.block[n:]); err != nil {
			return headerBlock{}, err
		}
		end = c.flags&flagEndHeaders != 0
	}
	return b, nil
}

// noteSettings learns the frame and table sizes a peer accepts from its SETTINGS.
func (r *relay) noteSettings(p []byte, maxFrame, table *atomic.Uint32) {
	for ; len(p) >= 6; p = p[6:] {
		v := binary.BigEndian.Uint32(p[2:6])
		switch binary.BigEndian.Uint16(p[:2]) {
		case settingMaxFrameSize:
			if v >= defaultMaxFrameSize && v < 1<<24 {
				maxFrame.Store(v)
			}
		case settingHeaderTableSize:
			if v > table.Load() {
				table.Store(v) // decoders only ever allow more: a peer may lower its size any time
			}
		}
	}
}

// decode decodes a header block with dec, whose peer may use a table of up to table bytes. A list
// over limit is an error, found without holding it: a block of one-byte fields decodes to hundreds
// of times its size (fields past the limit are decoded for the table's sake, and dropped).
func decode(dec *hpack.Decoder, table uint32, b []byte, limit int) ([]hpack.HeaderField, error) {
	dec.SetAllowedMaxDynamicTableSize(table)
	var fields []hpack.HeaderField
	size := 0
	dec.SetEmitEnabled(true)
	dec.SetEmitFunc(func(f hpack.HeaderField) {
		if size += int(f.Size()); size > limit {
			dec.SetEmitEnabled(false)
			return
		}
		fields = append(fields, f)
	})
	if _, err := dec.Write(b); err != nil {
		return nil, err
	}
	if err := dec.Close(); err != nil {
		return nil, err
	}
	if size > limit {
		return nil, errProtocol
	}
	return fields, nil
}

// admission is what the gateway makes of a new stream's request headers.
type admission struct {
	cred      Credential
	result    string // "" when forwarded
	grpcCode  int
	message   string
	authority string // the address the stream named (also when refused: logged)
	up        upstream
}

// admit authenticates a new stream against the current table, then routes it (the first stream of a
// connection) or checks it names the connection's address (any later one).
func (r *relay) admit(fields []hpack.HeaderField) admission {
	var auth, authority string
	for _, f := range fields {
		switch f.Name {
		case "authorization":
			if auth == "" {
				auth = f.Value
			}
		case ":authority":
			authority = f.Value
		case "host":
			if authority == "" {
				authority = f.Value
			}
		}
	}
	t := r.g.table.Load()
	if t == nil {
		return admission{cred: None, result: NotReady, grpcCode: grpcUnavailable, message: "raysync gateway: not ready"}
	}
	token, ok := strings.CutPrefix(auth, bearerPrefix)
	cred := None
	if ok && token != "" {
		cred = t.accepts([]byte(token), r.g.opts.Now())
	}
	switch {
	case cred == None && auth == "":
		return admission{cred: None, result: Unauthenticated, grpcCode: grpcUnauthenticated, message: rayClientRefusal, authority: authority}
	case cred == None:
		return admission{cred: None, result: Forbidden, grpcCode: grpcUnauthenticated, message: rayClientRefusal, authority: authority}
	case r.authority != "":
		if !strings.EqualFold(authority, r.authority) {
			return admission{cred: cred, result: NoRoute, grpcCode: grpcNotFound,
				message: "raysync gateway: a connection reaches one address; open another for " + authority}
		}
		return admission{cred: cred, authority: authority, up: r.target}
	}
	up, err := r.g.route(t, authority, r.g.opts.ClientPort)
	if err != nil {
		return admission{cred: cred, result: NoRoute, grpcCode: grpcNotFound, message: "raysync gateway: " + err.Error()}
	}
	if up.rayTLS {
		// Ray's Ray Client server then takes only mutual TLS (a client certificate of the cluster's
		// CA): nothing the gateway could send it would be accepted. Say so, before any dial.
		return admission{cred: cred, result: NoRoute, grpcCode: grpcFailedPrecond, authority: authority, message: "raysync gateway: " + up.name +
			" runs Ray with RAY_USE_TLS (mutual TLS on its gRPC ports): the gateway relays Ray Client only without TLS; connect to the cluster's head directly with a client certificate of its CA"}
	}
	return admission{cred: cred, authority: authority, up: up}
}

// open admits the connection's first stream, dials its head and passes on what the client sent so
// far. false: the stream was answered by the gateway and the connection is done.
func (r *relay) open(pending []byte, first headerBlock) bool {
	start := r.g.opts.Now()
	fields, err := decode(r.cdec, r.upTable.Load(), first.block, r.g.opts.Limits.MaxHeaderBytes)
	if err != nil {
		return false
	}
	a := r.admit(fields)
	r.g.logRefused(ProtoGRPC, a.result, a.authority, r.client.RemoteAddr().String())
	rec := &streamRecord{g: r.g, start: start, result: a.result, cred: a.cred}
	if a.result == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		up, err := r.g.tunnel(ctx, "tcp", a.up.addr)
		cancel()
		if err != nil {
			r.g.opts.Log.Info("upstream failed", zap.String("host", a.up.addr), zap.String("protocol", ProtoGRPC), zap.Error(err))
			a.result, a.grpcCode, a.message = UpstreamError, grpcUnavailable, "raysync gateway: the cluster did not answer"
			rec.result = UpstreamError
		} else {
			r.mu.Lock()
			closed := r.closed
			if !closed {
				// A head that stops reading (a client sending past its flow-control window can make it
				// stop) must not pin the connection either.
				up = writeDeadlineConn{Conn: up, timeout: r.g.opts.Limits.WriteTimeout}
				r.up, r.ur, r.uw = up, bufio.NewReaderSize(up, relayBuffer), bufio.NewWriterSize(up, relayWriteBuffer)
			}
			r.mu.Unlock()
			if closed { // by Shutdown or Close meanwhile
				up.Close()
				a.result, a.grpcCode, a.message = UpstreamError, grpcUnavailable, "raysync gateway: shutting down"
				rec.result = UpstreamError
			}
		}
	}
	if a.result != "" {
		r.answerAlone(first.stream, a.grpcCode, a.message)
		rec.end()
		return false
	}
	r.authority, r.target = a.authority, a.up
	rec.result = Forwarded
	r.mu.Lock()
	r.lastID = first.stream
	r.streams[first.stream] = &relayStream{rec: rec, clientDone: first.endStream}
	r.mu.Unlock()
	_, _ = r.uw.WriteString(clientPreface)
	_, _ = r.uw.Write(pending)
	if err := r.forwardHeaders(first, fields, true); err != nil {
		return false
	}
	return r.uw.Flush() == nil
}

// answerAlone answers a connection's first stream as a server would, without a head: its settings,
// the acknowledgement of the client's, the stream's status, and GOAWAY; then the connection ends.
func (r *relay) answerAlone(stream uint32, code int, msg string) {
	r.writeClient(func(b []byte) []byte {
		b = appendFrameHeader(b, frameHeader{typ: frameSettings, flags: flagAck}) // the client's, as no head will
		b = r.appendStatus(b, stream, code, msg)
		return appendGoAway(b, stream, errCodeNo)
	})
	// Let the client read the answer before the connection goes (what it still sends is discarded).
	_ = r.client.SetReadDeadline(time.Now().Add(time.Second))
	_, _ = io.Copy(io.Discard, io.LimitReader(r.cr, 1<<20))
}

// appendStatus appends a Trailers-Only answer to stream, encoded without the dynamic table (called
// with cwmu held).
func (r *relay) appendStatus(b []byte, stream uint32, code int, msg string) []byte {
	r.cbuf.Reset()
	for _, f := range []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"},
		{Name: "grpc-status", Value: strconv.Itoa(code)}, {Name: "grpc-message", Value: url.PathEscape(msg)}} {
		_ = r.cenc.WriteField(f)
	}
	return appendHeaderFrames(b, stream, flagEndStream, r.cbuf.Bytes(), r.clientMaxFrame.Load())
}

// appendHeaderFrames appends block as HEADERS and CONTINUATION frames of at most maxFrame bytes.
func appendHeaderFrames(b []byte, stream uint32, flags byte, block []byte, maxFrame uint32) []byte {
	typ := byte(frameHeaders)
	for {
		n := min(uint32(len(block)), maxFrame)
		f := flags
		if n == uint32(len(block)) {
			f |= flagEndHeaders
		}
		b = appendFrameHeader(b, frameHeader{length: n, typ: typ, flags: f, stream: stream})
		b = append(b, block[:n]...)
		block = block[n:]
		if len(block) == 0 {
			return b
		}
		typ, flags = frameContinuation, 0
	}
}

func appendGoAway(b []byte, last uint32, code uint32) []byte {
	b = appendFrameHeader(b, frameHeader{length: 8, typ: frameGoAway})
	return binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(b, last), code)
}

func appendRST(b []byte, stream, code uint32) []byte {
	b = appendFrameHeader(b, frameHeader{length: 4, typ: frameRSTStream, stream: stream})
	return binary.BigEndian.AppendUint32(b, code)
}

func appendWindowUpdate(b []byte, stream, n uint32) []byte {
	b = appendFrameHeader(b, frameHeader{length: 4, typ: frameWindowUpdate, stream: stream})
	return binary.BigEndian.AppendUint32(b, n)
}

// writeClient writes what add appends to the client, at once. A write that fails (the client stopped
// reading for WriteTimeout, or went) ends the connection.
func (r *relay) writeClient(add func([]byte) []byte) {
	r.cwmu.Lock()
	_, err := r.cw.Write(add(nil))
	if err == nil {
		err = r.cw.Flush()
	}
	r.cwmu.Unlock()
	if err != nil {
		r.close()
	}
}

// forwardHeaders sends a client's header block on to the head without any client credential; a
// request's gets the cluster's token, and the head's address as its authority. Names are compared
// in any case: an upper-case name is malformed in HTTP/2, but a head that reads it anyway (Ray's
// interceptor lower-cases names and takes the first authorization) must not find the client's.
func (r *relay) forwardHeaders(b headerBlock, fields []hpack.HeaderField, request bool) error {
	r.ubuf.Reset()
	for _, f := range fields {
		switch strings.ToLower(f.Name) {
		case "authorization", "x-ray-authorization", "proxy-authorization":
			continue
		case ":authority":
			f.Value = r.target.addr
		case "cookie":
			if strings.Contains(f.Value, cookieName) {
				continue
			}
		}
		_ = r.uenc.WriteField(f)
	}
	if request {
		_ = r.uenc.WriteField(hpack.HeaderField{Name: "authorization", Value: bearerPrefix + string(r.target.token), Sensitive: true})
	}
	flags := byte(0)
	if b.endStream {
		flags = flagEndStream
	}
	_, err := r.uw.Write(appendHeaderFrames(nil, b.stream, flags, r.ubuf.Bytes(), r.upMaxFrame.Load()))
	return err
}

// fromClient passes the client's frames to the head until either side ends.
func (r *relay) fromClient() error {
	var hb [9]byte
	passable := func(h frameHeader) bool {
		switch h.typ {
		case framePing, frameGoAway:
			return true
		case frameData, frameWindowUpdate, frameRSTStream, framePriority:
			return h.stream == 0 || r.forwarding(h.stream)
		}
		return false
	}
	for {
		if r.cr.Buffered() == 0 {
			if err := r.uw.Flush(); err != nil {
				return err
			}
		}
		n, ended, err := runOfFrames(r.cr, passable)
		if err != nil {
			return err
		}
		if n > 0 {
			if err := r.uw.Flush(); err != nil { // what the slow path left goes first
				return err
			}
			if err := writeRun(r.up, r.cr, n); err != nil {
				return err
			}
			for _, e := range ended {
				r.streamSideEnded(e.stream, true, e.reset)
			}
			continue
		}
		h, err := readFrameHeader(r.cr, &hb)
		if err != nil {
			return err
		}
		switch h.typ {
		case frameHeaders:
			if err := r.clientHeaders(h); err != nil {
				return err
			}
			continue
		case frameContinuation, framePushPromise:
			return errProtocol
		case frameSettings:
			if h.flags&flagAck != 0 && r.ownSettings > 0 {
				r.ownSettings-- // the ACK of the gateway's own SETTINGS
				if _, err := r.cr.Discard(int(h.length)); err != nil {
					return err
				}
				continue
			}
			if h.flags&flagAck == 0 {
				if h.length > 1<<12 {
					return errProtocol
				}
				p := make([]byte, h.length)
				if _, err := io.ReadFull(r.cr, p); err != nil {
					return err
				}
				r.noteSettings(p, &r.clientMaxFrame, &r.clientTable)
				if _, err := r.uw.Write(append(appendFrameHeader(nil, h), p...)); err != nil {
					return err
				}
				continue
			}
		case frameData, frameWindowUpdate, frameRSTStream, framePriority:
			if h.stream != 0 && !r.forwarding(h.stream) {
				if err := r.drop(h); err != nil {
					return err
				}
				continue
			}
			if h.typ == frameData && h.flags&flagEndStream != 0 || h.typ == frameRSTStream {
				r.streamSideEnded(h.stream, true, h.typ == frameRSTStream)
			}
		}
		if err := r.pass(r.uw, h, r.cr); err != nil {
			return err
		}
	}
}

// streamEnd is a stream side ended by a frame a run passed on.
type streamEnd struct {
	stream uint32
	reset  bool
}

// runOfFrames waits for data from br and measures the run of whole frames at the start of its
// buffer that pass through unchanged (passable), n bytes, with the stream sides they end. n is 0
// when the first frame needs handling, or is larger than the buffer.
func runOfFrames(br *bufio.Reader, passable func(frameHeader) bool) (n int, ended []streamEnd, err error) {
	for {
		if br.Buffered() < 9 {
			if _, err := br.Peek(9); err != nil {
				return 0, nil, err
			}
		}
		buf, _ := br.Peek(br.Buffered())
		for len(buf)-n >= 9 {
			h := parseFrameHeader(buf[n:])
			size := 9 + int(h.length)
			if size > len(buf)-n || !passable(h) {
				break
			}
			if h.typ == frameRSTStream || h.typ == frameData && h.flags&flagEndStream != 0 {
				ended = append(ended, streamEnd{h.stream, h.typ == frameRSTStream})
			}
			n += size
		}
		if n > 0 || len(buf) < 9 {
			return n, ended, nil
		}
		// The first frame passes but has not all arrived: wait for it if the buffer can hold it.
		h := parseFrameHeader(buf)
		if size := 9 + int(h.length); !passable(h) || size > br.Size() {
			return 0, nil, nil
		} else if _, err := br.Peek(size); err != nil {
			return 0, nil, err
		}
	}
}

// writeRun writes the n bytes at the start of br's buffer to w as they are, without copying them.
func writeRun(w io.Writer, br *bufio.Reader, n int) error {
	b, _ := br.Peek(n)
	if _, err := w.Write(b); err != nil {
		return err
	}
	_, err := br.Discard(n)
	return err
}

func parseFrameHeader(b []byte) frameHeader {
	return frameHeader{length: uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]), typ: b[3], flags: b[4],
		stream: binary.BigEndian.Uint32(b[5:9]) & (1<<31 - 1)}
}

// pass copies one frame as it came.
func (r *relay) pass(w *bufio.Writer, h frameHeader, br *bufio.Reader) error {
	var hb [9]byte
	if _, err := w.Write(appendFrameHeader(hb[:0], h)); err != nil {
		return err
	}
	_, err := io.CopyN(w, br, int64(h.length))
	return err
}

func (r *relay) forwarding(stream uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.streams[stream] != nil
}

// drop discards a client frame of a stream the head does not have open (one the gateway answered,
// or one over); DATA's flow-control credit goes back to the client, since the head never saw it.
func (r *relay) drop(h frameHeader) error {
	if _, err := r.cr.Discard(int(h.length)); err != nil {
		return err
	}
	if h.typ == frameData && h.length > 0 {
		r.writeClient(func(b []byte) []byte { return appendWindowUpdate(b, 0, h.length) })
	}
	return nil
}

// clientHeaders handles a header block from the client: a new stream is admitted or answered by the
// gateway; anything else on a stream it forwards is forwarded.
func (r *relay) clientHeaders(h frameHeader) error {
	start := r.g.opts.Now()
	b, err := r.readHeaderBlock(h, r.cr)
	if err != nil {
		return err
	}
	// Decoded whatever becomes of it: the client's encoder state must be followed.
	fields, err := decode(r.cdec, r.upTable.Load(), b.block, r.g.opts.Limits.MaxHeaderBytes)
	if err != nil {
		return err
	}
	r.mu.Lock()
	_, known := r.streams[b.stream]
	isNew := !known && b.stream > r.lastID
	if isNew {
		r.lastID = b.stream
	}
	draining := r.draining
	r.mu.Unlock()
	switch {
	case known: // the client's trailers
		if b.endStream {
			r.streamSideEnded(b.stream, true, false)
		}
		return r.forwardHeaders(b, fields, false)
	case !isNew && b.stream%2 == 1:
		return nil // trailers of a stream the gateway answered, or one over
	case b.stream%2 == 0:
		return errProtocol
	case draining:
		r.writeClient(func(p []byte) []byte { return appendRST(p, b.stream, errCodeRefusedStream) })
		return nil
	case r.openStreams() >= r.g.opts.Limits.MaxStreams:
		// Over the connection's stream cap: refused before anything is forwarded (gRPC retries it).
		r.writeClient(func(p []byte) []byte { return appendRST(p, b.stream, errCodeRefusedStream) })
		return nil
	}
	a := r.admit(fields)
	r.g.logRefused(ProtoGRPC, a.result, a.authority, r.client.RemoteAddr().String())
	rec := &streamRecord{g: r.g, start: start, result: a.result, cred: a.cred}
	if a.result != "" {
		r.writeClient(func(p []byte) []byte {
			p = r.appendStatus(p, b.stream, a.grpcCode, a.message)
			if !b.endStream {
				p = appendRST(p, b.stream, errCodeNo)
			}
			return p
		})
		rec.end()
		return nil
	}
	rec.result = Forwarded
	r.mu.Lock()
	r.streams[b.stream] = &relayStream{rec: rec, clientDone: b.endStream}
	if r.idle != nil {
		r.idle.Stop()
	}
	r.mu.Unlock()
	return r.forwardHeaders(b, fields, true)
}

func (r *relay) openStreams() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.streams)
}

// streamSideEnded notes one side of a stream ending (or the stream reset); a stream both sides
// ended is over.
func (r *relay) streamSideEnded(stream uint32, client, reset bool) {
	r.mu.Lock()
	s := r.streams[stream]
	if s == nil {
		r.mu.Unlock()
		return
	}
	if client {
		s.clientDone = true
	} else {
		s.upDone = true
	}
	over := reset || s.clientDone && s.upDone
	if over {
		delete(r.streams, stream)
	}
	idle := len(r.streams) == 0
	draining := r.draining
	r.mu.Unlock()
	if !over {
		return
	}
	s.rec.end()
	if idle && draining {
		r.close()
	} else if idle {
		r.armIdle()
	}
}

// armIdle closes the connection after IdleTimeout without a stream.
func (r *relay) armIdle() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.idle != nil {
		r.idle.Stop()
	}
	r.idle = time.AfterFunc(r.g.opts.Limits.IdleTimeout, func() {
		r.mu.Lock()
		open, last := len(r.streams), r.lastID
		r.mu.Unlock()
		if open == 0 {
			r.writeClient(func(b []byte) []byte { return appendGoAway(b, last, errCodeNo) })
			r.close()
		}
	})
}

// fromHead passes the head's frames to the client until either side ends.
func (r *relay) fromHead() error {
	var hb [9]byte
	passable := func(h frameHeader) bool {
		switch h.typ {
		case frameData, frameWindowUpdate, frameRSTStream, framePriority, framePing, frameGoAway:
			return true
		}
		return false
	}
	for {
		n, ended, err := runOfFrames(r.ur, passable)
		if err != nil {
			return err
		}
		if n > 0 {
			r.cwmu.Lock()
			err := r.cw.Flush() // what the slow path left goes first
			if err == nil {
				err = writeRun(r.client, r.ur, n)
			}
			r.cwmu.Unlock()
			if err != nil {
				return err
			}
			for _, e := range ended {
				r.streamSideEnded(e.stream, false, e.reset)
			}
			continue
		}
		h, err := readFrameHeader(r.ur, &hb)
		if err != nil {
			return err
		}
		switch h.typ {
		case frameHeaders:
			if err := r.headHeaders(h); err != nil {
				return err
			}
			continue
		case frameContinuation, framePushPromise:
			return errProtocol
		case frameSettings:
			if h.flags&flagAck == 0 {
				if h.length > 1<<12 {
					return errProtocol
				}
				p := make([]byte, h.length)
				if _, err := io.ReadFull(r.ur, p); err != nil {
					return err
				}
				r.noteSettings(p, &r.upMaxFrame, &r.upTable)
				r.cwmu.Lock()
				_, err = r.cw.Write(append(appendFrameHeader(nil, h), p...))
				r.flushIfIdle()
				r.cwmu.Unlock()
				if err != nil {
					return err
				}
				continue
			}
		}
		r.cwmu.Lock()
		err = r.pass(r.cw, h, r.ur)
		if err == nil {
			err = r.flushIfIdle()
		}
		r.cwmu.Unlock()
		if err != nil {
			return err
		}
		if h.typ == frameData && h.flags&flagEndStream != 0 || h.typ == frameRSTStream {
			r.streamSideEnded(h.stream, false, h.typ == frameRSTStream)
		}
	}
}

// flushIfIdle flushes what goes to the client once nothing more from the head is waiting (called
// with cwmu held).
func (r *relay) flushIfIdle() error {
	if r.ur.Buffered() == 0 {
		return r.cw.Flush()
	}
	return nil
}

// headHeaders passes on a header block from the head: its answer's headers (the stream is observed
// then) or trailers, each checked for Ray refusing the gateway's token.
func (r *relay) headHeaders(h frameHeader) error {
	b, err := r.readHeaderBlock(h, r.ur)
	if err != nil {
		return err
	}
	fields, err := decode(r.udec, r.clientTable.Load(), b.block, r.g.opts.Limits.MaxHeaderBytes)
	if err != nil {
		return err
	}
	var status, msg string
	for _, f := range fields {
		switch f.Name {
		case "grpc-status":
			status = f.Value
		case "grpc-message":
			msg, _ = url.PathUnescape(f.Value)
		}
	}
	refused := status == strconv.Itoa(grpcUnauthenticated) && msg == rayClientRefusal
	if refused {
		r.g.opts.UpstreamAuthFailure(ProtoGRPC)
		for i := range fields {
			switch fields[i].Name {
			case "grpc-status":
				fields[i].Value = strconv.Itoa(grpcUnavailable)
			case "grpc-message":
				fields[i].Value = url.PathEscape("raysync gateway: the cluster refused the gateway's token")
			}
		}
	}
	r.mu.Lock()
	s := r.streams[b.stream]
	r.mu.Unlock()
	if s != nil {
		s.rec.observe() // the answer's headers (a refusal of the token included: the client's is fine)
	}
	r.cwmu.Lock()
	r.cbuf.Reset()
	for _, f := range fields {
		_ = r.cenc.WriteField(f)
	}
	flags := byte(0)
	if b.endStream {
		flags = flagEndStream
	}
	_, err = r.cw.Write(appendHeaderFrames(nil, b.stream, flags, r.cbuf.Bytes(), r.clientMaxFrame.Load()))
	if err == nil {
		err = r.flushIfIdle()
	}
	r.cwmu.Unlock()
	if b.endStream {
		r.streamSideEnded(b.stream, false, false)
	}
	return err
}
