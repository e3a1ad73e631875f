package gateway

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound what one client can hold on the gateway's ports. Every refusal is answered before a
// body is read, so an unauthenticated client meets only the header timeout, the idle timeout and
// the connection cap.
type Limits struct {
	// HeaderTimeout is how long a client has to send a request's headers (HTTP/1.1), or the first
	// request of a Ray Client connection.
	HeaderTimeout time.Duration
	// BodyTimeout is how long an authenticated client has to send a forwarded request's body.
	BodyTimeout time.Duration
	// IdleTimeout closes a connection with nothing in flight.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's headers (HTTP/2: its header list).
	MaxHeaderBytes int
	// MaxBodyBytes bounds a dashboard request's body (Ray's own limit by default).
	MaxBodyBytes int64
	// MaxConnections is the most connections served at once on each port; more are refused at once.
	MaxConnections int
	// WriteTimeout bounds each write to a Ray Client connection: a client that stops reading is cut off
	// after it instead of pinning the connection (and the head's) until TCP gives up.
	WriteTimeout time.Duration
	// MaxStreams is the most streams one Ray Client connection has open at once; more are refused
	// (REFUSED_STREAM, which gRPC retries).
	MaxStreams int
}

// DefaultLimits are the limits of `syncer gateway` unless flags say otherwise.
func DefaultLimits() Limits {
	return Limits{HeaderTimeout: 10 * time.Second, BodyTimeout: 5 * time.Minute, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, MaxBodyBytes: MaxDashboardBody, MaxConnections: 512, WriteTimeout: 30 * time.Second, MaxStreams: 100}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = d.HeaderTimeout
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = d.BodyTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = d.MaxHeaderBytes
	}
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = d.MaxBodyBytes
	}
	if l.MaxConnections <= 0 {
		l.MaxConnections = d.MaxConnections
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = d.WriteTimeout
	}
	if l.MaxStreams <= 0 {
		l.MaxStreams = d.MaxStreams
	}
	return l
}

// DashboardServer is the HTTP server for Dashboard() with the gateway's limits. There is no
// server-wide read or write timeout: a forwarded answer may stream for hours (a job's logs), and an
// upload gets BodyTimeout from the moment it is authenticated.
func (g *Gateway) DashboardServer() *http.Server {
	l := g.opts.Limits
	return &http.Server{Handler: g.Dashboard(), ReadHeaderTimeout: l.HeaderTimeout, IdleTimeout: l.IdleTimeout,
		MaxHeaderBytes: l.MaxHeaderBytes}
}

// limitBody gives a forwarded request's body BodyTimeout and MaxBodyBytes; the read deadline is
// lifted once the body has been read, so the answer can stream for as long as it lasts. A websocket
// upgrade has no body: the connection is the cluster's once switched.
func (g *Gateway) limitBody(w *recorder, r *http.Request) {
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(g.opts.Limits.BodyTimeout)); err != nil {
		return
	}
	r.Body = &limitedBody{ReadCloser: http.MaxBytesReader(w, r.Body, g.opts.Limits.MaxBodyBytes), w: w,
		lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
}

type limitedBody struct {
	io.ReadCloser
	w      *recorder
	lift   func()
	once   sync.Once
	failed bool
}

func (b *limitedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF:
		b.once.Do(b.lift)
	case err != nil && !b.failed:
		// Too long, too slow or cut off: the client's fault, whatever the cluster then answers.
		b.failed = true
		var tooLarge *http.MaxBytesError
		var timeout net.Error
		if errors.As(err, &tooLarge) || (errors.As(err, &timeout) && timeout.Timeout()) || errors.Is(err, io.ErrUnexpectedEOF) {
			b.w.bodyFailed.Store(true)
		}
	}
	return n, err
}

// ConnLimiter serves at most a fixed number of a listener's connections at once and refuses the rest
// as they arrive (an HTTP/1.1 listener with a 503, others by closing): a flood of idle connections
// costs the gateway a bounded amount of memory, and clients beyond it learn at once.
type ConnLimiter struct {
	net.Listener
	slots   chan struct{}
	refusal []byte
	// Opened, Closed and Refused report each connection (metrics).
	Opened, Closed, Refused func()
}

// LimitConnections wraps ln. refusal is written to a connection refused (nil: closed without a word).
func LimitConnections(ln net.Listener, max int, refusal []byte) *ConnLimiter {
	nop := func() {}
	return &ConnLimiter{Listener: ln, slots: make(chan struct{}, max), refusal: refusal, Opened: nop, Closed: nop, Refused: nop}
}

// HTTPRefusal is what a refused HTTP/1.1 connection reads.
var HTTPRefusal = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 37\r\n" +
	"Connection: close\r\nRetry-After: 1\r\n\r\nraysync gateway: too many connections")

// Open is the number of connections being served.
func (l *ConnLimiter) Open() int { return len(l.slots) }

// Accept returns the next connection within the cap, refusing those beyond it.
func (l *ConnLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			l.Opened()
			return &limitedConn{Conn: c, release: func() { <-l.slots; l.Closed() }}, nil
		default:
			l.Refused()
			go l.refuse(c)
		}
	}
}

func (l *ConnLimiter) refuse(c net.Conn) {
	if l.refusal != nil {
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = c.Write(l.refusal)
	}
	_ = c.Close()
}

// writeDeadlineConn gives every write a deadline: a peer that stops reading fails the write after
// timeout instead of blocking it for as long as TCP keeps the connection.
type writeDeadlineConn struct {
	net.Conn
	timeout time.Duration
}

func (c writeDeadlineConn) Write(p []byte) (int, error) {
	if err := c.Conn.SetWriteDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, err
	}
	return c.Conn.Write(p)
}

type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
