package app

import (
	"errors"
	"fmt"
	"net"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
	"github.com/raysync/raysync/internal/projection"
	"github.com/raysync/raysync/internal/validate"
)

// config is the validated command line.
type config struct {
	// name names this install's own objects: the Lease, the rotation ledger (<name>-rotations), the
	// webhook's certificate Secret (<name>-webhook-tls) and configuration. Two installs in one
	// namespace need two names.
	name             string
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
	// drainDelay: on SIGTERM, how long /readyz says 503 (and the webhook keeps answering) before exit.
	drainDelay time.Duration

	pullSecrets    []types.NamespacedName
	autoscalerTLS  *types.NamespacedName
	apiServer      *validate.APIServer
	tlsMountPath   string
	recyclePending bool
	prune          bool
	allowRecreate  bool

	rotationLedger        types.NamespacedName
	control               types.NamespacedName
	rotationPolicies      map[names.OwnerKind]string
	maxConcurrentRotation int
	rotationTimeout       time.Duration

	noPrecreate bool
	webhook     webhookConfig
	gateway     projection.GatewayOptions

	// oneShot: a one-shot command (status, rotate, uninstall, revoke-previous), not the controller.
	oneShot bool

	// Subcommands' own flags.
	output string // status: table or json
	all    bool   // rotate: every cluster behind; adopt: every cluster in scope
	// adopt: the namespaces adopted as a whole; pause: why
	adoptNamespaces []string
	reason          string
	yes             bool // uninstall: do it (default: only say what it would do)
}

// webhookConfig is the admission webhook's part of the command line (addr "": no webhook).
type webhookConfig struct {
	addr          string
	certSecret    types.NamespacedName
	certDir       string
	configuration string
	dnsNames      []string
	ips           []net.IP
	certValidity  time.Duration
}

// rawFlags are flag values validated into config.
type rawFlags struct {
	authSource, namespaces, logLevel string
	pullSecrets                      []string
	autoscalerTLS, apiServer         string
	ledger                           string
	control                          string
	policyService, policyCluster     string
	policyJob                        string
	webhookCertSecret, webhookDNS    string
	webhookIPs                       string
	precreate                        bool
	gatewayTable                     string
}

// kuberayTLSPath is where KubeRay v1.7's mTLS (feature gate RayClusterMTLS) mounts Ray's own TLS; its
// validation refuses any other mount there (kuberay-facts.md).
const kuberayTLSPath = "/etc/ray/tls"

// The one-shot commands: each takes the syncer's flags that matter to it (all but controllerOnly's),
// plus its own.
const (
	statusCommand    = "status"
	rotateCommand    = "rotate"
	uninstallCommand = "uninstall"
)

// controllerOnly are the controller's flags that configure only what the controller serves or does:
// its servers, leader election, workers, logs, the webhook, pruning. A one-shot command does not take
// them (they would change nothing, and raysync never accepts and ignores a flag), but for those
// listed with the flag.
var controllerOnly = map[string][]string{
	"leader-elect":                   nil,
	"leader-election-lease-duration": {uninstallCommand}, // a Lease not renewed for twice that: raysync stopped
	"leader-election-renew-deadline": nil,
	"leader-election-retry-period":   nil,
	"metrics-bind-address":           nil,
	"health-probe-bind-address":      nil,
	"drain-delay":                    nil,
	"workers":                        nil,
	"log-format":                     nil,
	"log-level":                      nil,
	"prune":                          nil,
	"webhook-addr":                   nil,
	"webhook-cert-dir":               nil,
	"webhook-cert-secret":            {uninstallCommand}, // the certificate Secret it deletes
	"webhook-configuration":          nil,
	"webhook-dns-names":              nil,
	"webhook-ips":                    nil,
	"webhook-cert-validity":          nil,
	"dry-run":                        {rotateCommand, revokeCommand, uninstallCommand, adoptCommand, pauseCommand, resumeCommand}, // status writes nothing anyway
}

// takes says whether command ("" the controller) takes the syncer's flag.
func takes(command, flag string) bool {
	only, ok := controllerOnly[flag]
	return command == "" || !ok || slices.Contains(only, command)
}

