package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/raysync/raysync/e2e/standin"
)

// StandInOptions tune the kubelet and Ray stand-in (see package e2e/standin). Zero values take the
// harness defaults, chosen so tests stay fast while keeping the real thing's shape.
type StandInOptions struct {
	StartDelay       time.Duration // pod creation → containers created [300ms]
	Backoff          time.Duration // restart back-off base, doubling [500ms; the kubelet's is 10s]
	GCSRetry         time.Duration // wait-gcs-ready's polling period [1s; KubeRay's script sleeps 5s]
	JoinTimeout      time.Duration // a raylet waiting for a head that is not up [10s]
	ServeDeployDelay time.Duration // Serve application DEPLOYING → RUNNING [1s]
	JobDuration      time.Duration // a Ray job runs, then SUCCEEDS [2s]
	PrivateRegistry  string        // images from here need pull credentials [registry.example.internal]
	// RayVenv, when set (EnsureRay), runs the pods of namespaces annotated StandInRay=real as real Ray.
	RayVenv string
}

func (o StandInOptions) args() []string {
	d := func(v, def time.Duration) string {
		if v == 0 {
			v = def
		}
		return v.String()
	}
	reg := o.PrivateRegistry
	if reg == "" {
		reg = PrivateRegistry
	}
	return []string{"-start-delay=" + d(o.StartDelay, 300*time.Millisecond), "-backoff=" + d(o.Backoff, 500*time.Millisecond),
		"-gcs-retry=" + d(o.GCSRetry, time.Second), "-join-timeout=" + d(o.JoinTimeout, 10*time.Second),
		"-serve-deploy-delay=" + d(o.ServeDeployDelay, time.Second), "-job-duration=" + d(o.JobDuration, 2*time.Second),
		"-private-registry=" + reg}
}

// PrivateRegistry is the registry whose images the stand-in pulls only with credentials.
const PrivateRegistry = "registry.example.internal"

// Namespace annotations the stand-in honours (set them before the namespace has pods).
const (
	// StandInStart "never" keeps a namespace's pods Pending and unbound, as without a kubelet.
	StandInStart = standin.AnnotationStart
	// StandInStartDelay overrides the start delay for a namespace's pods (a Go duration).
	StandInStartDelay = standin.AnnotationStartDelay
	// StandInSecretCache "watch" or a Go duration: the namespace's Secrets are read as the real
	// kubelet's Watch-based manager does (stale until the watch event arrives, that much late).
	StandInSecretCache = standin.AnnotationSecretCache
)

// RayStandIn is the test's handle on the kubelet and Ray stand-in of a control plane.
type RayStandIn struct {
	// APIURL is the stand-in's read-only JSON endpoint (curl it).
	APIURL string `json:"api"`
	// OperatorProxyURL is the KubeRay operator's HTTP_PROXY.
	OperatorProxyURL string `json:"operatorProxy"`
	// ClientProxyURL is the proxy for everyone else: Service names and pod IPs resolve through it.
	ClientProxyURL string `json:"clientProxy"`
	fp             *standin.Fingerprinter
}

const (
	standInFile    = "standin.json"
	standInKeyFile = "standin.key"
)

// startStandIn starts the stand-in process and waits until it serves.
func (c *ControlPlane) startStandIn(ctx context.Context, o Options) error {
	bin, err := BuildStandIn()
	if err != nil {
		return err
	}
	keyFile := filepath.Join(c.Dir, standInKeyFile)
	if err := standin.WriteKey(keyFile); err != nil {
		return err
	}
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	r := &RayStandIn{APIURL: fmt.Sprintf("http://127.0.0.1:%d", ports[0]),
		OperatorProxyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), ClientProxyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[2])}
	if r.fp, err = standin.LoadFingerprinter(keyFile); err != nil {
		return err
	}
	b, _ := json.Marshal(r)
	if err := os.WriteFile(filepath.Join(c.Dir, standInFile), b, 0o644); err != nil {
		return err
	}
	args := append([]string{"-kubeconfig=" + c.Kubeconfig, "-fingerprint-key=" + keyFile,
		"-api=" + hostPort(r.APIURL), "-operator-proxy=" + hostPort(r.OperatorProxyURL), "-client-proxy=" + hostPort(r.ClientProxyURL)},
		o.StandIn.args()...)
	if o.StandIn.RayVenv != "" {
		args = append(args, "-ray-venv="+o.StandIn.RayVenv, "-pod-dir="+filepath.Join(c.Dir, "pods"))
	}
	p, err := startProcess(c.Dir, "standin", bin, args, nil, o.Detached, 0)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := writePIDs(c.Dir, c.procs); err != nil {
		return err
	}
	if err := waitHTTP(ctx, p, r.APIURL+"/healthz", "ok", 60*time.Second); err != nil {
		return fmt.Errorf("kubelet stand-in: %w", err)
	}
	c.Ray = r
	return nil
}

