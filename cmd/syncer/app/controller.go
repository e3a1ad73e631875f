// Package app is the syncer command (cmd/syncer): raysync keeps every in-scope RayCluster's auth token
// equal to one canonical Secret, next to the stock KubeRay operator. This package does the command
// line (command.go), signals, clients, caches, servers and leader election; the work is in
// internal/projection. It is a package of its own so that tools/docgen reads the command tree.
package app

import (
	"context"
	"errors"
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
	"golang.org/x/net/netutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

// runController is the controller with its validated flags: it runs until SIGTERM (exit 0) or fails (1).
func runController(cfg *config, stderr io.Writer) int {
	log, err := newLogger(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "syncer:", err)
		return 2
	}
	defer func() { _ = log.Sync() }()
	klog.SetLogger(zapr.NewLogger(log.Named("client-go")))
	stopProfile, err := startCPUProfile(os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "syncer:", err)
		return 2
	}
	defer stopProfile()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("exiting", zap.Error(err))
		return 1
	}
	return 0
}

func newLogger(cfg *config) (*zap.Logger, error) {
	zc := zap.NewProductionConfig()
	if cfg.logFormat == "console" {
		zc = zap.NewDevelopmentConfig()
		zc.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	}
	zc.EncoderConfig.TimeKey = "ts"
	zc.EncoderConfig.EncodeTime = zapcore.RFC3339NanoTimeEncoder
	zc.Level = zap.NewAtomicLevelAt(cfg.logLevel)
	zc.Sampling = nil
	zc.DisableStacktrace = true // errors carry their context; stack traces only bury it
	return zc.Build()
}

func restConfig(cfg *config) (*rest.Config, error) {
	var rc *rest.Config
	var err error
	switch {
	case cfg.kubeconfig != "":
		rc, err = clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	default:
		rc, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
				clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{}).ClientConfig()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.UserAgent = "raysync"
	if cfg.dryRun {
		rc.Wrap(func(next http.RoundTripper) http.RoundTripper { return readOnlyTransport{next: next} })
	}
	if cfg.qps == 0 {
		rc.QPS = -1 // no client-side throttle: APF on the server and --workers bound the load
	} else {
		rc.QPS = float32(cfg.qps)
		rc.Burst = cfg.burst
		if rc.Burst == 0 {
			rc.Burst = int(2 * cfg.qps)
		}
	}
	return rc, nil
}

// readOnlyTransport carries a --dry-run's API calls: a request that could change anything is refused
// before it leaves the process, so no code path of a dry run can write.
type readOnlyTransport struct{ next http.RoundTripper }

func (t readOnlyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return t.next.RoundTrip(r)
	}
	if r.Body != nil {
		_ = r.Body.Close()
	}
	return nil, fmt.Errorf("--dry-run: refused %s %s (a dry run writes nothing)", r.Method, r.URL.Path)
}

// kubeClient is the typed client the one-shot commands use.
func kubeClient(cfg *config) (kubernetes.Interface, error) {
	rc, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(rc)
}