// addSyncerFlags defines on fs the syncer's flags that command ("" the controller) takes.
func addSyncerFlags(fs *pflag.FlagSet, command string, c *config, r *rawFlags, getenv func(string) string) {
	all := pflag.NewFlagSet("syncer", pflag.ContinueOnError)
	defineSyncerFlags(all, c, r, getenv)
	all.VisitAll(func(f *pflag.Flag) {
		if takes(command, f.Name) {
			fs.AddFlag(f)
		}
	})
}

func defineSyncerFlags(fs *pflag.FlagSet, c *config, r *rawFlags, getenv func(string) string) {
	fs.StringVar(&c.name, "name", "raysync", "this install's name: its Lease, rotation ledger (<name>-rotations), webhook certificate Secret (<name>-webhook-tls) and webhook configuration; installs side by side in one namespace need different names (the chart passes its name value, by default its fullname)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config, else $KUBECONFIG)")
	fs.StringVar(&r.authSource, "auth-source", "", "canonical token Secret, NAMESPACE/NAME (required)")
	fs.StringVar(&c.authSourceKey, "auth-source-key", "auth_token", "data key of the token in the source Secret (external secret managers often write token)")
	fs.StringVar(&r.namespaces, "namespaces", "", "comma-separated namespaces to watch (or --all-namespaces)")
	fs.BoolVar(&c.allNamespaces, "all-namespaces", false, "watch RayClusters in every namespace")
	fs.StringVar(&c.clusterSelector, "cluster-selector", "", "label selector limiting the RayClusters raysync manages")
	fs.BoolVar(&c.leaderElect, "leader-elect", true, "run only while holding the Lease named --name")
	fs.StringVar(&c.leaderElectionNS, "leader-election-namespace", getenv("POD_NAMESPACE"), "raysync's own namespace: its Lease, rotation ledger and webhook certificate (default $POD_NAMESPACE)")
	fs.StringVarP(&c.leaderElectionNS, "namespace", "n", getenv("POD_NAMESPACE"), "the same as --leader-election-namespace")
	fs.DurationVar(&c.leaseDuration, "leader-election-lease-duration", 15*time.Second, "how long standbys wait before taking over a Lease that is not renewed")
	fs.DurationVar(&c.renewDeadline, "leader-election-renew-deadline", 10*time.Second, "how long the leader keeps trying to renew before it stops working")
	fs.DurationVar(&c.retryPeriod, "leader-election-retry-period", 2*time.Second, "interval between leader-election attempts")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", "address serving /metrics (\"0\" disables)")
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address serving /healthz and /readyz, ready once the caches have synced and while the API server answers, standbys too (\"0\" disables)")
	fs.DurationVar(&c.drainDelay, "drain-delay", 0, "on SIGTERM, how long /readyz answers 503 (and the webhook keeps answering) before raysync exits; the Lease is released at once, /healthz and /metrics answer to the end (the chart: drainDelay, 5s)")
	fs.Float64Var(&c.qps, "kube-api-qps", 0, "client-side limit on API requests per second; 0 means none (API Priority and Fairness and --workers bound the load)")
	fs.IntVar(&c.burst, "kube-api-burst", 0, "client-side burst when --kube-api-qps is set (default 2 x qps)")
	fs.IntVar(&c.workers, "workers", 16, "concurrent reconciles")
	fs.StringVar(&c.logFormat, "log-format", "json", "json or console")
	fs.StringVar(&r.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.dryRun, "dry-run", false, "compute and log every intended write and Event; write nothing (every API request but a read is refused inside the process, and no Lease is taken); rotate, revoke-previous and uninstall say what they would do")
	fs.StringArrayVar(&r.pullSecrets, "pull-secret", nil, "registry Secret NAMESPACE/NAME every Ray pod lists in imagePullSecrets (repeatable)")
	fs.StringVar(&r.autoscalerTLS, "autoscaler-tls-secret", "", "client certificate Secret NAMESPACE/NAME (tls.crt, tls.key, optional ca.crt) for Ray's autoscaler")
	fs.StringVar(&r.apiServer, "autoscaler-api-server", "", "https://HOST[:PORT] the autoscaler uses to reach the Kubernetes API (optional)")
	fs.StringVar(&c.tlsMountPath, "autoscaler-tls-mount-path", podtemplate.DefaultTLSMountPath, "where the autoscaler container mounts the client certificate")
	fs.BoolVar(&c.recyclePending, "recycle-pending-pods", true, "delete Ray pods that never started and lack raysync's entries, so KubeRay recreates them")
	fs.BoolVar(&c.prune, "prune", true, "delete raysync-managed copies no RayCluster references any more")
	fs.BoolVar(&c.allowRecreate, "allow-recreate", false, "patch templates of upgradeStrategy Recreate clusters even when that restarts running pods")
	fs.StringVar(&r.control, "control", "", "ConfigMap NAMESPACE/NAME an operator pauses the wave (paused: \"true\") and adopts namespaces (adopt: \"all\" or namespaces) with; raysync reads it, never writes it (default <raysync's namespace, else the source's>/<name>-control; \"-\": none)")
	fs.StringVar(&r.ledger, "rotation-ledger", "", "Secret NAMESPACE/NAME numbering the canonical tokens raysync has seen (default <raysync's namespace, else the source's>/<name>-rotations)")
	fs.StringVar(&r.policyService, "rotation-policy-rayservice", projection.DefaultPolicies[names.OwnerRayService], "how a RayService's running cluster moves to a new token: replace, restart, hold or gateway (gateway: only with --gateway-table); the annotation raysync.dev/rotation on an object overrides")
	fs.StringVar(&r.policyCluster, "rotation-policy-raycluster", projection.DefaultPolicies[""], "the same for a standalone RayCluster")
	fs.StringVar(&r.policyJob, "rotation-policy-rayjob", projection.DefaultPolicies[names.OwnerRayJob], "the same for a RayJob's cluster (never while its job runs)")
	fs.IntVar(&c.maxConcurrentRotation, "max-concurrent-rotations", projection.DefaultMaxConcurrentRotations, "replacements and restarts in flight at most")
	fs.DurationVar(&c.rotationTimeout, "rotation-timeout", 30*time.Minute, "a replacement or restart not done by then blocks the wave (0: never)")
	fs.BoolVar(&r.precreate, "precreate-auth-secrets", true, "create a new cluster's generated auth Secret with the canonical token before KubeRay does (false: leave it to KubeRay and the webhook)")
	fs.StringVar(&c.webhook.addr, "webhook-addr", "", "address serving the mutating admission webhook over HTTPS, e.g. :9443 (\"\": no webhook; the chart: :9443)")
	fs.StringVar(&r.webhookCertSecret, "webhook-cert-secret", "", "Secret NAMESPACE/NAME where raysync keeps the webhook's CA and serving certificate (default <raysync's namespace, else the source's>/<name>-webhook-tls)")
	fs.StringVar(&c.webhook.certDir, "webhook-cert-dir", "", "serve tls.crt and tls.key from this directory (e.g. cert-manager's) instead of a certificate raysync issues")
	fs.StringVar(&c.webhook.configuration, "webhook-configuration", "", "MutatingWebhookConfiguration whose caBundle raysync keeps current (default --name; \"-\": none)")
	fs.StringVar(&r.webhookDNS, "webhook-dns-names", "", "comma-separated DNS names of the webhook's Service, for the certificate raysync issues")
	fs.StringVar(&r.webhookIPs, "webhook-ips", "", "comma-separated IP addresses for the certificate raysync issues (a URL webhook, e.g. 127.0.0.1 in tests)")
	fs.DurationVar(&c.webhook.certValidity, "webhook-cert-validity", 90*24*time.Hour, "lifetime of the serving certificate raysync issues (renewed a third of it ahead)")
	fs.StringVar(&r.gatewayTable, "gateway-table", "", "publish the gateway's table into this Secret NAMESPACE/NAME (\"\": no gateway; the chart: <name>-gateway)")
	fs.StringVar(&c.gateway.Service, "gateway-service", "", "the gateway Service's DNS name: every RayService and RayCluster gets an ExternalName Service <name>-gw pointing at it")
	fs.DurationVar(&c.gateway.Grace, "gateway-grace", 24*time.Hour, "how long the previous canonical token is still accepted after a rotation (0: not at all)")
	fs.StringVar(&c.gateway.PendingKey, "gateway-pending-key", "", "key of the canonical Secret holding the next token, accepted by the gateway before it becomes current")
}

