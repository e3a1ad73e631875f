package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"
)

// fakeProxy accepts one CONNECT and hands it to answer (which may never answer).
func fakeProxy(t *testing.T, answer func(net.Conn, *http.Request)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		answer(c, req)
	}()
	return ln.Addr().String()
}

func tunnelVia(proxy string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *Gateway {
	u, _ := url.Parse(proxy)
	return New(Options{Proxy: func(*http.Request) (*url.URL, error) { return u, nil }, Dial: dial})
}

// TestTunnelPresentsTheProxysCredentials: a proxy URL with user:password authenticates the CONNECT
// (Basic), as Go's transport does for the dashboard's requests.
func TestTunnelPresentsTheProxysCredentials(t *testing.T) {
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("ray user:p@ss"))
	got := make(chan string, 1)
	addr := fakeProxy(t, func(c net.Conn, req *http.Request) {
		got <- req.Method + " " + req.Host + ", credentials presented: " + map[bool]string{true: "the proxy URL's", false: redact(req.Header.Get("Proxy-Authorization"))}[req.Header.Get("Proxy-Authorization") == want]
		_, _ = c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	})
	g := tunnelVia("http://ray%20user:p%40ss@"+addr, nil)
	conn, err := g.tunnel(context.Background(), "tcp", "head-svc.ml.svc.cluster.local:10001")
	if err != nil {
		t.Fatal(err)
	}
	conn.Close()
	if g, want := <-got, "CONNECT head-svc.ml.svc.cluster.local:10001, credentials presented: the proxy URL's"; g != want {
		t.Errorf("the proxy received %q, want %q", g, want)
	}
}

// TestTunnelDialsTheSchemesPortWhenTheURLHasNone: http://proxy means port 80, https://proxy 443.
func TestTunnelDialsTheSchemesPortWhenTheURLHasNone(t *testing.T) {
	for proxy, want := range map[string]string{"http://proxy.corp": "proxy.corp:80", "https://proxy.corp": "proxy.corp:443",
		"http://proxy.corp:3128": "proxy.corp:3128", "http://[fd00::1]": "[fd00::1]:80"} {
		var dialled string
		g := tunnelVia(proxy, func(_ context.Context, _, addr string) (net.Conn, error) {
			dialled = addr
			return nil, errors.New("not dialling in a test")
		})
		_, _ = g.tunnel(context.Background(), "tcp", "head-svc.ml.svc.cluster.local:10001")
		if dialled != want {
			t.Errorf("%s: dialled %q, want %q", proxy, dialled, want)
		}
	}
}

// TestTunnelEndsWhenItsContextDoes: a proxy that takes the CONNECT and never answers holds nothing
// once the dial's context is cancelled (Go's transport cancels it when the request goes away).
func TestTunnelEndsWhenItsContextDoes(t *testing.T) {
	read, stop := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(stop) })
	addr := fakeProxy(t, func(c net.Conn, _ *http.Request) {
		close(read)
		<-stop // never answers
	})
	g := tunnelVia("http://"+addr, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := g.tunnel(ctx, "tcp", "head-svc.ml.svc.cluster.local:10001")
		done <- err
	}()
	<-read
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Error("the tunnel was established by a proxy that never answered")
		}
	case <-time.After(10 * time.Second): // generous: the cancellation ends it at once
		t.Fatal("the CONNECT is still waiting for the proxy after its context was cancelled")
	}
}

// TestTunnelSpeaksTLSToAnHTTPSProxy: an https:// proxy is reached over TLS (its certificate checked
// against ProxyTLS, or the system's roots), and the CONNECT goes inside.
func TestTunnelSpeaksTLSToAnHTTPSProxy(t *testing.T) {
	proxy := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || r.Host != "head-svc.ml.svc.cluster.local:10001" {
			http.Error(w, "not a CONNECT", http.StatusBadRequest)
			return
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
		line, _ := buf.ReadString('\n')
		_, _ = conn.Write([]byte("echo " + line))
	}))
	proxy.StartTLS()
	t.Cleanup(proxy.Close)
	roots := x509.NewCertPool()
	roots.AddCert(proxy.Certificate())
	u, _ := url.Parse(proxy.URL) // https://127.0.0.1:port
	g := New(Options{Proxy: func(*http.Request) (*url.URL, error) { return u, nil }, ProxyTLS: &tls.Config{RootCAs: roots}})
	conn, err := g.tunnel(context.Background(), "tcp", "head-svc.ml.svc.cluster.local:10001")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = conn.Write([]byte("ping\n"))
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || got != "echo ping\n" {
		t.Errorf("through the tunnel: %q %v", got, err)
	}
	// Without the proxy's CA the tunnel is refused, not made in the clear.
	g = New(Options{Proxy: func(*http.Request) (*url.URL, error) { return u, nil }})
	if c, err := g.tunnel(context.Background(), "tcp", "head-svc.ml.svc.cluster.local:10001"); err == nil {
		c.Close()
		t.Error("a tunnel through a proxy whose certificate is not trusted")
	}
}

// TestTunnelRefusesOtherProxySchemes: a socks5:// proxy is not silently spoken to as HTTP.
func TestTunnelRefusesOtherProxySchemes(t *testing.T) {
	dialled := false
	g := tunnelVia("socks5://127.0.0.1:1080", func(context.Context, string, string) (net.Conn, error) {
		dialled = true
		return nil, errors.New("no")
	})
	if _, err := g.tunnel(context.Background(), "tcp", "head-svc.ml.svc.cluster.local:10001"); err == nil || dialled {
		t.Errorf("socks5 proxy: %v, dialled %v; want refused before dialling", err, dialled)
	}
}
