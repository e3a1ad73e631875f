package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	logFormat     string
	logLevel      zapcore.Level
}

func gatewayFlagSet(c *gatewayConfig, table, level *string, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("syncer gateway", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
	fs.StringVar(table, "table-secret", "", "Secret NAMESPACE/NAME the raysync controller publishes the gateway's table in (default $POD_NAMESPACE/raysync-gateway)")
	fs.StringVar(&c.dashboardAddr, "dashboard-addr", ":8265", "address serving the Jobs API and dashboard (HTTP) for every cluster")
	fs.StringVar(&c.clientAddr, "client-addr", ":10001", "address serving Ray Client (gRPC, HTTP/2 without TLS) for every cluster")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", "address serving /metrics (\"0\" disables)")
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz (\"0\" disables)")
	fs.StringVar(&c.clusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain (head Services are dialled as <service>.<namespace>.svc.<domain>)")
	fs.DurationVar(&c.drainDelay, "drain-delay", 5*time.Second, "on SIGTERM, how long /readyz fails before the servers stop accepting (endpoints drop the replica meanwhile)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "then how long requests in flight may finish")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or console")
	fs.StringVar(level, "log-level", "info", "debug, info, warn or error")
	if ns := getenv("POD_NAMESPACE"); ns != "" {
		*table = ns + "/raysync-gateway"
	}
	return fs
}

func parseGatewayFlags(args []string, getenv func(string) string) (*gatewayConfig, error) {
	c := &gatewayConfig{}
	var table, level string
	fs := gatewayFlagSet(c, &table, &level, getenv)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if table == "" {
		return nil, errors.New("--table-secret is required (or set $POD_NAMESPACE)")
	}
	n, err := parseNamespacedName("--table-secret", table)
	if err != nil {
		return nil, err
	}
	c.table = n
	if c.logFormat != "json" && c.logFormat != "console" {
		return nil, fmt.Errorf("--log-format %q: json or console", c.logFormat)
	}
	if err := c.logLevel.Set(level); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if c.drainDelay < 0 || c.drainTimeout < 0 {
		return nil, errors.New("--drain-delay and --drain-timeout must not be negative")
	}
	return c, nil
}

func runGateway(args []string, stderr io.Writer) int {
	cfg, err := parseGatewayFlags(args, os.Getenv)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stderr, `usage: syncer gateway [flags]

Serves the Jobs API and dashboard (8265) and Ray Client (10001) of every token-auth RayService and
RayCluster the raysync controller publishes a route for: clients address <name>-gw.<namespace> and
present any live canonical token (current, previous within its grace period, or pending); the
gateway forwards with the token the cluster runs on. It reads only the table Secret.

`)
		fs := gatewayFlagSet(&gatewayConfig{}, new(string), new(string), os.Getenv)
		fs.SetOutput(stderr)
		fs.PrintDefaults()
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "syncer gateway:", firstLine(err.Error()))
		return 2
	}
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
	m := metrics.NewGateway()
	gw := gateway.New(gateway.Options{ClusterDomain: cfg.clusterDomain, DashboardPort: 8265, ClientPort: 10001,
		Proxy: http.ProxyFromEnvironment, Log: log,
		Observe: func(p, r string, c gateway.Credential, s float64) { m.Observe(p, r, string(c), s) },
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
	dash := &http.Server{Handler: gw.Dashboard(), ReadHeaderTimeout: 10 * time.Second}
	client := &http.Server{Handler: gw.Client(), ReadHeaderTimeout: 10 * time.Second}
	client.Protocols = new(http.Protocols)
	client.Protocols.SetUnencryptedHTTP2(true)
	servers := []*http.Server{dash, client}
	errs := make(chan error, len(servers))
	for i, addr := range []string{cfg.dashboardAddr, cfg.clientAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		log.Info("serving", zap.String("addr", ln.Addr().String()), zap.String("protocol", []string{gateway.ProtoHTTP, gateway.ProtoGRPC}[i]))
		go func(s *http.Server) {
			if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}(servers[i])
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
