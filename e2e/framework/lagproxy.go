package framework

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
)

// LagProxy stands between one client and the API server and delays what the client reads of some
// resources: a cache that lags the API server, made deterministic (raysync just restarted, or busy). A
// list is answered delay after it was asked (with what the API server held when asked), and each watch
// event is passed on delay after the API server sent it. Everything else passes at once. It speaks
// plain HTTP on loopback and calls the API server as the control plane's admin.
type LagProxy struct {
	// Kubeconfig points a client at the proxy.
	Kubeconfig string
	srv        *http.Server
}

// StartLagProxy starts a proxy in dir that delays the requests lagging says, by delay.
func StartLagProxy(cp *ControlPlane, dir string, delay time.Duration, lagging func(*http.Request) bool) (*LagProxy, error) {
	tr, err := rest.TransportFor(cp.Config)
	if err != nil {
		return nil, err
	}
	target, err := url.Parse(cp.Config.Host)
	if err != nil {
		return nil, err
	}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) },
		Transport:     tr,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			req := resp.Request
			if !lagging(req) {
				return nil
			}
			if req.URL.Query().Get("watch") == "true" {
				resp.Body = newLaggingBody(resp.Body, delay)
				return nil
			}
			time.Sleep(delay) // a list: what the API server held when it was asked, delay later
			return nil
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &LagProxy{srv: &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}, Kubeconfig: filepath.Join(dir, "lagging.kubeconfig")}
	go func() { _ = p.srv.Serve(ln) }()
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: lagging, cluster: {server: "http://%s"}}]
users: [{name: lagging, user: {}}]
contexts: [{name: lagging, context: {cluster: lagging, user: lagging}}]
current-context: lagging
`, ln.Addr())
	if err := os.WriteFile(p.Kubeconfig, []byte(kc), 0o600); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close stops the proxy (and every watch through it).
func (p *LagProxy) Close() { _ = p.srv.Close() }

// laggingBody passes on each chunk of a watch stream delay after it arrived.
type laggingBody struct {
	upstream io.ReadCloser
	chunks   chan lagChunk
	pending  []byte
	err      error
}

type lagChunk struct {
	b   []byte
	at  time.Time
	err error
}

func newLaggingBody(upstream io.ReadCloser, delay time.Duration) *laggingBody {
	l := &laggingBody{upstream: upstream, chunks: make(chan lagChunk, 1024)}
	go func() {
		defer close(l.chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := upstream.Read(buf)
			l.chunks <- lagChunk{b: buf[:n], at: time.Now().Add(delay), err: err}
			if err != nil {
				return
			}
		}
	}()
	return l
}

func (l *laggingBody) Read(p []byte) (int, error) {
	for len(l.pending) == 0 {
		if l.err != nil {
			return 0, l.err
		}
		c, ok := <-l.chunks
		if !ok {
			return 0, io.EOF
		}
		time.Sleep(time.Until(c.at))
		l.pending, l.err = c.b, c.err
	}
	n := copy(p, l.pending)
	l.pending = l.pending[n:]
	return n, nil
}

func (l *laggingBody) Close() error { return l.upstream.Close() }
