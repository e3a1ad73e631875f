package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// tunnel dials addr directly, or through the HTTP proxy with CONNECT when one is set for it: as Go's
// transport does for the dashboard's requests — the proxy URL's credentials (Basic), its scheme's
// port when it names none, TLS to an https:// proxy — and the exchange ends when ctx does.
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
	port := proxy.Port()
	switch {
	case proxy.Scheme != "http" && proxy.Scheme != "https":
		return nil, fmt.Errorf("proxy scheme %q: Ray Client is tunnelled only through http:// and https:// proxies (exclude the heads with NO_PROXY)", proxy.Scheme)
	case port == "" && proxy.Scheme == "https":
		port = "443"
	case port == "":
		port = "80"
	}
	conn, err := g.opts.Dial(ctx, "tcp", net.JoinHostPort(proxy.Hostname(), port))
	if err != nil {
		return nil, err
	}
	// Whatever blocks below is released by ctx: its deadline, or its cancellation.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	tunnelled, err := connect(ctx, conn, proxy, addr, g.opts.ProxyTLS)
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	return tunnelled, nil
}

// connect asks the proxy on conn for a tunnel to addr.
func connect(ctx context.Context, conn net.Conn, proxy *url.URL, addr string, tlsConfig *tls.Config) (net.Conn, error) {
	if proxy.Scheme == "https" {
		cfg := &tls.Config{}
		if tlsConfig != nil {
			cfg = tlsConfig.Clone()
		}
		if cfg.ServerName == "" {
			cfg.ServerName = proxy.Hostname()
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("proxy %s: %w", proxy.Host, err)
		}
		conn = tc
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: addr}, Host: addr, Header: http.Header{}}
	if u := proxy.User; u != nil {
		pass, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pass)))
	}
	if err := req.Write(conn); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("proxy %s: CONNECT %s: %s", proxy.Host, addr, resp.Status)
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