// noIneffectiveFlags refuses a flag of the controller given a value (other than its default) that
// would change nothing, because what it configures is off: raysync never accepts and ignores a flag.
// (The one-shot commands do not take the controller's own flags at all: controllerOnly.)
func (c *config) noIneffectiveFlags(fs *pflag.FlagSet) error {
	webhookOff := c.webhook.addr == ""
	certManager := c.webhook.certDir != ""
	podsOff := len(c.pullSecrets) == 0 && c.autoscalerTLS == nil
	rules := map[string]struct {
		off  bool
		when string
	}{
		"webhook-cert-dir":               {webhookOff, "without --webhook-addr"},
		"webhook-cert-secret":            {webhookOff || certManager, "without --webhook-addr, or with --webhook-cert-dir"},
		"webhook-dns-names":              {webhookOff || certManager, "without --webhook-addr, or with --webhook-cert-dir"},
		"webhook-ips":                    {webhookOff || certManager, "without --webhook-addr, or with --webhook-cert-dir"},
		"webhook-cert-validity":          {webhookOff || certManager, "without --webhook-addr, or with --webhook-cert-dir"},
		"webhook-configuration":          {webhookOff || certManager, "without --webhook-addr, or with --webhook-cert-dir (cert-manager injects the caBundle)"},
		"gateway-grace":                  {c.gateway.Table.Name == "", "without --gateway-table"},
		"autoscaler-tls-mount-path":      {c.autoscalerTLS == nil, "without --autoscaler-tls-secret"},
		"recycle-pending-pods":           {podsOff, "without --pull-secret or --autoscaler-tls-secret"},
		"allow-recreate":                 {podsOff, "without --pull-secret or --autoscaler-tls-secret"},
		"leader-election-lease-duration": {!c.leaderElect || c.dryRun, "with --leader-elect=false or --dry-run"},
		"leader-election-renew-deadline": {!c.leaderElect || c.dryRun, "with --leader-elect=false or --dry-run"},
		"leader-election-retry-period":   {!c.leaderElect || c.dryRun, "with --leader-elect=false or --dry-run"},
		"kube-api-burst":                 {c.qps == 0, "without --kube-api-qps"},
	}
	var err error
	fs.Visit(func(f *pflag.Flag) {
		if r, ok := rules[f.Name]; ok && r.off && f.Value.String() != f.DefValue && err == nil {
			err = fmt.Errorf("--%s=%s has no effect %s: remove it (raysync never accepts and ignores a flag)", f.Name, f.Value, r.when)
		}
	})
	return err
}

