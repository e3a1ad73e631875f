package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"time"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/projection"
)

// config is the validated command line.
type config struct {
	kubeconfig       string
	authSource       types.NamespacedName
	authSourceKey    string
	namespaces       []string
	allNamespaces    bool
	clusterSelector  string
	leaderElect      bool
	leaderElectionNS string
	leaseDuration    time.Duration
	renewDeadline    time.Duration
	retryPeriod      time.Duration
	metricsAddr      string
	probeAddr        string
	qps              float64
	burst            int
	workers          int
	logFormat        string
	logLevel         zapcore.Level
	dryRun           bool

	pullSecrets    []types.NamespacedName
	autoscalerTLS  *types.NamespacedName
	apiServer      *projection.APIServer
	tlsMountPath   string
	recyclePending bool
	prune          bool
	allowRecreate  bool
}

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// rawFlags are flag values validated into config.
type rawFlags struct {
	authSource, namespaces, logLevel string
	pullSecrets                      listFlag
	autoscalerTLS, apiServer         string
}

func flagSet(c *config, r *rawFlags, getenv func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("syncer", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	authSource, namespaces, logLevel := &r.authSource, &r.namespaces, &r.logLevel
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
	fs.StringVar(authSource, "auth-source", "", "canonical token Secret, NAMESPACE/NAME (required)")
	fs.StringVar(&c.authSourceKey, "auth-source-key", "auth_token", "data key of the token in the source Secret")
	fs.StringVar(namespaces, "namespaces", "", "comma-separated namespaces to watch (or --all-namespaces)")
	fs.BoolVar(&c.allNamespaces, "all-namespaces", false, "watch RayClusters in every namespace")
	fs.StringVar(&c.clusterSelector, "cluster-selector", "", "label selector limiting the RayClusters raysync manages")
	fs.BoolVar(&c.leaderElect, "leader-elect", true, "run only while holding the Lease \"raysync\"")
	fs.StringVar(&c.leaderElectionNS, "leader-election-namespace", getenv("POD_NAMESPACE"), "namespace of the leader-election Lease (default $POD_NAMESPACE)")
	fs.DurationVar(&c.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long standbys wait before taking over a Lease that is not renewed")
	fs.DurationVar(&c.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it stops working")
	fs.DurationVar(&c.retryPeriod, "leader-election-retry-period", 2*time.Second, "interval between leader-election attempts")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", "address serving /metrics (\"0\" disables)")
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz (\"0\" disables)")
	fs.Float64Var(&c.qps, "kube-api-qps", 0, "client-side limit on API requests per second; 0 means none (API Priority and Fairness and --workers bound the load)")
	fs.IntVar(&c.burst, "kube-api-burst", 0, "client-side burst when --kube-api-qps is set (default 2 x qps)")
	fs.IntVar(&c.workers, "workers", 16, "concurrent reconciles")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or console")
	fs.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.dryRun, "dry-run", false, "compute and log every intended write; write nothing")
	fs.Var(&r.pullSecrets, "pull-secret", "registry Secret NAMESPACE/NAME every Ray pod lists in imagePullSecrets (repeatable)")
	fs.StringVar(&r.autoscalerTLS, "autoscaler-tls-secret", "", "client certificate Secret NAMESPACE/NAME (tls.crt, tls.key, optional ca.crt) for Ray's autoscaler")
	fs.StringVar(&r.apiServer, "autoscaler-api-server", "", "https://HOST[:PORT] the autoscaler uses to reach the Kubernetes API (optional)")
	fs.StringVar(&c.tlsMountPath, "autoscaler-tls-mount-path", projection.DefaultTLSMountPath, "where the autoscaler container mounts the client certificate")
	fs.BoolVar(&c.recyclePending, "recycle-pending-pods", true, "delete Ray pods that never started and lack raysync's entries, so KubeRay recreates them")
	fs.BoolVar(&c.prune, "prune", true, "delete raysync-managed copies no RayCluster references any more")
	fs.BoolVar(&c.allowRecreate, "allow-recreate", false, "patch templates of upgradeStrategy Recreate clusters even when that restarts running pods")
	return fs
}

// parseFlags parses and validates args (without the program name). Errors are one line.
func parseFlags(args []string, getenv func(string) string) (*config, error) {
	c := &config{}
	var r rawFlags
	fs := flagSet(c, &r, getenv)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%v", firstLine(err.Error()))
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	authSource, namespaces, logLevel := r.authSource, r.namespaces, r.logLevel
	r.apiServer = strings.TrimSpace(r.apiServer)

	var err error
	if c.authSource, err = parseNamespacedName("--auth-source", authSource); err != nil {
		return nil, err
	}
	if c.authSourceKey == "" || len(validation.IsConfigMapKey(c.authSourceKey)) > 0 {
		return nil, fmt.Errorf("--auth-source-key %q is not a valid Secret key", c.authSourceKey)
	}
	switch {
	case namespaces != "" && c.allNamespaces:
		return nil, errors.New("--namespaces and --all-namespaces are mutually exclusive")
	case namespaces == "" && !c.allNamespaces:
		return nil, errors.New("one of --namespaces or --all-namespaces is required (one token shared by every tenant should be a deliberate choice)")
	case namespaces != "":
		seen := map[string]bool{}
		for _, ns := range strings.Split(namespaces, ",") {
			ns = strings.TrimSpace(ns)
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return nil, fmt.Errorf("--namespaces: %q is not a valid namespace name", ns)
			}
			if !seen[ns] {
				seen[ns] = true
				c.namespaces = append(c.namespaces, ns)
			}
		}
	}
	if _, err := labels.Parse(c.clusterSelector); err != nil {
		return nil, fmt.Errorf("--cluster-selector: %v", firstLine(err.Error()))
	}
	if c.leaderElect {
		if c.leaderElectionNS == "" {
			return nil, errors.New("--leader-election-namespace (or $POD_NAMESPACE) is required with --leader-elect")
		}
		if errs := validation.IsDNS1123Label(c.leaderElectionNS); len(errs) > 0 {
			return nil, fmt.Errorf("--leader-election-namespace %q is not a valid namespace name", c.leaderElectionNS)
		}
		if c.retryPeriod <= 0 || c.renewDeadline <= c.retryPeriod || c.leaseDuration <= c.renewDeadline {
			return nil, errors.New("leader election needs 0 < retry-period < renew-deadline < lease-duration")
		}
	}
	if c.qps < 0 || c.burst < 0 {
		return nil, errors.New("--kube-api-qps and --kube-api-burst must not be negative")
	}
	if c.workers < 1 || c.workers > 1024 {
		return nil, fmt.Errorf("--workers must be between 1 and 1024, got %d", c.workers)
	}
	if c.logFormat != "json" && c.logFormat != "console" {
		return nil, fmt.Errorf("--log-format must be json or console, got %q", c.logFormat)
	}
	if err := c.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: unknown level %q", logLevel)
	}
	names := map[string]string{} // copies are named after their source: names must not collide
	for _, v := range r.pullSecrets {
		nn, err := parseNamespacedName("--pull-secret", v)
		if err != nil {
			return nil, err
		}
		if prev, dup := names[nn.Name]; dup {
			return nil, fmt.Errorf("--pull-secret %s: name %q already used by %s (copies are named after their source)", nn, nn.Name, prev)
		}
		names[nn.Name] = nn.String()
		c.pullSecrets = append(c.pullSecrets, nn)
	}
	if r.autoscalerTLS != "" {
		nn, err := parseNamespacedName("--autoscaler-tls-secret", r.autoscalerTLS)
		if err != nil {
			return nil, err
		}
		if prev, dup := names[nn.Name]; dup {
			return nil, fmt.Errorf("--autoscaler-tls-secret %s: name %q already used by %s (copies are named after their source)", nn, nn.Name, prev)
		}
		c.autoscalerTLS = &nn
	}
	if r.apiServer != "" {
		if c.autoscalerTLS == nil {
			return nil, errors.New("--autoscaler-api-server needs --autoscaler-tls-secret")
		}
		api, err := projection.ParseAPIServer(r.apiServer)
		if err != nil {
			return nil, fmt.Errorf("--autoscaler-api-server: %v", err)
		}
		c.apiServer = &api
	}
	if !path.IsAbs(c.tlsMountPath) || path.Clean(c.tlsMountPath) != c.tlsMountPath || c.tlsMountPath == "/" || strings.Contains(c.tlsMountPath, ":") {
		return nil, fmt.Errorf("--autoscaler-tls-mount-path %q must be a clean absolute path", c.tlsMountPath)
	}
	return c, nil
}