// operatorEnv points the KubeRay operator's HTTP clients (Go's default transport) at the stand-in:
// its calls to head Services and pod IPs reach emulated Ray on loopback. The API server on
// 127.0.0.1 is never proxied (Go skips loopback).
func (r *RayStandIn) operatorEnv() []string {
	return proxyEnv(r.OperatorProxyURL)
}

func hostPort(u string) string {
	p, _ := url.Parse(u)
	return p.Host
}

// AttachStandIn returns the handle on the stand-in of a control plane started in dir (make
// dev-cluster, make demo).
func AttachStandIn(dir string) (*RayStandIn, error) {
	b, err := os.ReadFile(filepath.Join(dir, standInFile))
	if err != nil {
		return nil, err
	}
	r := &RayStandIn{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", standInFile, err)
	}
	if r.fp, err = standin.LoadFingerprinter(filepath.Join(dir, standInKeyFile)); err != nil {
		return nil, err
	}
	return r, nil
}

// Fingerprint is how the stand-in names token: compare it with what containers started with.
// Fingerprints are HMACs under a key of this control plane; still, never print them.
func (r *RayStandIn) Fingerprint(token string) string { return r.fp.Fingerprint(token) }

// Stats is what one RayCluster's Ray processes saw: requests per caller, join failures, restarts.
func (r *RayStandIn) Stats(ctx context.Context, namespace, cluster string) (standin.ClusterStats, error) {
	var s standin.ClusterStats
	return s, r.get(ctx, "/v1/clusters/"+namespace+"/"+cluster, &s)
}

// AllStats is Stats for every cluster that saw anything.
func (r *RayStandIn) AllStats(ctx context.Context) ([]standin.ClusterStats, error) {
	var s []standin.ClusterStats
	return s, r.get(ctx, "/v1/clusters", &s)
}

// Pod is a pod as the stand-in runs it (an error if it does not run it).
func (r *RayStandIn) Pod(ctx context.Context, namespace, pod string) (standin.PodReport, error) {
	var p standin.PodReport
	return p, r.get(ctx, "/v1/pods/"+namespace+"/"+pod, &p)
}

// ContainerTokens maps each started container of a pod to the fingerprint of the token its
// current run started with ("" for a container without RAY_AUTH_TOKEN).
func (r *RayStandIn) ContainerTokens(ctx context.Context, namespace, pod string) (map[string]string, error) {
	p, err := r.Pod(ctx, namespace, pod)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range p.Containers {
		if c.State != "waiting" {
			out[c.Name] = c.TokenFingerprint
		}
	}
	return out, nil
}

// Starts lists every container start in a namespace, in order, with its token fingerprint.
func (r *RayStandIn) Starts(ctx context.Context, namespace string) ([]standin.ContainerStart, error) {
	var s []standin.ContainerStart
	return s, r.get(ctx, "/v1/starts/"+namespace, &s)
}

// ProxyStats counts what the stand-in's HTTP proxies routed, per caller.
func (r *RayStandIn) ProxyStats(ctx context.Context) (standin.ProxyStats, error) {
	var s standin.ProxyStats
	return s, r.get(ctx, "/v1/proxy", &s)
}

// Client is an HTTP client outside the cluster: Service names (http://<svc>.<ns>.svc.cluster.local:8265)
// and pod IPs reach emulated Ray through the stand-in's client proxy.
func (r *RayStandIn) Client() *http.Client {
	proxy, _ := url.Parse(r.ClientProxyURL)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
}

func (r *RayStandIn) get(ctx context.Context, path string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.APIURL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("stand-in %s: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("stand-in %s: HTTP %d: %s", path, resp.StatusCode, body)
	}
	return json.Unmarshal(body, into)
}

var (
	standInOnce sync.Once
	standInBin  string
	standInErr  error
)

// BuildStandIn builds e2e/cmd/standin into the cache (once per process) and returns its path. The
// binary is replaced atomically, so a stand-in started by another run keeps running its own copy.
func BuildStandIn() (string, error) {
	standInOnce.Do(func() { standInBin, standInErr = buildStandIn() })
	return standInBin, standInErr
}

func buildStandIn() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "bin", "standin")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(filepath.Dir(bin), "standin-*.tmp")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, "./e2e/cmd/standin")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the kubelet stand-in: %v\n%s", err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// EnsureRayClient builds e2e/tools/rayclient (KubeRay's own dashboard client in a program, from its
// own module) into the cache and returns its path. The name carries a hash of its sources, so an
// edit rebuilds it.
func EnsureRayClient(ctx context.Context, logf func(string, ...any)) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	step, err := sourceStep(root, "e2e/tools/rayclient")
	if err != nil {
		return "", err
	}
	return ensureStep(ctx, step, logf)
}
