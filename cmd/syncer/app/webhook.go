package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"go.uber.org/zap"
	"golang.org/x/net/netutil"
	"k8s.io/client-go/kubernetes"

	"github.com/raysync/raysync/internal/admission"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/projection"
)

// startWebhook serves the admission webhook on every replica (its answers come from the caches and
// need no leadership), with a certificate from --webhook-cert-dir or one raysync issues and renews.
// ready reports whether it can complete a TLS handshake (the Service sends calls to ready pods only).
func startWebhook(ctx context.Context, cfg *config, kube kubernetes.Interface, ctrl *projection.Controller, m *metrics.Metrics, log *zap.Logger) (ready func() bool, err error) {
	ready = func() bool { return true }
	w := cfg.webhook
	if w.addr == "" {
		return ready, nil
	}
	if cfg.dryRun {
		log.Info("dry-run: not serving the admission webhook (it would change pods and Secrets)")
		return ready, nil
	}
	var getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	if w.certDir != "" {
		getCert = (&admission.DirCertificate{Dir: w.certDir, Metrics: m}).GetCertificate
	} else {
		cm := &admission.CertManager{Kube: kube, Secret: w.certSecret, Configuration: w.configuration, DNSNames: w.dnsNames, IPs: w.ips,
			Validity: w.certValidity, Metrics: m, Log: log}
		getCert = cm.GetCertificate
		go cm.Run(ctx, min(30*time.Second, w.certValidity/10))
	}
	ready = func() bool { c, err := getCert(nil); return err == nil && c != nil }
	ln, err := net.Listen("tcp", w.addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", w.addr, err)
	}
	srv := webhookServer(admission.Handler(ctrl.Admitter(), m, log), getCert)
	go func() {
		if err := srv.ServeTLS(netutil.LimitListener(ln, webhookMaxConnections), "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("webhook server stopped", zap.Error(err))
		}
	}()
	go func() {
		<-ctx.Done()
		time.Sleep(cfg.drainDelay) // endpoints drop this replica meanwhile: keep answering the API server
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("serving the admission webhook", zap.String("addr", ln.Addr().String()))
	return ready, nil
}

// webhookMaxConnections bounds the connections the webhook serves at once (more wait in the listen
// backlog): each costs its TLS buffers, ~40 KiB, whatever the client sends. The API server keeps a
// few per replica.
const webhookMaxConnections = 256

// webhookServer serves h over TLS 1.2+ and HTTP/1.1 only, as controller-runtime's webhook server does
// (HTTP/2 rapid reset, CVE-2023-44487); the API server then spreads concurrent calls over several
// connections (a 1,000-pod burst: p99 answer 13-19 -> 8.7 ms in BENCHMARKS.md). A request has 5 s for
// its headers and 10 s in all to be read (the handler gives its body admission.BodyTimeout once it has
// room), its answer 15 s (the API server waits at most the configuration's timeoutSeconds, 10 s at
// most by default); an idle connection is closed after 90 s.
func webhookServer(h http.Handler, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10*time.Second + admission.ReviewWait,
		WriteTimeout: 15*time.Second + admission.ReviewWait, IdleTimeout: 90 * time.Second, MaxHeaderBytes: 64 << 10,
		TLSConfig:    &tls.Config{GetCertificate: getCert, MinVersion: tls.VersionTLS12},
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){}}
}
