package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/metrics"
)

const gatewayCommand = "gateway"

// gatewayConfig is `syncer gateway`'s: it reads one Secret (the table raysync publishes) and nothing
// else, so it takes none of the controller's flags.
type gatewayConfig struct {
	kubeconfig    string
	table         types.NamespacedName
	dashboardAddr string
	clientAddr    string
	metricsAddr   string
	probeAddr     string
	clusterDomain string
	drainDelay    time.Duration
	drainTimeout  time.Duration
	refusals      time.Duration
	limits        gateway.Limits
	logFormat     string
	logLevel      zapcore.Level
}

// gatewayFlags are the gateway's flag values validated into gatewayConfig.
type gatewayFlags struct{ table, logLevel string }

// addGatewayFlags defines `syncer gateway`'s flags on fs.
func addGatewayFlags(fs *pflag.FlagSet, c *gatewayConfig, r *gatewayFlags, getenv func(string) string) {
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
	fs.StringVar(&r.table, "table-secret", "", "Secret NAMESPACE/NAME the raysync controller publishes the gateway's table in (default $POD_NAMESPACE/raysync-gateway)")
	fs.StringVar(&c.dashboardAddr, "dashboard-addr", ":8265", "address serving the Jobs API and dashboard (HTTP) for every cluster")
	fs.StringVar(&c.clientAddr, "client-addr", ":10001", "address serving Ray Client (gRPC, HTTP/2 without TLS) for every cluster")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", "address serving /metrics (\"0\" disables)")
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz (\"0\" disables)")
	fs.StringVar(&c.clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain (head Services are dialled as <service>.<namespace>.svc.<domain>)")
	fs.DurationVar(&c.drainDelay, "drain-delay", 5*time.Second, "on SIGTERM, how long /readyz fails before the servers stop accepting (endpoints drop the replica meanwhile)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "then how long requests in flight may finish")
	d := gateway.DefaultLimits()
	c.limits = d
	fs.IntVar(&c.limits.MaxConnections, "max-connections", d.MaxConnections, "most client connections served at once on each port; more are refused at once")
	fs.DurationVar(&c.limits.HeaderTimeout, "header-timeout", d.HeaderTimeout, "how long a client has to send a request's headers (Ray Client: its connection preface)")
	fs.DurationVar(&c.limits.BodyTimeout, "body-timeout", d.BodyTimeout, "how long an authenticated client has to send a forwarded request's body (a job's package: up to 100 MiB)")
	fs.DurationVar(&c.limits.IdleTimeout, "idle-timeout", d.IdleTimeout, "a client connection with nothing in flight is closed after this")
	fs.DurationVar(&c.limits.WriteTimeout, "write-timeout", d.WriteTimeout, "each write to a Ray Client connection must complete within this: a client that stops reading is cut off")
	fs.IntVar(&c.limits.MaxStreams, "max-streams", d.MaxStreams, "most streams one Ray Client connection has open at once; more are refused (REFUSED_STREAM)")
	fs.DurationVar(&c.refusals, "refusal-summary", 30*time.Second, "at most this often, log at info which callers were refused for want of an accepted token (address, host, protocol, result, count; never what they presented)")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or console")
	fs.StringVar(&r.logLevel, "log-level", "info", "debug, info, warn or error")
	if ns := getenv("POD_NAMESPACE"); ns != "" {
		r.table = ns + "/raysync-gateway"
	}
}

func (c *gatewayConfig) validate(r *gatewayFlags) error {
	if r.table == "" {
		return errors.New("--table-secret is required (or set $POD_NAMESPACE)")
	}
	n, err := parseNamespacedName("--table-secret", r.table)
	if err != nil {
		return err
	}
	c.table = n
	if c.logFormat != "json" && c.logFormat != "console" {
		return fmt.Errorf("--log-format %q: json or console", c.logFormat)
	}
	if err := c.logLevel.Set(r.logLevel); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	if c.drainDelay < 0 || c.drainTimeout < 0 {
		return errors.New("--drain-delay and --drain-timeout must not be negative")
	}
	if c.refusals < time.Second {
		return errors.New("--refusal-summary must be at least 1s")
	}
	if l := c.limits; l.MaxConnections < 1 || l.HeaderTimeout <= 0 || l.BodyTimeout <= 0 || l.IdleTimeout <= 0 || l.WriteTimeout <= 0 || l.MaxStreams < 1 {
		return errors.New("--max-connections, --max-streams, --header-timeout, --body-timeout, --idle-timeout and --write-timeout must be positive")
	}
	return nil
}

// runGateway is `syncer gateway` with its validated flags: it serves until SIGTERM (exit 0) or fails (1).
func runGateway(cfg *gatewayConfig, stderr io.Writer) int {
	log, err := newLogger(&config{logFormat: cfg.logFormat, logLevel: cfg.logLevel})
	if err != nil {
		fmt.Fprintln(stderr, "syncer gateway:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := serveGateway(ctx, cfg, log); err != nil {
		log.Error("exiting", zap.Error(err))
		return 1
	}
	return 0
}

func serveGateway(ctx context.Context, cfg *gatewayConfig, log *zap.Logger) error {
	rc, err := restConfig(&config{kubeconfig: cfg.kubeconfig})
	if err != nil {
		return err
	}
	rc.UserAgent = "raysync-gateway"
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if w := proxyWarning(http.ProxyFromEnvironment, cfg.clusterDomain); w != "" {
		log.Warn(w)
	}
	m := metrics.NewGateway()
	gw := gateway.New(gateway.Options{ClusterDomain: cfg.clusterDomain, DashboardPort: 8265, ClientPort: 10001,
		Proxy: http.ProxyFromEnvironment, Log: log, Limits: cfg.limits, RefusalSummary: cfg.refusals,
		Observe: func(p, r string, c gateway.Credential, s float64) { m.Observe(p, r, string(c), s) },
		Done:    func(_ string, c gateway.Credential) { m.Done(string(c)) },
		UpstreamAuthFailure: func(p string) {
			m.UpstreamAuthFailures.WithLabelValues(p).Inc()
			log.Error("a cluster refused the token the gateway forwarded with", zap.String("protocol", p))
		}})

	// One Secret, by name: the gateway can read no other.
	lw := cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "secrets", cfg.table.Namespace,
		fields.OneTermEqualSelector("metadata.name", cfg.table.Name))
	inf := cache.NewSharedIndexInformer(lw, &corev1.Secret{}, 0, cache.Indexers{})
	load := func(obj any) {
		s, ok := obj.(*corev1.Secret)
		if !ok {
			return
		}
		t, err := gateway.Decode(s.Data[gateway.TableKey])
		if err != nil {
			m.TableValid.Set(0)
			log.Error("gateway table unusable: keeping the last good one", zap.String("secret", cfg.table.String()), zap.Error(err))
			return
		}
		gw.SetTable(t)
		m.TableValid.Set(1)
		m.Routes.Set(float64(len(t.Routes)))
		log.Debug("gateway table loaded", zap.Int("routes", len(t.Routes)), zap.Int("accepted", len(t.Accept)))
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: load, UpdateFunc: func(_, o any) { load(o) },
		DeleteFunc: func(any) {
			m.TableValid.Set(0)
			log.Error("gateway table Secret deleted: keeping the last good table", zap.String("secret", cfg.table.String()))
		}}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())

	var draining atomic.Bool
	ready := func() bool { return inf.HasSynced() && gw.Ready() && !draining.Load() }
	stopMetrics, err := serve(log, cfg.metricsAddr, "/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	if err != nil {
		return err
	}
	defer stopMetrics()
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, "no gateway table yet, or draining", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	stopProbes, err := serve(log, cfg.probeAddr, "/", probes)
	if err != nil {
		return err
	}
	defer stopProbes()
	servers := []interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
	}{gw.DashboardServer(), gw.ClientServer()}
	errs := make(chan error, len(servers))
	for i, addr := range []string{cfg.dashboardAddr, cfg.clientAddr} {
		protocol, refusal := gateway.ProtoHTTP, gateway.HTTPRefusal
		if i == 1 {
			protocol, refusal = gateway.ProtoGRPC, nil
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		ln := gateway.LimitConnections(l, cfg.limits.MaxConnections, refusal)
		open, refused := m.Connections.WithLabelValues(protocol), m.ConnectionsRefused.WithLabelValues(protocol)
		ln.Opened, ln.Closed, ln.Refused = open.Inc, open.Dec, refused.Inc
		log.Info("serving", zap.String("addr", l.Addr().String()), zap.String("protocol", protocol))
		go func() {
			if err := servers[i].Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, gateway.ErrServerClosed) {
				errs <- err
			}
		}()
	}
	log.Info("starting the raysync gateway", zap.String("table", cfg.table.String()))
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	// Drain: fail readiness first so endpoints drop this replica, then let requests in flight end.
	draining.Store(true)
	log.Info("draining", zap.Duration("delay", cfg.drainDelay), zap.Duration("timeout", cfg.drainTimeout))
	time.Sleep(cfg.drainDelay)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.drainTimeout)
	defer cancel()
	for _, s := range servers {
		_ = s.Shutdown(sctx)
	}
	return nil
}

// proxyWarning says why the proxy settings would hand cluster tokens to a proxy: the gateway adds a
// cluster's token to every request it forwards, so with HTTP_PROXY set and NO_PROXY not covering the
// heads' Service names, every token goes through the proxy ("" when it would not).
func proxyWarning(proxy func(*http.Request) (*url.URL, error), clusterDomain string) string {
	head := &http.Request{URL: &url.URL{Scheme: "http", Host: "ray-head-svc.default.svc." + clusterDomain + ":8265"}}
	u, err := proxy(head)
	if err != nil || u == nil {
		return ""
	}
	return fmt.Sprintf("HTTP_PROXY is set and NO_PROXY does not cover .svc.%s: the gateway would send requests for the heads, each with "+
		"its cluster's token, through the proxy %s://%s; add .svc,.svc.%s to NO_PROXY unless that proxy is meant to see them", clusterDomain, u.Scheme, u.Host, clusterDomain)
}
