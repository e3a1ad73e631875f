package framework

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// The harness's addresses all sit in 198.18.0.0/15 (RFC 2544's benchmarking range, which no real
// network routes), never in the private ranges a developer's own network may use: Services in the upper
// half of 198.18.0.0/16, the stand-in's pods in 198.19.0.0/16.
const (
	ServiceCIDR = "198.18.128.0/17"
	// KubernetesServiceIP is the ClusterIP of the `kubernetes` Service, the first of ServiceCIDR.
	KubernetesServiceIP = "198.18.128.1"
)

// Options choose what Start runs.
type Options struct {
	// KubeRayVersion is the operator release to run: v1.5.1 or v1.6.1.
	KubeRayVersion string
	// Dir holds PKI, data, logs and the pid file. Empty means a fresh temporary directory.
	Dir string
	// Detached leaves the processes running after this process exits (make dev-cluster).
	Detached bool
	// ExtraAPIServerArgs are appended to kube-apiserver's flags.
	ExtraAPIServerArgs []string
	// OperatorArgs are appended to the KubeRay operator's flags (e.g. --watch-namespace).
	OperatorArgs []string
	// OperatorEnv is added to the KubeRay operator's environment (e.g. ENABLE_ZERO_DOWNTIME=false).
	OperatorEnv []string
	// GatewayAPI installs the Gateway API's Gateway and HTTPRoute CRDs (no controller) before the
	// operator starts, as its RayServiceIncrementalUpgrade gate needs.
	GatewayAPI bool
	// RealNode runs a real node (kubelet, kube-proxy, containerd in namespaces of their own) and
	// kube-scheduler instead of the kubelet and Ray stand-in (e2e/framework/realnode.go). Needs root.
	RealNode bool
	// StandIn tunes the kubelet and Ray stand-in every other control plane runs.
	StandIn StandInOptions
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
}

// ControlPlane is a running (or connected) API server with the KubeRay operator.
type ControlPlane struct {
	Dir            string
	KubeRayVersion string
	// Kubeconfig is the path of an admin (system:masters) kubeconfig.
	Kubeconfig string
	Config     *rest.Config
	Kube       kubernetes.Interface
	Dynamic    dynamic.Interface
	// External is true when the harness connected to a cluster it did not start (E2E_KUBECONFIG).
	External bool
	// Ray is the kubelet and Ray stand-in (nil on an external cluster, which has real kubelets).
	Ray *RayStandIn
	// ServiceProxyURL is, with a real node, an HTTP proxy on loopback through which host processes
	// (the KubeRay operator, tests) call Services by their cluster names and pods by their IPs.
	ServiceProxyURL string
	// tempDir: Dir was created by Start and is removed by Stop (unless $E2E_KEEP_DIR is set).
	tempDir bool

	procs []*process
}

