package app

import (
	"crypto/tls"
	"net"
	"net/http"
	"testing"

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
