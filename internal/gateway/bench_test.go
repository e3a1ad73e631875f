package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// answer is a head answering every request in memory: what remains is the proxies' own work.
type answer struct{}

func (answer) RoundTrip(r *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Request: r,
		Header: http.Header{"Content-Type": {"application/json"}}, ContentLength: 12, Body: io.NopCloser(strings.NewReader(`{"jobs": []}`))}, nil
}

// BenchmarkDashboardRequest: one Jobs API request through the gateway's handler (token check,
// route, rewrite, metrics hooks) and through a bare reverse proxy, both to an in-memory head.
func BenchmarkDashboardRequest(b *testing.B) {
	g := New(Options{DashboardPort: 8265, ClientPort: 10001})
	g.SetTable(testTable())
	g.dashboard.Transport = answer{}
	h := g.Dashboard()
	up, _ := url.Parse("http://svc-abc-head-svc.ml.svc.cluster.local:8265")
	bare := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(up) }, Transport: answer{}}
	for name, tc := range map[string]struct {
		h    http.Handler
		auth string
	}{"gateway": {h, "Bearer " + string(clientCurrent)}, "bare reverse proxy": {bare, "Bearer " + string(clusterToken1)}} {
		b.Run(name, func(b *testing.B) {
			req := httptest.NewRequest("GET", "http://svc-gw.ml.svc.cluster.local:8265/api/jobs/", nil)
			req.Header.Set("Authorization", tc.auth)
			req.Header.Set("User-Agent", "python-requests/2.32")
			req.Header.Set("Accept", "*/*")
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				tc.h.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Fatalf("HTTP %d %s", w.Code, w.Body)
				}
			}
		})
	}
}

// BenchmarkHeaderBlockOverTheLimit: what a 64 KiB header block of one-byte indexed fields (42
// bytes each decoded: 2.7 MB in all, over the 64 KiB limit) costs the gateway before it refuses it,
// as an unauthenticated client can send one per connection.
func BenchmarkHeaderBlockOverTheLimit(b *testing.B) {
	const limit = 64 << 10
	block := bytes.Repeat([]byte{0x82}, limit)
	dec := hpack.NewDecoder(4096, nil)
	b.ReportAllocs()
	b.SetBytes(limit)
	for b.Loop() {
		if _, err := decode(dec, 4096, block, limit); err == nil {
			b.Fatal("a list over the limit decoded")
		}
	}
}