func (c *config) validate(r *rawFlags) error {
	authSource, namespaces, logLevel := r.authSource, r.namespaces, r.logLevel
	r.apiServer = strings.TrimSpace(r.apiServer)
	if errs := validation.IsDNS1123Label(c.name); len(errs) > 0 || len(c.name) > 40 {
		return fmt.Errorf("--name %q must be a DNS label of at most 40 characters (it names raysync's objects)", c.name)
	}

	var err error
	if c.authSource, err = parseNamespacedName("--auth-source", authSource); err != nil {
		return err
	}
	if c.authSourceKey == "" || len(validation.IsConfigMapKey(c.authSourceKey)) > 0 {
		return fmt.Errorf("--auth-source-key %q is not a valid Secret key", c.authSourceKey)
	}
	switch {
	case namespaces != "" && c.allNamespaces:
		return errors.New("--namespaces and --all-namespaces are mutually exclusive")
	case namespaces == "" && !c.allNamespaces:
		return errors.New("one of --namespaces or --all-namespaces is required (one token shared by every tenant should be a deliberate choice)")
	case namespaces != "":
		seen := map[string]bool{}
		for _, ns := range strings.Split(namespaces, ",") {
			ns = strings.TrimSpace(ns)
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return fmt.Errorf("--namespaces: %q is not a valid namespace name", ns)
			}
			if !seen[ns] {
				seen[ns] = true
				c.namespaces = append(c.namespaces, ns)
			}
		}
	}
	if _, err := labels.Parse(c.clusterSelector); err != nil {
		return fmt.Errorf("--cluster-selector: %v", firstLine(err.Error()))
	}
	if c.leaderElectionNS != "" && len(validation.IsDNS1123Label(c.leaderElectionNS)) > 0 {
		return fmt.Errorf("--namespace %q is not a valid namespace name", c.leaderElectionNS)
	}
	if c.leaderElect {
		if c.leaderElectionNS == "" {
			return errors.New("--leader-election-namespace (or $POD_NAMESPACE) is required with --leader-elect")
		}
		if errs := validation.IsDNS1123Label(c.leaderElectionNS); len(errs) > 0 {
			return fmt.Errorf("--leader-election-namespace %q is not a valid namespace name", c.leaderElectionNS)
		}
		if c.retryPeriod <= 0 || c.renewDeadline <= c.retryPeriod || c.leaseDuration <= c.renewDeadline {
			return errors.New("leader election needs 0 < retry-period < renew-deadline < lease-duration")
		}
	}
	if c.qps < 0 || c.burst < 0 {
		return errors.New("--kube-api-qps and --kube-api-burst must not be negative")
	}
	if c.workers < 1 || c.workers > 1024 {
		return fmt.Errorf("--workers must be between 1 and 1024, got %d", c.workers)
	}
	if c.logFormat != "json" && c.logFormat != "console" {
		return fmt.Errorf("--log-format must be json or console, got %q", c.logFormat)
	}
	if err := c.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: unknown level %q", logLevel)
	}
	copyNames := map[string]string{} // copies are named after their source: names must not collide
	for _, v := range r.pullSecrets {
		nn, err := parseNamespacedName("--pull-secret", v)
		if err != nil {
			return err
		}
		if prev, dup := copyNames[nn.Name]; dup {
			return fmt.Errorf("--pull-secret %s: name %q already used by %s (copies are named after their source)", nn, nn.Name, prev)
		}
		copyNames[nn.Name] = nn.String()
		c.pullSecrets = append(c.pullSecrets, nn)
	}
	if r.autoscalerTLS != "" {
		nn, err := parseNamespacedName("--autoscaler-tls-secret", r.autoscalerTLS)
		if err != nil {
			return err
		}
		if prev, dup := copyNames[nn.Name]; dup {
			return fmt.Errorf("--autoscaler-tls-secret %s: name %q already used by %s (copies are named after their source)", nn, nn.Name, prev)
		}
		c.autoscalerTLS = &nn
	}
	if r.apiServer != "" {
		if c.autoscalerTLS == nil {
			return errors.New("--autoscaler-api-server needs --autoscaler-tls-secret")
		}
		api, err := validate.ParseAPIServer(r.apiServer)
		if err != nil {
			return fmt.Errorf("--autoscaler-api-server: %v", err)
		}
		c.apiServer = &api
	}
	if r.gatewayTable != "" {
		if c.gateway.Table, err = parseNamespacedName("--gateway-table", r.gatewayTable); err != nil {
			return err
		}
	}
	if c.gateway.Service != "" && (c.gateway.Table.Name == "" || len(validation.IsDNS1123Subdomain(c.gateway.Service)) > 0) {
		return fmt.Errorf("--gateway-service %q needs --gateway-table and must be a DNS name", c.gateway.Service)
	}
	if c.gateway.Grace < 0 {
		return errors.New("--gateway-grace must not be negative")
	}
	if k := c.gateway.PendingKey; k != "" && (len(validation.IsConfigMapKey(k)) > 0 || k == c.authSourceKey || c.gateway.Table.Name == "") {
		return fmt.Errorf("--gateway-pending-key %q needs --gateway-table and must be a Secret key other than --auth-source-key", k)
	}
	c.rotationPolicies = map[names.OwnerKind]string{}
	for kind, v := range map[names.OwnerKind]string{names.OwnerRayService: r.policyService, "": r.policyCluster, names.OwnerRayJob: r.policyJob} {
		switch {
		case v == names.PolicyGateway && c.gateway.Table.Name == "":
			return errors.New("rotation policy gateway needs --gateway-table (clients must reach the clusters through the gateway)")
		case v != names.PolicyReplace && v != names.PolicyRestart && v != names.PolicyHold && v != names.PolicyGateway:
			return fmt.Errorf("rotation policy %q: want replace, restart, hold or gateway", v)
		case kind == names.OwnerRayService && v == names.PolicyRestart:
			return errors.New("--rotation-policy-rayservice=restart cannot take effect (a RayService's cluster moves only by its zero-downtime replacement; KubeRay v1.6 also puts spec.suspend back): want replace, hold or gateway")
		case kind == "" && v == names.PolicyReplace:
			return errors.New("--rotation-policy-raycluster=replace cannot take effect (only a RayService replaces its cluster): want restart, hold or gateway")
		case kind == names.OwnerRayJob && v == names.PolicyReplace:
			return errors.New("--rotation-policy-rayjob=replace cannot take effect (only a RayService replaces its cluster): want restart, hold or gateway")
		}
		c.rotationPolicies[kind] = v
	}
	if c.maxConcurrentRotation < 1 {
		return fmt.Errorf("--max-concurrent-rotations must be at least 1, got %d", c.maxConcurrentRotation)
	}
	if c.rotationTimeout < 0 {
		return errors.New("--rotation-timeout must not be negative")
	}
	switch {
	case r.ledger != "":
		if c.rotationLedger, err = parseNamespacedName("--rotation-ledger", r.ledger); err != nil {
			return err
		}
	case c.leaderElectionNS != "":
		c.rotationLedger = types.NamespacedName{Namespace: c.leaderElectionNS, Name: c.name + "-rotations"}
	default:
		c.rotationLedger = types.NamespacedName{Namespace: c.authSource.Namespace, Name: c.name + "-rotations"}
	}
	switch {
	case r.control == "-":
	case r.control != "":
		if c.control, err = parseNamespacedName("--control", r.control); err != nil {
			return err
		}
	case c.leaderElectionNS != "":
		c.control = types.NamespacedName{Namespace: c.leaderElectionNS, Name: c.name + "-control"}
	default:
		c.control = types.NamespacedName{Namespace: c.authSource.Namespace, Name: c.name + "-control"}
	}
	c.noPrecreate = !r.precreate
	if err := c.webhook.parse(r, c); err != nil {
		return err
	}
	if err := c.distinctRoles(); err != nil {
		return err
	}
	if c.drainDelay < 0 {
		return errors.New("--drain-delay must not be negative")
	}
	if !path.IsAbs(c.tlsMountPath) || path.Clean(c.tlsMountPath) != c.tlsMountPath || c.tlsMountPath == "/" || strings.Contains(c.tlsMountPath, ":") {
		return fmt.Errorf("--autoscaler-tls-mount-path %q must be a clean absolute path", c.tlsMountPath)
	}
	if c.tlsMountPath == kuberayTLSPath || strings.HasPrefix(c.tlsMountPath, kuberayTLSPath+"/") || strings.HasPrefix(kuberayTLSPath, c.tlsMountPath+"/") {
		return fmt.Errorf("--autoscaler-tls-mount-path %q overlaps %s, which KubeRay v1.7's mTLS (gate RayClusterMTLS) reserves: KubeRay would refuse the cluster", c.tlsMountPath, kuberayTLSPath)
	}
	return nil
}

