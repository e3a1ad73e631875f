// Command standin is the local control plane's kubelet and Ray stand-in (package e2e/standin): it
// runs the pods of Ray clusters on one emulated Node, with emulated Ray inside, and serves an HTTP
// proxy for the KubeRay operator plus a read-only JSON endpoint. framework.Start runs it; it
// listens on loopback only and never dials anything but the API server.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/raysync/raysync/e2e/standin"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "sandbox" {
		os.Exit(standin.RunSandbox(os.Args[2])) // one real container (see standin.SandboxSpec)
	}
	var cfg standin.Config
	kubeconfig := flag.String("kubeconfig", "", "admin kubeconfig of the control plane")
	keyFile := flag.String("fingerprint-key", "", "file holding the key that token fingerprints are HMACs under")
	apiAddr := flag.String("api", "127.0.0.1:0", "loopback address of the read-only JSON endpoint")
	operatorProxy := flag.String("operator-proxy", "127.0.0.1:0", "loopback address of the HTTP proxy for the KubeRay operator")
	clientProxy := flag.String("client-proxy", "127.0.0.1:0", "loopback address of the HTTP proxy for everyone else")
	flag.StringVar(&cfg.NodeName, "node-name", "standin", "name of the Node pods are bound to")
	flag.DurationVar(&cfg.StartDelay, "start-delay", 300*time.Millisecond, "from a pod's creation to its containers' creation (scheduling and image pull)")
	flag.DurationVar(&cfg.Backoff, "backoff", 10*time.Second, "kubelet restart back-off base (doubles up to 30x)")
	flag.DurationVar(&cfg.GCSRetry, "gcs-retry", 5*time.Second, "wait-gcs-ready's polling period")
	flag.DurationVar(&cfg.JoinTimeout, "join-timeout", 30*time.Second, "how long a worker's raylet waits for a head that is not up")
	flag.DurationVar(&cfg.ServeDeployDelay, "serve-deploy-delay", time.Second, "how long a Serve application stays DEPLOYING")
	flag.DurationVar(&cfg.JobPending, "job-pending", 200*time.Millisecond, "how long a Ray job stays PENDING")
	flag.DurationVar(&cfg.JobDuration, "job-duration", 2*time.Second, "how long a Ray job runs before it SUCCEEDS")
	flag.StringVar(&cfg.PrivateRegistry, "private-registry", "registry.example.internal", "registry whose images need pull credentials")
	flag.StringVar(&cfg.Real.Venv, "ray-venv", "", "Ray's virtualenv: pods of namespaces annotated "+standin.AnnotationRay+"=real run real Ray from it (needs root)")
	flag.StringVar(&cfg.Real.Dir, "pod-dir", "", "where real pods keep their volumes, files and logs (with -ray-venv)")
	verbose := flag.Bool("v", false, "log every request the proxies could not route")
	flag.Parse()
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, *kubeconfig, *keyFile, map[string]string{"api": *apiAddr, "operator": *operatorProxy, "client": *clientProxy}, log); err != nil {
		fmt.Fprintln(os.Stderr, "standin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg standin.Config, kubeconfig, keyFile string, addrs map[string]string, log *slog.Logger) error {
	fp, err := standin.LoadFingerprinter(keyFile)
	if err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = -1, 0 // a kubelet for hundreds of pods on a local API server
	rc.UserAgent = "raysync-standin"
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if cfg.Real.Venv != "" {
		if cfg.Real.Self, err = os.Executable(); err != nil {
			return err
		}
		u, err := url.Parse(rc.Host)
		if err != nil {
			return err
		}
		cfg.Real.APIServer = u.Host
	}
	factory := informers.NewSharedInformerFactory(kube, 0)
	k, err := standin.NewKubelet(cfg, kube, factory, fp, log)
	if err != nil {
		return err
	}
	defer k.Close()
	if err := k.RegisterNode(ctx); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("informer for %v never synced", typ)
		}
	}
	servers := map[string]http.Handler{"api": k.APIHandler(), "operator": k.Proxy(standin.CallerOperator), "client": k.Proxy(standin.CallerClient)}
	errs := make(chan error, len(servers))
	for name, h := range servers {
		addr := addrs[name]
		if host, _, err := net.SplitHostPort(addr); err != nil || !strings.HasPrefix(host, "127.") {
			return fmt.Errorf("-%s %q: listen on a loopback address only", name, addr)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("%s listener: %w", name, err)
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() { errs <- srv.Serve(l) }()
		go func() { <-ctx.Done(); _ = srv.Close() }()
		log.Info("listening", "server", name, "addr", l.Addr().String())
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-errs:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