// Start brings up etcd → kube-apiserver → kube-controller-manager → kubelet and Ray stand-in →
// KubeRay CRDs → KubeRay operator (its HTTP_PROXY the stand-in), each waited on for readiness. On
// error everything started so far is stopped.
func Start(ctx context.Context, o Options) (cp *ControlPlane, err error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if o.KubeRayVersion == "" {
		o.KubeRayVersion = "v1.6.1"
	}
	bins, err := EnsureBinaries(ctx, o.KubeRayVersion, logf)
	if err != nil {
		return nil, err
	}
	dir, tempDir := o.Dir, o.Dir == ""
	if tempDir {
		if dir, err = os.MkdirTemp("", "raysync-e2e-"); err != nil {
			return nil, err
		}
	}
	if dir, err = filepath.Abs(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cp = &ControlPlane{Dir: dir, KubeRayVersion: o.KubeRayVersion}
	defer func() {
		if err != nil {
			_ = stopAll(cp.procs) // keep the directory: its logs say what went wrong
			if terr := teardownRealNode(dir); terr != nil {
				err = errors.Join(err, terr)
			}
			err = fmt.Errorf("%w (logs in %s)", err, dir)
		}
	}()
	cp.tempDir = tempDir
	pk, err := newPKI(dir)
	if err != nil {
		return cp, fmt.Errorf("pki: %w", err)
	}
	ports, err := freePorts(4)
	if err != nil {
		return cp, err
	}
	etcdPort, peerPort, apiPort, probePort := ports[0], ports[1], ports[2], ports[3]
	server := fmt.Sprintf("https://127.0.0.1:%d", apiPort)
	cp.Kubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := writeKubeconfig(cp.Kubeconfig, server, pk.caCert, pk.adminCert, pk.adminKey); err != nil {
		return cp, err
	}
	kcmKubeconfig := filepath.Join(dir, "kcm.kubeconfig")
	if err := writeKubeconfig(kcmKubeconfig, server, pk.caCert, pk.kcmCert, pk.kcmKey); err != nil {
		return cp, err
	}

	start := func(name, path string, env []string, args ...string) error {
		return cp.start(o, name, path, env, 0, args...)
	}

	t0 := time.Now()
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	if err := start("etcd", bins.Etcd, nil, "--name=e2e", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=e2e="+peerURL, "--unsafe-no-fsync", "--log-level=warn"); err != nil {
		return cp, err
	}
	if err := waitHTTP(ctx, cp.proc("etcd"), etcdURL+"/health", `"health":"true"`, 30*time.Second); err != nil {
		return cp, fmt.Errorf("etcd: %w", err)
	}
	logf("etcd ready on 127.0.0.1:%d (%s)", etcdPort, time.Since(t0).Round(time.Millisecond))

	apiArgs := []string{
		"--etcd-servers=" + etcdURL, "--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(apiPort),
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--tls-cert-file=" + pk.servingCert, "--tls-private-key-file=" + pk.servingKey, "--client-ca-file=" + pk.caCert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + pk.saPub, "--service-account-signing-key-file=" + pk.saKey,
		"--service-cluster-ip-range=" + ServiceCIDR, "--allow-privileged=true",
	}
	if !o.RealNode {
		apiArgs = append(apiArgs, "--authorization-mode=RBAC")
	} else {
		// The kubelet authenticates as system:node:<name> and is authorized by the Node authorizer, as
		// in a kubeadm cluster; the API server authenticates to the kubelet (logs, exec) by certificate.
		apiArgs = append(apiArgs, "--authorization-mode=Node,RBAC", "--kubelet-client-certificate="+pk.kubeletClientCert,
			"--kubelet-client-key="+pk.kubeletClientKey, "--kubelet-preferred-address-types=InternalIP")
	}
	if err := start("kube-apiserver", bins.APIServer, nil, append(apiArgs, o.ExtraAPIServerArgs...)...); err != nil {
		return cp, err
	}
	if err := cp.connect(); err != nil {
		return cp, err
	}
	if err := cp.waitAPIServer(ctx, 90*time.Second); err != nil {
		return cp, err
	}
	logf("kube-apiserver ready on 127.0.0.1:%d (%s)", apiPort, time.Since(t0).Round(time.Millisecond))

	// Besides garbage collection, namespaces and ServiceAccounts: Endpoints and EndpointSlices (a
	// RayService is Ready once its serve Service has ready endpoints) and Jobs (RayJob submitters).
	controllers := "garbage-collector-controller,namespace-controller,serviceaccount-controller," +
		"endpoints-controller,endpointslice-controller,job-controller"
	if o.RealNode {
		// Workloads users install (raysync's chart, CoreDNS) run as Deployments on a real node; the
		// node lifecycle controller lifts the not-ready taint the kubelet registers the node with; every
		// pod mounts the kube-root-ca.crt ConfigMap the root CA publisher writes.
		controllers += ",deployment-controller,replicaset-controller,node-lifecycle-controller,root-ca-certificate-publisher-controller"
	}
	if err := start("kube-controller-manager", bins.ControllerManager, nil, "--kubeconfig="+kcmKubeconfig,
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=true",
		"--root-ca-file="+pk.caCert, "--service-account-private-key-file="+pk.saKey,
		"--controllers="+controllers); err != nil {
		return cp, err
	}
	// The serviceaccount controller creates each namespace's default ServiceAccount; Pods need it.
	if err := poll(ctx, cp.proc("kube-controller-manager"), 60*time.Second, func(ctx context.Context) (bool, error) {
		_, err := cp.Kube.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return cp, fmt.Errorf("kube-controller-manager: default ServiceAccount never appeared: %w", err)
	}
	logf("kube-controller-manager ready (%s)", time.Since(t0).Round(time.Millisecond))

	var operatorEnv []string
	if o.RealNode {
		o.Logf = logf
		if err := cp.startRealNode(ctx, o, apiPort, pk); err != nil {
			return cp, err
		}
		operatorEnv = proxyEnv(cp.ServiceProxyURL)
	} else {
		if err := cp.startStandIn(ctx, o); err != nil {
			return cp, err
		}
		logf("kubelet and Ray stand-in ready, JSON at %s (%s)", cp.Ray.APIURL, time.Since(t0).Round(time.Millisecond))
		operatorEnv = cp.Ray.operatorEnv()
	}

	if err := InstallCRDs(ctx, cp.Dynamic, bins.KubeRayCRDs); err != nil {
		return cp, err
	}
	if o.GatewayAPI {
		if err := InstallGatewayAPICRDs(ctx, cp.Dynamic); err != nil {
			return cp, err
		}
	}
	probe := fmt.Sprintf("127.0.0.1:%d", probePort)
	operatorEnv = append(operatorEnv, o.OperatorEnv...)
	if err := start("kuberay-operator", bins.KubeRay, operatorEnv, append([]string{"--kubeconfig=" + cp.Kubeconfig, "--enable-leader-election=false",
		"--metrics-addr=0", "--health-probe-bind-address=" + probe}, o.OperatorArgs...)...); err != nil {
		return cp, err
	}
	if err := waitHTTP(ctx, cp.proc("kuberay-operator"), "http://"+probe+"/readyz", "", 60*time.Second); err != nil {
		return cp, fmt.Errorf("kuberay operator: %w", err)
	}
	logf("KubeRay operator %s ready (%s)", o.KubeRayVersion, time.Since(t0).Round(time.Millisecond))
	return cp, nil
}

// Connect uses a cluster someone else runs (which must already run the KubeRay operator).
func Connect(kubeconfig string) (*ControlPlane, error) {
	cp := &ControlPlane{Kubeconfig: kubeconfig, External: true, KubeRayVersion: "external"}
	if err := cp.connect(); err != nil {
		return nil, err
	}
	return cp, nil
}

// Attach returns a handle on a detached control plane started earlier in dir (to stop it).
func Attach(dir string) (*ControlPlane, error) {
	procs, err := readPIDs(dir)
	if err != nil {
		return nil, err
	}
	cp := &ControlPlane{Dir: dir, procs: procs, Kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	cp.Ray, _ = AttachStandIn(dir)
	return cp, nil
}

// start starts one process of this control plane (in new namespaces given by cloneflags, if any)
// and records it in the pid file.
func (c *ControlPlane) start(o Options, name, path string, env []string, cloneflags uintptr, args ...string) error {
	p, err := startProcess(c.Dir, name, path, args, env, o.Detached, cloneflags)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	return writePIDs(c.Dir, c.procs)
}

func (c *ControlPlane) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = -1, 0 // tests create objects in bursts; the local API server can take it
	c.Config = cfg
	if c.Kube, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	c.Dynamic, err = dynamic.NewForConfig(cfg)
	return err
}

// Stop stops every process in order (operator, stand-in, kcm, apiserver, etcd). Safe to call twice.
func (c *ControlPlane) Stop() error {
	if c == nil || c.External {
		return nil
	}
	err := errors.Join(stopAll(c.procs), teardownRealNode(c.Dir))
	c.procs = nil
	if err == nil && c.tempDir && os.Getenv("E2E_KEEP_DIR") == "" {
		err = os.RemoveAll(c.Dir)
	}
	return err
}

// StopAPIServer stops kube-apiserver (etcd and the rest keep running); StartAPIServer starts it again
// on the same port with the same flags and waits until it is ready. Fault tests use the pair.
func (c *ControlPlane) StopAPIServer() error {
	p := c.proc("kube-apiserver")
	if p == nil {
		return errors.New("no kube-apiserver process (external cluster?)")
	}
	// kube-apiserver's graceful shutdown can take 30 s with open watches; 10 s then SIGKILL.
	return p.stop(10 * time.Second)
}

func (c *ControlPlane) StartAPIServer(ctx context.Context) error {
	old := c.proc("kube-apiserver")
	if old == nil {
		return errors.New("no kube-apiserver process (external cluster?)")
	}
	p, err := startProcess(c.Dir, old.name, old.path, old.args, old.env, false, 0)
	if err != nil {
		return err
	}
	for i, q := range c.procs {
		if q == old {
			c.procs[i] = p
		}
	}
	return c.waitAPIServer(ctx, 90*time.Second)
}

// LogPath is where a process of this control plane logs (etcd, kube-apiserver,
// kube-controller-manager, standin, kuberay-operator).
func (c *ControlPlane) LogPath(name string) string { return filepath.Join(c.Dir, name+".log") }

func (c *ControlPlane) proc(name string) *process {
	for _, p := range c.procs {
		if p.name == name {
			return p
		}
	}
	return nil
}

// Running reports whether any process of this control plane is still alive.
func (c *ControlPlane) Running() []string {
	var names []string
	for _, p := range c.procs {
		if p.alive() {
			names = append(names, fmt.Sprintf("%s (pid %d)", p.name, p.pid))
		}
	}
	return names
}

func (c *ControlPlane) waitAPIServer(ctx context.Context, timeout time.Duration) error {
	return poll(ctx, c.proc("kube-apiserver"), timeout, func(ctx context.Context) (bool, error) {
		body, err := c.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err == nil && string(body) == "ok", nil
	})
}

// CRDGVR is the resource of CustomResourceDefinitions.
var CRDGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallCRDs creates every CRD in dir (too large for client-side apply) and waits until they are Established.
func InstallCRDs(ctx context.Context, dyn dynamic.Interface, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	return InstallCRDFiles(ctx, dyn, files...)
}

// PrometheusOperatorVersion is the module the tests take the ServiceMonitor and PrometheusRule CRDs from.
const PrometheusOperatorVersion = "v0.85.0"

// InstallPrometheusOperatorCRDs installs the ServiceMonitor and PrometheusRule CRDs from the Go module.
func InstallPrometheusOperatorCRDs(ctx context.Context, dyn dynamic.Interface) error {
	return installModuleCRDs(ctx, dyn, "github.com/prometheus-operator/prometheus-operator@"+PrometheusOperatorVersion,
		"example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml", "example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml")
}

// GatewayAPIVersion is the Gateway API module KubeRay v1.6.1 is built against (its go.mod).
const GatewayAPIVersion = "v1.4.1"

// InstallGatewayAPICRDs installs the standard channel's Gateway and HTTPRoute CRDs from the Go module.
func InstallGatewayAPICRDs(ctx context.Context, dyn dynamic.Interface) error {
	return installModuleCRDs(ctx, dyn, "sigs.k8s.io/gateway-api@"+GatewayAPIVersion,
		"config/crd/standard/gateway.networking.k8s.io_gateways.yaml", "config/crd/standard/gateway.networking.k8s.io_httproutes.yaml")
}

// installModuleCRDs installs CRDs from files (slash paths) of a Go module at a version.
func installModuleCRDs(ctx context.Context, dyn dynamic.Interface, module string, files ...string) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	dir, err := moduleDir(ctx, root, module)
	if err != nil {
		return err
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(dir, filepath.FromSlash(f))
	}
	return InstallCRDFiles(ctx, dyn, paths...)
}

// InstallCRDFiles creates the CRDs in files and waits until they are Established.
func InstallCRDFiles(ctx context.Context, dyn dynamic.Interface, files ...string) error {
	sort.Strings(files)
	var names []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(b, &obj.Object); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if _, err := dyn.Resource(CRDGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	for _, n := range names {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			crd, err := dyn.Resource(CRDGVR).Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", n, err)
		}
	}
	return nil
}

// poll runs cond until it is true, the timeout passes, or p exits (then its log tail is in the error).
func poll(ctx context.Context, p *process, timeout time.Duration, cond wait.ConditionWithContextFunc) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if !p.alive() {
			return false, fmt.Errorf("%s exited:\n%s", p.name, tail(p.logPath(), 20))
		}
		return cond(ctx)
	})
}