func run(ctx context.Context, cfg *config, log *zap.Logger) error {
	rc, err := restConfig(cfg)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	md, err := metadata.NewForConfig(rc)
	if err != nil {
		return err
	}

	pcfg := cfg.projection()
	caches := informer.New(kube, dyn, md, cfg.informer())
	recorder, stopEvents := eventRecorder(kube, cfg.dryRun, log)
	defer stopEvents()

	var ctrl *projection.Controller
	var leading atomic.Bool
	// Cluster state comes from the leader only (standbys keep raysync_leader 0, process and webhook
	// metrics): with several replicas nothing counts twice.
	m := metrics.New(func() metrics.Snapshot {
		if !leading.Load() {
			return metrics.Snapshot{Standby: true}
		}
		return ctrl.Snapshot()
	})
	if ctrl, err = projection.New(kube, dyn, caches, recorder, m, log, pcfg, cfg.dryRun); err != nil {
		return err
	}

	var elector *leaderelection.LeaderElector
	healthz := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	stopMetrics, err := serve(log, cfg.metricsAddr, "/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	if err != nil {
		return err
	}
	defer stopMetrics()
	webhookReady, err := startWebhook(ctx, cfg, kube, ctrl, m, log)
	if err != nil {
		return err
	}
	probes := http.NewServeMux()
	probes.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := healthz.Check(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	probes.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ctx.Err() != nil {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		if !caches.HasSynced() {
			http.Error(w, "caches not synced", http.StatusServiceUnavailable)
			return
		}
		if !webhookReady() {
			http.Error(w, "no webhook serving certificate yet", http.StatusServiceUnavailable)
			return
		}
		// Watches cannot make progress while the API server is unreachable: say so.
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if _, err := kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
			http.Error(w, "API server unreachable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	stopProbes, err := serve(log, cfg.probeAddr, "/", probes)
	if err != nil {
		return err
	}
	defer stopProbes()
	// On SIGTERM: /readyz says 503 at once (endpoints drop this replica; the webhook keeps answering
	// meanwhile), the work stops and the Lease is released; the process, its probes and its metrics
	// last until the drain delay is over.
	drained := make(chan struct{})
	go func() {
		<-ctx.Done()
		log.Info("draining", zap.Duration("delay", cfg.drainDelay))
		time.Sleep(cfg.drainDelay)
		close(drained)
	}()
	defer func() {
		if ctx.Err() != nil {
			<-drained
		}
	}()

	log.Info("starting raysync", zap.String("version", releaseVersion()), zap.String("source", cfg.authSource.String()), zap.String("scope", cfg.informer().String()),
		zap.String("clusterSelector", cfg.clusterSelector),
		zap.Bool("leaderElect", cfg.leaderElect), zap.Bool("dryRun", cfg.dryRun), zap.Int("workers", cfg.workers))
	caches.Start(ctx.Done())
	// Every replica syncs its caches, so standbys are ready and take over with warm caches.
	go func() {
		if caches.WaitForSync(ctx.Done()) {
			log.Info("caches synced")
		}
	}()

	if !cfg.leaderElect || cfg.dryRun { // a dry run takes no Lease: it writes nothing, and keeps no one from leading
		m.Leader.Set(1)
		leading.Store(true)
		return ctrl.Run(ctx, cfg.workers)
	}
	id, _ := os.Hostname()
	id = id + "_" + string(uuid.NewUUID())
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1ObjectMeta(cfg.name, cfg.leaderElectionNS),
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
		// raysync's mark: `syncer uninstall` deletes only a Lease that is raysync's
		Labels: map[string]string{names.ManagedByLabel: names.ManagedByValue},
	}
	lost := make(chan struct{})
	elector, err = leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   cfg.leaseDuration,
		RenewDeadline:   cfg.renewDeadline,
		RetryPeriod:     cfg.retryPeriod,
		ReleaseOnCancel: true,
		Name:            cfg.name,
		WatchDog:        healthz,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("acquired leadership", zap.String("identity", id))
				m.Leader.Set(1)
				leading.Store(true)
				if err := ctrl.Run(ctx, cfg.workers); err != nil {
					log.Error("controller stopped", zap.Error(err))
				}
			},
			OnStoppedLeading: func() { m.Leader.Set(0); leading.Store(false); close(lost) },
			OnNewLeader: func(identity string) {
				if identity != id {
					log.Info("standing by", zap.String("leader", identity))
				}
			},
		},
	})
	if err != nil {
		return err
	}
	elector.Run(ctx)
	<-lost
	if ctx.Err() != nil {
		log.Info("shut down; leadership released")
		return nil
	}
	// Losing the lease means another replica may already be writing: stop at once.
	return errors.New("lost leadership")
}

func eventRecorder(kube kubernetes.Interface, dryRun bool, log *zap.Logger) (record.EventRecorder, func()) {
	if dryRun {
		return logRecorder{log: log}, func() {}
	}
	sink := &typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")}
	return newShardedRecorder(eventShards, func() (record.EventRecorder, func()) {
		b := record.NewBroadcaster()
		b.StartRecordingToSink(sink)
		return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "raysync"}), b.Shutdown
	})
}

// plainMaxConnections bounds the connections the metrics and probe servers serve at once (more wait in
// the listen backlog): a scraper and a kubelet keep one or two each.
const plainMaxConnections = 64

// plainServer is the metrics or probe server's: nothing it serves reads a body, so a request has 5 s
// for its headers and 10 s in all, its answer 30 s (a scrape of a large fleet), and an idle connection
// is closed after 2 minutes.
func plainServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
}

// serve runs an HTTP server on addr ("0" or "": none) for the life of the process, not of its signal
// context: the probe and metrics servers keep answering through a drain (readiness 503, liveness 200,
// metrics scrapeable to the end). The returned stop, called as the process exits, stops accepting and
// lets requests in flight finish (at most 5 s).
func serve(log *zap.Logger, addr, pattern string, h http.Handler) (stop func(), err error) {
	if addr == "0" || addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle(pattern, h)
	srv := plainServer(mux)
	go func() {
		if err := srv.Serve(netutil.LimitListener(ln, plainMaxConnections)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("server stopped", zap.String("addr", addr), zap.Error(err))
		}
	}()
	log.Info("serving", zap.String("addr", ln.Addr().String()), zap.String("path", pattern))
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}
