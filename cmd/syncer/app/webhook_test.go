package app

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/util/cert"
)

// The webhook speaks HTTP/1.1 only, over TLS 1.2 or later, even to a client offering HTTP/2.
func TestWebhookServerRefusesHTTP2(t *testing.T) {
	crt, key, err := cert.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(crt, key)
	if err != nil {
		t.Fatal(err)
	}
	srv := webhookServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(r.Proto)) }),
		func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &pair, nil })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	defer srv.Close()
	for _, tc := range []struct {
		max  uint16
		want bool
	}{{tls.VersionTLS13, true}, {tls.VersionTLS11, false}} {
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2", "http/1.1"}, MaxVersion: tc.max, MinVersion: tls.VersionTLS10})
		if !tc.want {
			if err == nil {
				conn.Close()
				t.Error("accepted a TLS 1.1 client")
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if p := conn.ConnectionState().NegotiatedProtocol; p == "h2" {
			t.Errorf("negotiated %q", p)
		}
		conn.Close()
	}
}

// Every plain listener (metrics, probes) and the webhook bound what one client can hold: headers over
// 64 KiB are refused, a client that never finishes its headers is cut off, and each server has read,
// write and idle timeouts (docs/security.md lists them).
func TestListenersBoundWhatOneClientHolds(t *testing.T) {
	for name, srv := range map[string]*http.Server{
		"plain":   plainServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})),
		"webhook": webhookServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), nil),
	} {
		if srv.ReadHeaderTimeout == 0 || srv.ReadTimeout == 0 || srv.WriteTimeout == 0 || srv.IdleTimeout == 0 || srv.MaxHeaderBytes == 0 || srv.MaxHeaderBytes > 64<<10 {
			t.Errorf("%s: header %s, read %s, write %s, idle %s, max header %d: every bound must be set", name,
				srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout, srv.MaxHeaderBytes)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := plainServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/metrics", nil)
	req.Header.Set("X-Big", strings.Repeat("a", 200<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("200 KiB of headers: HTTP %d, want 431", resp.StatusCode)
	}
	if testing.Short() {
		return
	}
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = conn.Write([]byte("GET /metrics HTTP/1.1\r\nHost: x\r\n")) // and never the blank line
	_ = conn.SetReadDeadline(time.Now().Add(srv.ReadHeaderTimeout + 5*time.Second))
	start := time.Now()
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("a client that never ends its headers was not cut off within %s: %v", srv.ReadHeaderTimeout+5*time.Second, err)
	}
	t.Logf("a client that never ends its headers: cut off after %s", time.Since(start).Round(100*time.Millisecond))
}