func waitHTTP(ctx context.Context, p *process, url, want string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return poll(ctx, p, timeout, func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(buf[:n]), want), nil
	})
}

// freePorts reserves n distinct loopback ports below the kernel's ephemeral range. A port the kernel
// handed out for a listener (127.0.0.1:0) is one it also hands out as the source port of an outgoing
// connection: with another package's tests busy on the same machine, such a port was taken between
// choosing it and etcd binding it (CI: a harness whose etcd could not listen). Ports below the range
// are only ever taken by a listener; each is checked free, chosen at random so that concurrent test
// processes rarely meet, and never handed out twice by this process.
func freePorts(n int) ([]int, error) {
	lo, hi := listenerPortRange()
	portMu.Lock()
	defer portMu.Unlock()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10000 {
			return nil, fmt.Errorf("no free loopback port in %d-%d", lo, hi)
		}
		port := lo + rand.IntN(hi-lo)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ls = append(ls, l)
		portsGiven[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}

var (
	portMu     sync.Mutex
	portsGiven = map[int]bool{}
)

// listenerPortRange is [lo, hi): the ports below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range, 32768-60999 by default) and above the well-known and
// commonly configured ones.
func listenerPortRange() (int, int) {
	lo, hi := 20000, 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if first, err := strconv.Atoi(f[0]); err == nil && first > lo+1000 {
				hi = first
			}
		}
	}
	return lo, hi
}

// FreePort returns a loopback port for a test's own listener.
func FreePort() (int, error) {
	p, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