func parseNamespacedName(flagName, v string) (types.NamespacedName, error) {
	if v == "" {
		return types.NamespacedName{}, fmt.Errorf("%s is required (NAMESPACE/NAME)", flagName)
	}
	ns, name, ok := strings.Cut(v, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return types.NamespacedName{}, fmt.Errorf("%s %q is not NAMESPACE/NAME", flagName, v)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// usage prints the commands and flags for --help.
func usage(w io.Writer) {
	fmt.Fprint(w, `usage: syncer --auth-source=NAMESPACE/NAME (--namespaces=a,b | --all-namespaces) [flags]
       syncer status [-o table|json] --auth-source=NAMESPACE/NAME (--namespaces=a,b | --all-namespaces) [flags]

syncer keeps every in-scope RayCluster's auth token equal to the canonical Secret (and pull secrets and
the autoscaler's client certificate on Ray pods). "syncer status" reports, read-only, whether every
cluster is in sync (exit 0 in sync, 1 not, 2 error); "syncer status --help" lists its options.

flags:
`)
	fs := flagSet(&config{}, &rawFlags{}, os.Getenv)
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// projection is the controller's configuration.
func (c *config) projection() projection.Config {
	pc := projection.Config{Source: c.authSource, SourceKey: c.authSourceKey, Prune: c.prune,
		Pods: projection.PodOptions{
			PullSecrets: c.pullSecrets, AutoscalerTLS: c.autoscalerTLS, APIServer: c.apiServer,
			MountPath: c.tlsMountPath, RecyclePending: c.recyclePending, AllowRecreate: c.allowRecreate,
		}}
	if c.clusterSelector != "" {
		pc.ClusterSelector, _ = labels.Parse(c.clusterSelector) // validated by parseFlags
	}
	return pc
}

// informer is what raysync watches: the namespaces, and every source by name.
func (c *config) informer() informer.Config {
	return informer.Config{Namespaces: c.namespaces, Sources: c.projection().Sources()}
}
