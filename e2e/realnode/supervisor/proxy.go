package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"time"
)

// serveProxy is an HTTP forward proxy (HTTP_PROXY; CONNECT for anything else) for host processes —
// the KubeRay operator, the tests — that call Services by their cluster names
// (http://<svc>.<ns>.svc.cluster.local:8265) as a pod does: names resolve through the cluster DNS,
// and the connection goes straight to the Service or pod address, which the host routes into the
// node (kube-proxy translates it there). It dials nothing outside allow.
func serveProxy(listen, dns, allow string) error {
	const slow = 2 * time.Second
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	_, allowed, err := net.ParseCIDR(allow)
	if err != nil {
		return err
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return dialer.DialContext(ctx, network, dns)
	}}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		ips, err := resolver.LookupIPAddr(ctx, host)
		if d := time.Since(t0); d > slow {
			log.Printf("slow: DNS lookup of %s took %s (%v)", host, d.Round(time.Millisecond), err)
		}
		if err != nil {
			return nil, err
		}
		for _, ip := range ips {
			if allowed.Contains(ip.IP) {
				t1 := time.Now()
				c, err := dialer.DialContext(ctx, network, net.JoinHostPort(ip.IP.String(), port))
				if d := time.Since(t1); d > slow {
					log.Printf("slow: connecting to %s (%s) took %s (%v)", ip.IP, host, d.Round(time.Millisecond), err)
				}
				return c, err
			}
		}
		return nil, fmt.Errorf("%s resolves to %v, outside %s", host, ips, allowed)
	}
	forward := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL = r.In.URL // absolute-URI: where the client asked to go
			r.Out.Host = r.In.Host
		},
		// A connection per request, as the clients of a plain HTTP proxy expect: a pooled connection to
		// a Service address stays on the pod kube-proxy chose when it opened, so a "new" call could reach
		// a pod the Service no longer selects (a deleted cluster's head still answering during its
		// graceful termination). A client that wants one connection throughout tunnels with CONNECT.
		Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true},
		ErrorLog:  log.Default(),
	}
	return http.ListenAndServe(listen, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			if !r.URL.IsAbs() {
				http.Error(w, "an HTTP proxy: send absolute-URI requests (HTTP_PROXY)", http.StatusBadRequest)
				return
			}
			// A slow answer is logged with where the time went (the tests print these lines when a
			// client saw one): a new or reused connection, and when the upstream answered.
			start := time.Now()
			var reused bool
			var firstByte time.Duration
			trace := &httptrace.ClientTrace{
				GotConn:              func(i httptrace.GotConnInfo) { reused = i.Reused },
				GotFirstResponseByte: func() { firstByte = time.Since(start) },
			}
			forward.ServeHTTP(w, r.WithContext(httptrace.WithClientTrace(r.Context(), trace)))
			if d := time.Since(start); d > slow {
				log.Printf("slow: %s %s took %s: connection reused %v, first response byte after %s", r.Method, r.URL, d.Round(time.Millisecond), reused, firstByte.Round(time.Millisecond))
			}
			return
		}
		up, err := dial(r.Context(), "tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer up.Close()
		hj, ok := w.(http.Hijacker)
		if !ok {
			http.Error(w, "no hijacking", http.StatusInternalServerError)
			return
		}
		c, buf, err := hj.Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
			return
		}
		if n := buf.Reader.Buffered(); n > 0 {
			b, _ := buf.Reader.Peek(n)
			if _, err := up.Write(b); err != nil {
				return
			}
		}
		done := make(chan struct{}, 2)
		go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
		go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
		<-done
	}))
}
