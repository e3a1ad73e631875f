package main

// Scenario gateway: what the gateway costs a caller. Latency at a paced 1,000 requests/s on loopback
// against calling the upstream directly; the `syncer gateway` process's peak RSS with a table of 10
// and of 1,000 routed clusters under that load; Ray Client (gRPC over h2c, one bidirectional
// stream) throughput through the gateway against direct.

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/gateway"
)

type gatewayResult struct {
	Rate           int     `json:"requests_per_second"`
	Seconds        int     `json:"seconds_each"`
	DirectP50Ms    float64 `json:"direct_p50_ms"`
	DirectP99Ms    float64 `json:"direct_p99_ms"`
	BareP50Ms      float64 `json:"bare_proxy_p50_ms"`
	BareP99Ms      float64 `json:"bare_proxy_p99_ms"`
	GatewayP50Ms   float64 `json:"gateway_p50_ms"`
	GatewayP99Ms   float64 `json:"gateway_p99_ms"`
	OverheadP50Ms  float64 `json:"overhead_p50_ms"`
	OverheadP99Ms  float64 `json:"overhead_p99_ms"`
	RSS10MiB       float64 `json:"peak_rss_10_routes_mib"`
	RSS1000MiB     float64 `json:"peak_rss_1000_routes_mib"`
	GRPCDirectMBs  float64 `json:"grpc_direct_mb_per_s"`
	GRPCGatewayMBs float64 `json:"grpc_gateway_mb_per_s"`
	// The same stream through a bare TCP relay (io.Copy both ways): what any hop costs here.
	GRPCRelayMBs float64 `json:"grpc_tcp_relay_mb_per_s"`
	// Pipelined: the client keeps sending while it reads the echoes (a bulk transfer).
	GRPCDirectPipelinedMBs  float64 `json:"grpc_direct_pipelined_mb_per_s"`
	GRPCGatewayPipelinedMBs float64 `json:"grpc_gateway_pipelined_mb_per_s"`
	GRPCRelayPipelinedMBs   float64 `json:"grpc_tcp_relay_pipelined_mb_per_s"`
}

const gatewayToken = "bench-client-token-0123456789abcdef"

var clusterTok = []byte("bench-cluster-token-0123456789abcdef")

// benchTable routes n RayClusters c0…c(n-1) in namespace ns, all on one cluster token.
func benchTable(ns string, n int) *gateway.Table {
	t := &gateway.Table{Accept: []gateway.Accepted{{Credential: gateway.Current, SHA256: gateway.Digest([]byte(gatewayToken))}},
		Tokens: map[string][]byte{"t": clusterTok}, Routes: map[string]gateway.Route{}}
	for i := range n {
		name := fmt.Sprintf("c%d", i)
		t.Routes[ns+"/"+name] = gateway.Route{Kind: "RayCluster", Cluster: name, Service: name + "-head-svc", Token: "t"}
	}
	return t
}