// secretRole is one Secret the flags give raysync a role for.
type secretRole struct {
	flag string // the flag naming it ("--pull-secret"), or what it is ("a copy of --pull-secret p/x")
	name types.NamespacedName
}

// distinctRoles refuses two roles naming one Secret: raysync reads some (the sources) and writes the
// others (the ledger, the table, the webhook certificate, the copies of pod sources in the watched
// namespaces), so one Secret in two roles is erased or overwritten (the ledger naming the canonical
// source replaced its token with rotation numbers).
func (c *config) distinctRoles() error {
	roles := []secretRole{{"--auth-source", c.authSource}}
	var podSources []secretRole
	for _, n := range c.pullSecrets {
		podSources = append(podSources, secretRole{"--pull-secret", n})
	}
	if c.autoscalerTLS != nil {
		podSources = append(podSources, secretRole{"--autoscaler-tls-secret", *c.autoscalerTLS})
	}
	roles = append(roles, podSources...)
	roles = append(roles, secretRole{"--rotation-ledger", c.rotationLedger})
	if c.gateway.Table.Name != "" {
		roles = append(roles, secretRole{"--gateway-table", c.gateway.Table})
	}
	if c.webhook.certSecret.Name != "" {
		roles = append(roles, secretRole{"--webhook-cert-secret", c.webhook.certSecret})
	}
	for i, a := range roles {
		for _, b := range roles[:i] {
			if a.name == b.name {
				return fmt.Errorf("%s %s is also %s: each role needs a Secret of its own (raysync would overwrite it)", a.flag, a.name, b.flag)
			}
		}
	}
	// A pod source is copied, under its name, into every watched namespace but its own.
	watched := func(ns string) bool { return c.allNamespaces || slices.Contains(c.namespaces, ns) }
	for _, src := range podSources {
		for _, other := range roles {
			if other.name.Name == src.name.Name && other.name.Namespace != src.name.Namespace && watched(other.name.Namespace) {
				return fmt.Errorf("%s %s is copied as %s into the watched namespace %s, where it is %s: each role needs a Secret of its own (raysync would overwrite it)",
					src.flag, src.name, src.name.Name, other.name.Namespace, other.flag)
			}
		}
	}
	return nil
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

func (w *webhookConfig) parse(r *rawFlags, c *config) error {
	switch w.configuration {
	case "":
		w.configuration = c.name
	case "-":
		w.configuration = ""
	}
	if w.addr == "" {
		if c.oneShot && r.webhookCertSecret != "" { // uninstall: where the certificate Secret it deletes is
			var err error
			w.certSecret, err = parseNamespacedName("--webhook-cert-secret", r.webhookCertSecret)
			return err
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(w.addr); err != nil {
		return fmt.Errorf("--webhook-addr %q: %v", w.addr, err)
	}
	if w.certDir != "" {
		return nil // cert-manager (or another) issues the certificate and injects the caBundle
	}
	var err error
	switch {
	case r.webhookCertSecret != "":
		if w.certSecret, err = parseNamespacedName("--webhook-cert-secret", r.webhookCertSecret); err != nil {
			return err
		}
	case c.leaderElectionNS != "":
		w.certSecret = types.NamespacedName{Namespace: c.leaderElectionNS, Name: c.name + "-webhook-tls"}
	default:
		w.certSecret = types.NamespacedName{Namespace: c.authSource.Namespace, Name: c.name + "-webhook-tls"}
	}
	for _, d := range strings.Split(r.webhookDNS, ",") {
		if d = strings.TrimSpace(d); d != "" {
			if len(validation.IsDNS1123Subdomain(d)) > 0 {
				return fmt.Errorf("--webhook-dns-names: %q is not a DNS name", d)
			}
			w.dnsNames = append(w.dnsNames, d)
		}
	}
	for _, v := range strings.Split(r.webhookIPs, ",") {
		if v = strings.TrimSpace(v); v != "" {
			ip := net.ParseIP(v)
			if ip == nil {
				return fmt.Errorf("--webhook-ips: %q is not an IP address", v)
			}
			w.ips = append(w.ips, ip)
		}
	}
	if len(w.dnsNames) == 0 && len(w.ips) == 0 {
		return errors.New("--webhook-addr with a certificate raysync issues needs --webhook-dns-names or --webhook-ips (or --webhook-cert-dir)")
	}
	if w.certValidity < time.Minute {
		return fmt.Errorf("--webhook-cert-validity must be at least 1m, got %s", w.certValidity)
	}
	return nil
}

// projection is the controller's configuration.
func (c *config) projection() projection.Config {
	pc := projection.Config{Source: c.authSource, SourceKey: c.authSourceKey, Prune: c.prune,
		Pods: projection.PodOptions{
			PullSecrets: c.pullSecrets, AutoscalerTLS: c.autoscalerTLS, APIServer: c.apiServer,
			MountPath: c.tlsMountPath, RecyclePending: c.recyclePending, AllowRecreate: c.allowRecreate,
		},
		Rotation:    projection.RotationOptions{Policies: c.rotationPolicies, MaxConcurrent: c.maxConcurrentRotation, Timeout: c.rotationTimeout},
		Ledger:      c.rotationLedger,
		NoPrecreate: c.noPrecreate,
		Gateway:     c.gateway,
		Control:     c.control,
	}
	if c.clusterSelector != "" {
		pc.ClusterSelector, _ = labels.Parse(c.clusterSelector) // validated by parseFlags
	}
	return pc
}

// informer is what raysync watches: the namespaces, every source, the ledger and (the controller) the
// gateway's table by name.
func (c *config) informer() informer.Config {
	w := c.projection().Watches(c.namespaces)
	if c.oneShot {
		w.Table = types.NamespacedName{} // reports read no cluster token: the table is the controller's to keep
	}
	return w
}