// upstream is a head's Jobs API stand-in: 200 for the cluster token, a small JSON body.
func upstream() (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+string(clusterTok) {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, `{"jobs": []}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { srv.Close() }
}

// paced sends rate requests per second for d, each on its own schedule (open loop), and returns the
// latencies in milliseconds.
func paced(rate int, d time.Duration, mk func() *http.Request, c *http.Client) []float64 {
	interval := time.Second / time.Duration(rate)
	n := int(d / interval)
	lat := make([]float64, n)
	done := make(chan struct{}, n)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * interval)))
		go func() {
			t0 := time.Now()
			resp, err := c.Do(mk())
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err != nil || resp.StatusCode != 200 {
				check(fmt.Errorf("gateway bench: a call failed: %v", err))
			}
			lat[i] = float64(time.Since(t0).Microseconds()) / 1000
			done <- struct{}{}
		}()
	}
	for range n {
		<-done
	}
	sort.Float64s(lat)
	return lat
}

func (b *bench) gatewayBench(rate int, each time.Duration) gatewayResult {
	r := gatewayResult{Rate: rate, Seconds: int(each.Seconds())}
	up, stopUp := upstream()
	defer stopUp()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

	// Latency: the gateway's own code, in process, in front of the same upstream.
	gAddr, stopG := serveLocal(gatewayDialing(up, b.ns).Dashboard(), false)
	defer stopG()
	mkDirect := func() *http.Request {
		req, _ := http.NewRequest("GET", "http://"+up+"/api/jobs/", nil)
		req.Header.Set("Authorization", "Bearer "+string(clusterTok))
		return req
	}
	mkGateway := func(addr string) func() *http.Request {
		return func() *http.Request {
			req, _ := http.NewRequest("GET", "http://"+addr+"/api/jobs/", nil)
			req.Host = "c1-gw." + b.ns + ".svc.cluster.local:8265"
			req.Header.Set("Authorization", "Bearer "+gatewayToken)
			return req
		}
	}
	// The control: a bare Go reverse proxy (no table, no token check or rewrite) with the same
	// transport settings: what one more loopback hop costs on this machine, whoever makes it.
	upURL, _ := url.Parse("http://" + up)
	bare := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(upURL) },
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	bAddr, stopBare := serveLocal(bare, false)
	defer stopBare()
	mkBare := func() *http.Request {
		req, _ := http.NewRequest("GET", "http://"+bAddr+"/api/jobs/", nil)
		req.Header.Set("Authorization", "Bearer "+string(clusterTok))
		return req
	}
	paced(rate, 2*time.Second, mkDirect, client) // warm every path
	paced(rate, 2*time.Second, mkBare, client)
	paced(rate, 2*time.Second, mkGateway(gAddr), client)
	var d, bp, gw []float64
	for range 2 { // interleaved halves, so drift of the machine hits all three alike
		d = append(d, paced(rate, each/2, mkDirect, client)...)
		bp = append(bp, paced(rate, each/2, mkBare, client)...)
		gw = append(gw, paced(rate, each/2, mkGateway(gAddr), client)...)
	}
	for _, l := range [][]float64{d, bp, gw} {
		sort.Float64s(l)
	}
	r.DirectP50Ms, r.DirectP99Ms, r.GatewayP50Ms, r.GatewayP99Ms = pct(d, 50), pct(d, 99), pct(gw, 50), pct(gw, 99)
	r.BareP50Ms, r.BareP99Ms = pct(bp, 50), pct(bp, 99)
	r.OverheadP50Ms, r.OverheadP99Ms = r.GatewayP50Ms-r.DirectP50Ms, r.GatewayP99Ms-r.DirectP99Ms

	// RSS: the gateway process with a table of 10 and of 1,000 routes, under the same load. It dials
	// heads through an HTTP proxy (as in the e2e suite) that sends every request to the upstream.
	proxyAddr, stopProxy := forwardTo(up)
	defer stopProxy()
	rc, err := clientcmd.BuildConfigFromFlags("", b.cp.Kubeconfig)
	check(err)
	kube, err := kubernetes.NewForConfig(rc)
	check(err)
	_, _ = kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{})
	for _, n := range []int{10, 1000} {
		enc, err := benchTable(b.ns, n).Encode()
		check(err)
		name := fmt.Sprintf("gateway-%d", n)
		_, err = kube.CoreV1().Secrets(b.ns).Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name},
			Data: map[string][]byte{gateway.TableKey: enc}}, metav1.CreateOptions{})
		check(err)
		dash, err := framework.FreePort()
		check(err)
		probe, err := framework.FreePort()
		check(err)
		cmd := exec.Command(b.bin, "gateway", "--kubeconfig="+b.cp.Kubeconfig, "--table-secret="+b.ns+"/"+name,
			fmt.Sprintf("--dashboard-addr=127.0.0.1:%d", dash), "--client-addr=127.0.0.1:0", "--metrics-bind-address=0",
			fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe), "--log-level=warn", "--drain-delay=0s")
		cmd.Env = append(os.Environ(), "HTTP_PROXY=http://"+proxyAddr, "NO_PROXY=127.0.0.1,localhost")
		cmd.Stderr = os.Stderr
		p := startProc(cmd, fmt.Sprintf("http://127.0.0.1:%d/readyz", probe), "")
		paced(rate, each, mkGateway(fmt.Sprintf("127.0.0.1:%d", dash)), client)
		if n == 10 {
			r.RSS10MiB = p.peakRSSMiB()
		} else {
			r.RSS1000MiB = p.peakRSSMiB()
		}
		p.stop()
	}

	// Ray Client: one bidirectional stream of 64 KiB messages, echoed by the upstream: each message
	// after the previous echo (latency-bound), then pipelined; direct, through the gateway's relay and
	// through a bare TCP relay. In halves, interleaved.
	echo, stopEcho := h2cEcho()
	defer stopEcho()
	cAddr, stopC := serveClient(gatewayDialing(echo, b.ns))
	defer stopC()
	rAddr, stopR := tcpRelay(echo)
	defer stopR()
	authority := "c1-gw." + b.ns + ":10001"
	for range 2 {
		r.GRPCDirectMBs += streamMBs(echo, authority, "Bearer "+string(clusterTok), each/4) / 2
		r.GRPCGatewayMBs += streamMBs(cAddr, authority, "Bearer "+gatewayToken, each/4) / 2
		r.GRPCRelayMBs += streamMBs(rAddr, authority, "Bearer "+string(clusterTok), each/4) / 2
		r.GRPCDirectPipelinedMBs += pipelinedMBs(echo, authority, "Bearer "+string(clusterTok), each/4) / 2
		r.GRPCGatewayPipelinedMBs += pipelinedMBs(cAddr, authority, "Bearer "+gatewayToken, each/4) / 2
		r.GRPCRelayPipelinedMBs += pipelinedMBs(rAddr, authority, "Bearer "+string(clusterTok), each/4) / 2
	}
	return r
}

// tcpRelay copies bytes both ways between each connection and addr: a hop that does nothing else.
func tcpRelay(addr string) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", addr)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String(), func() { ln.Close() }
}

// pipelinedMBs sends 64 KiB messages on one stream as fast as it can while reading the echoes, and
// returns the echoed megabytes per second over d.
func pipelinedMBs(addr, authority, auth string, d time.Duration) float64 {
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "http://"+addr+"/ray.rpc.RayletDriver/Datapath", pr)
	req.Host = authority
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("Authorization", auth)
	msg := make([]byte, 5+64<<10)
	binary.BigEndian.PutUint32(msg[1:5], 64<<10)
	_, _ = rand.Read(msg[5:])
	stop := make(chan struct{})
	go func() {
		defer pw.Close()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := pw.Write(msg); err != nil {
				return
			}
		}
	}()
	resp, err := tr.RoundTrip(req)
	check(err)
	defer resp.Body.Close()
	buf := make([]byte, 256<<10)
	var n int64
	start := time.Now()
	for time.Since(start) < d {
		k, err := resp.Body.Read(buf)
		n += int64(k)
		if err != nil {
			check(fmt.Errorf("gateway bench: pipelined stream: %w", err))
		}
	}
	elapsed := time.Since(start)
	close(stop)
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	return float64(n) / elapsed.Seconds() / 1e6
}

// forwardTo is an HTTP forward proxy sending every request to addr.
func forwardTo(addr string) (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	tr := &http.Transport{MaxIdleConnsPerHost: 256}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		out := r.Clone(r.Context())
		out.URL = &url.URL{Scheme: "http", Host: addr, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
		out.RequestURI = ""
		resp, err := tr.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { srv.Close() }
}

// h2cEcho echoes gRPC-framed messages on one stream, as a Ray Client server would answer them.
func h2cEcho() (string, func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/grpc")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		buf := make([]byte, 64<<10+5)
		for {
			if _, err := io.ReadFull(r.Body, buf[:5]); err != nil {
				break
			}
			n := binary.BigEndian.Uint32(buf[1:5])
			if _, err := io.ReadFull(r.Body, buf[5:5+n]); err != nil {
				break
			}
			_, _ = w.Write(buf[:5+n])
			w.(http.Flusher).Flush()
		}
		w.Header().Set(http.TrailerPrefix+"Grpc-Status", "0")
	})}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { srv.Close() }
}

// streamMBs sends 64 KiB messages on one stream for d, each after the previous echo, and returns the
// echoed megabytes per second.
func streamMBs(addr, authority, auth string, d time.Duration) float64 {
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	defer tr.CloseIdleConnections()
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", "http://"+addr+"/ray.rpc.RayletDriver/Datapath", pr)
	req.Host = authority
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("Authorization", auth)
	msg := make([]byte, 5+64<<10)
	binary.BigEndian.PutUint32(msg[1:5], 64<<10)
	_, _ = rand.Read(msg[5:])
	respc := make(chan *http.Response, 1)
	go func() {
		resp, err := tr.RoundTrip(req)
		check(err)
		respc <- resp
	}()
	_, err := pw.Write(msg)
	check(err)
	resp := <-respc
	defer resp.Body.Close()
	buf := make([]byte, len(msg))
	var bytes int64
	start := time.Now()
	for time.Since(start) < d {
		_, err := io.ReadFull(resp.Body, buf)
		check(err)
		bytes += int64(len(buf))
		_, err = pw.Write(msg)
		check(err)
	}
	pw.Close()
	return float64(bytes) / time.Since(start).Seconds() / 1e6
}

// gatewayDialing is the gateway's code in process with a table of 10 clusters, every head dialled at addr.
func gatewayDialing(addr, ns string) *gateway.Gateway {
	g := gateway.New(gateway.Options{DashboardPort: 8265, ClientPort: 10001,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	g.SetTable(benchTable(ns, 10))
	return g
}

// serveClient serves g's Ray Client relay on a loopback port and returns its address.
func serveClient(g *gateway.Gateway) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	srv := g.ClientServer()
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { srv.Close() }
}

// serveLocal serves h on a loopback port (HTTP/2 without TLS when h2c) and returns its address.
func serveLocal(h http.Handler, h2c bool) (addr string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	srv := &http.Server{Handler: h}
	if h2c {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	go func() { _ = srv.Serve(ln) }()
	return ln.Addr().String(), func() { srv.Close() }
}

func printGateway(r *gatewayResult) {
	if r == nil {
		return
	}
	fmt.Printf("\n| gateway, %d requests/s on loopback, %d s each | p50 | p99 |\n|---|---|---|\n", r.Rate, r.Seconds)
	fmt.Printf("| direct to the upstream | %.3f ms | %.3f ms |\n| through a bare Go reverse proxy (the cost of a hop) | %.3f ms | %.3f ms |\n| through the gateway | %.3f ms | %.3f ms |\n| overhead (goal: p50 ≤ +0.1 ms, p99 ≤ +1 ms) | %+.3f ms | %+.3f ms |\n| overhead over the bare proxy (the gateway's own work) | %+.3f ms | %+.3f ms |\n",
		r.DirectP50Ms, r.DirectP99Ms, r.BareP50Ms, r.BareP99Ms, r.GatewayP50Ms, r.GatewayP99Ms, r.OverheadP50Ms, r.OverheadP99Ms,
		r.GatewayP50Ms-r.BareP50Ms, r.GatewayP99Ms-r.BareP99Ms)
	fmt.Printf("\n| gateway process | |\n|---|---|\n| peak RSS, table of 10 clusters, under load | %.1f MiB |\n| peak RSS, table of 1,000 clusters, under load | %.1f MiB |\n", r.RSS10MiB, r.RSS1000MiB)
	fmt.Printf("\n| Ray Client stream, 64 KiB messages echoed | direct | through the gateway | gateway / direct (goal ≥ 90%%) | through a bare TCP relay | relay / direct |\n|---|---|---|---|---|---|\n")
	for _, row := range []struct {
		name              string
		direct, gw, relay float64
	}{{"each after the previous echo", r.GRPCDirectMBs, r.GRPCGatewayMBs, r.GRPCRelayMBs},
		{"pipelined", r.GRPCDirectPipelinedMBs, r.GRPCGatewayPipelinedMBs, r.GRPCRelayPipelinedMBs}} {
		fmt.Printf("| %s | %.0f MB/s | %.0f MB/s | %.0f%% | %.0f MB/s | %.0f%% |\n", row.name, row.direct, row.gw, 100*row.gw/row.direct, row.relay, 100*row.relay/row.direct)
	}
	fmt.Printf("\n| dashboard p50, gateway / bare Go reverse proxy (goal ≤ 1.05) | %.2f |\n", r.GatewayP50Ms/r.BareP50Ms)
}
