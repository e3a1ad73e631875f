package framework

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The real node: kubelet, kube-proxy and containerd in network, mount and PID namespaces of their own
// (as kind runs a node in a container), joined to the host by a veth pair. All its addresses are in
// 198.18.0.0/17; Services (ServiceCIDR) are routed from the host into the node, where kube-proxy
// translates them, so the API server calls a webhook through its Service as in any cluster.
const (
	ContainerdVersion = "v2.4.2"
	CNIPluginsVersion = "v1.10.0"
	// NodeName is the real node's name (one real node per machine at a time).
	NodeName = "raysync-node"
	// RealNodeHostIP is the host's end of the node's veth: the node reaches the API server there.
	RealNodeHostIP = "198.18.0.1"
	// NodeIP is the node's InternalIP (its end of the veth; the kubelet listens on it).
	NodeIP = "198.18.0.2"
	// PodCIDR is the node's pod range (a bridge per node, as kind's kindnet).
	PodCIDR = "198.18.64.0/24"
	// PauseImage is the sandbox image, built here and imported into the node's containerd.
	PauseImage = "raysync-e2e.local/pause:1"
	// TinyImage is a one-binary workload image (`pause env NAME...`), imported like the pause image.
	TinyImage = "raysync-e2e.local/tiny:1"

	// RegistryHost is the node's private registry (distribution, htpasswd, TLS from the cluster CA)
	// as the node knows it: containerd's hosts.toml and the node's /etc/hosts name it.
	RegistryHost = "registry.raysync.test:5000"
	// registryAddr is where the registry listens (in the node's network namespace); the host pushes there.
	registryAddr = NodeIP + ":5000"
	// RegistryPush is registryAddr for other packages: the same registry, by the address the host reaches
	// and the node also pulls from.
	RegistryPush = registryAddr
	// RegistryUser is the registry's one account; its password is generated per node (never logged).
	RegistryUser = "raysync-e2e"

	hostVeth   = "rsnode0"
	podsRoute  = "198.18.64.0/18"
	nodeSubdir = "node"
	undoFile   = "undo.json"
)

// kubeletSysctls are the kernel-wide settings the kubelet changes at start (protectKernelDefaults
// false, the default): the harness records them first and restores them at teardown.
var kubeletSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// cgroupRoot is the kubelet's cgroup root under every cgroup v1 controller (and cgroup2): created by
// the harness, removed with everything below it at teardown.
const cgroupRoot = "raysync-node"

// NodeBinaries are the paths of everything the real node runs.
type NodeBinaries struct {
	Kubelet, KubeProxy, KubeScheduler         string
	Containerd, Shim, Ctr, CNIDir, Supervisor string
	Registry, ImageTool                       string
	PauseTar, TinyTar, CoreDNS, CoreDNSTar    string
}

// EnsureNodeBinaries installs runc, iptables and conntrack (Debian packages, once) and builds the
// node's binaries and images into the cache unless they are there.
func EnsureNodeBinaries(ctx context.Context, logf func(string, ...any)) (*NodeBinaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	if err := runPackageScript(ctx, cache, filepath.Join(root, "e2e/realnode/supervisor/install-packages.sh")); err != nil {
		return nil, err
	}
	bin := filepath.Join(cache, "bin")
	cni := filepath.Join(bin, "cni-plugins-"+CNIPluginsVersion)
	if err := os.MkdirAll(cni, 0o755); err != nil {
		return nil, err
	}
	b := &NodeBinaries{
		Kubelet:       filepath.Join(bin, "kubelet-"+KubernetesVersion),
		KubeProxy:     filepath.Join(bin, "kube-proxy-"+KubernetesVersion),
		KubeScheduler: filepath.Join(bin, "kube-scheduler-"+KubernetesVersion),
		Containerd:    filepath.Join(bin, "containerd-"+ContainerdVersion),
		Shim:          filepath.Join(bin, "containerd-shim-runc-v2-"+ContainerdVersion),
		Ctr:           filepath.Join(bin, "ctr-"+ContainerdVersion),
		CNIDir:        cni,
		Registry:      filepath.Join(bin, registryName),
		CoreDNS:       filepath.Join(bin, corednsName),
	}
	unlock, err := lockFile(filepath.Join(cache, "build.lock"))
	if err != nil {
		return nil, err
	}
	err = runSteps(ctx, root, nodeSteps(bin), logf)
	unlock()
	if err != nil {
		return nil, err
	}
	// The supervisor and the pause binary are this repository's code: rebuilt every time (seconds).
	if b.Supervisor, err = buildRepoBinary(ctx, root, bin, "realnode-supervisor", "./e2e/realnode/supervisor"); err != nil {
		return nil, err
	}
	pause, err := buildRepoBinary(ctx, root, bin, "realnode-pause", "./e2e/realnode/pause")
	if err != nil {
		return nil, err
	}
	imageTool, err := EnsureImageTool(ctx, logf)
	if err != nil {
		return nil, err
	}
	b.ImageTool = imageTool
	b.PauseTar, b.TinyTar = filepath.Join(bin, "realnode-pause.tar"), filepath.Join(bin, "realnode-tiny.tar")
	b.CoreDNSTar = filepath.Join(bin, corednsName+".tar")
	if !fileExists(b.CoreDNSTar) {
		if out, err := exec.CommandContext(ctx, imageTool, "single", "-binary", b.CoreDNS, "-entrypoint", "/coredns", "-ref", CoreDNSImage, "-out", b.CoreDNSTar).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("image %s: %v\n%s", CoreDNSImage, err, out)
		}
	}
	for tar, ref := range map[string]string{b.PauseTar: PauseImage, b.TinyTar: TinyImage} {
		if out, err := exec.CommandContext(ctx, imageTool, "single", "-binary", pause, "-entrypoint", "/pause", "-ref", ref, "-out", tar).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("image %s: %v\n%s", ref, err, out)
		}
	}
	return b, nil
}

// The cached builds of CoreDNS and the registry: each with the plugins and drivers the node uses
// (e2e/tools/coredns, e2e/tools/registry).
const (
	corednsName  = "coredns-" + CoreDNSVersion + "-node"
	registryName = "registry-" + RegistryVersion + "-node"
)

// nodeSteps are the builds of the node's programs: containerd, the kubelet, kube-proxy and
// kube-scheduler, CoreDNS, the registry and the CNI plugins.
func nodeSteps(bin string) []buildStep {
	ctrd := []string{"-ldflags=-s -w -X github.com/containerd/containerd/v2/version.Version=" + ContainerdVersion}
	var steps []buildStep
	for _, c := range []string{"containerd", "containerd-shim-runc-v2", "ctr"} {
		steps = append(steps, buildStep{filepath.Join(bin, c+"-"+ContainerdVersion), "e2e/tools/containerd", "github.com/containerd/containerd/v2/cmd/" + c, ctrd})
	}
	steps = append(steps, kubeSteps(bin, "kubelet", "kube-proxy", "kube-scheduler")...)
	steps = append(steps, toolStep(bin, corednsName, "e2e/tools/coredns", ".", ""), toolStep(bin, registryName, "e2e/tools/registry", ".", ""))
	for _, p := range []string{"ipam/host-local", "main/bridge", "main/loopback", "meta/portmap"} {
		steps = append(steps, toolStep(bin, filepath.Join("cni-plugins-"+CNIPluginsVersion, path.Base(p)), "e2e/tools/cni", "github.com/containernetworking/plugins/plugins/"+p, ""))
	}
	return steps
}

// RegistryVersion is distribution's registry (e2e/tools/registry).
const RegistryVersion = "v3.1.2"

func buildRepoBinary(ctx context.Context, root, bin, name, pkg string) (string, error) {
	out := filepath.Join(bin, name)
	if err := goCmd(ctx, root, nil, "build", "-trimpath", "-o", out+".tmp", pkg); err != nil {
		return "", err
	}
	return out, os.Rename(out+".tmp", out)
}

// nodeSpec is what the supervisor reads from spec.json (e2e/realnode/supervisor has the same types).
type nodeSpec struct {
	Tmpfs     []string      `json:"tmpfs"`
	Binds     []nodeBind    `json:"binds"`
	Processes []nodeProcess `json:"processes"`
}

type nodeBind struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

type nodeProcess struct {
	Name    string   `json:"name"`
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	WaitFor string   `json:"waitFor"`
}

// nodeUndo is what teardown restores: the kernel-wide values the node's programs change.
type nodeUndo struct {
	Sysctls map[string]string `json:"sysctls"`
}

// startRealNode starts kube-scheduler, the relay to the API server, and the node's supervisor, and
// waits until the node is Ready. The control plane's API server is already up.
func (c *ControlPlane) startRealNode(ctx context.Context, o Options, apiPort int, pk *pki) error {
	logf := o.Logf
	nb, err := EnsureNodeBinaries(ctx, logf)
	if err != nil {
		return err
	}
	if _, err := net.InterfaceByName(hostVeth); err == nil {
		return fmt.Errorf("a real node already runs on this machine (interface %s exists; make dev-cluster-down?)", hostVeth)
	}
	t0 := time.Now()
	dir := filepath.Join(c.Dir, nodeSubdir)
	for _, d := range []string{"registry/data", "containerd/certs.d/" + RegistryHost, "containerd/certs.d/" + registryAddr, "kubelet", "containerd/root", "containerd/state", "containerd/certs.d", "cni/net.d", "cni/bin", "cni/ipam", "bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	// Kernel-wide state first, so that teardown can always put it back.
	undo := nodeUndo{Sysctls: map[string]string{}}
	for _, s := range kubeletSysctls {
		v, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return err
		}
		undo.Sysctls[s] = strings.TrimSpace(string(v))
	}
	if err := writeJSON(filepath.Join(dir, undoFile), undo); err != nil {
		return err
	}
	for _, d := range cgroupDirs() {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup root: %w", err)
		}
	}
	if err := weighNodeCPU(); err != nil {
		return err
	}

	// Binaries under the names containerd looks for.
	for name, path := range map[string]string{"containerd-shim-runc-v2": nb.Shim} {
		_ = os.Remove(filepath.Join(dir, "bin", name))
		if err := os.Symlink(path, filepath.Join(dir, "bin", name)); err != nil {
			return err
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		_ = os.Remove(filepath.Join(dir, "cni/bin", p))
		if err := os.Symlink(filepath.Join(nb.CNIDir, p), filepath.Join(dir, "cni/bin", p)); err != nil {
			return err
		}
	}

	server := fmt.Sprintf("https://%s:%d", RealNodeHostIP, apiPort)
	kubeconfig := func(name, cn string, orgs []string) (string, error) {
		crt, key, _, err := c.IssueClientCert(cn, orgs)
		if err != nil {
			return "", err
		}
		cp, kp := filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		if err := os.WriteFile(cp, crt, 0o600); err != nil {
			return "", err
		}
		if err := os.WriteFile(kp, key, 0o600); err != nil {
			return "", err
		}
		path := filepath.Join(dir, name+".kubeconfig")
		return path, writeKubeconfig(path, server, pk.caCert, cp, kp)
	}
	kubeletKC, err := kubeconfig("kubelet", "system:node:"+NodeName, []string{"system:nodes"})
	if err != nil {
		return err
	}
	proxyKC, err := kubeconfig("kube-proxy", "system:kube-proxy", nil)
	if err != nil {
		return err
	}
	if err := c.writeRegistryFiles(ctx, dir, nb, pk); err != nil {
		return err
	}
	sock := filepath.Join(dir, "containerd/containerd.sock")
	files := map[string]string{
		"containerd/config.toml": containerdConfig(dir),
		"cni/net.d/10-raysync-node.conflist": fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "raysync-node", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}
]}`, filepath.Join(dir, "cni/ipam"), PodCIDR),
		"kubelet/config.yaml": kubeletConfig(sock, pk.caCert),
		"kube-proxy.yaml":     kubeProxyConfig(proxyKC),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	spec := nodeSpec{
		// Hard-coded paths of the node's programs (containerd's shim sockets under /run/containerd,
		// pod network namespaces under /run/netns, the kubelet's /var/log/containers, CNI's cache in
		// /var/lib/cni, iptables' lock in /run) land in these tmpfs and die with the node.
		Tmpfs: []string{"/run", "/var/lib", "/var/log"},
		// The node resolves the registry's name as a kind node resolves what its /etc/hosts says.
		Binds: []nodeBind{{Source: filepath.Join(dir, "hosts"), Target: "/etc/hosts"}},
		Processes: []nodeProcess{
			{Name: "registry", Path: nb.Registry, Args: []string{"serve", filepath.Join(dir, "registry/config.yml")}},
			{Name: "containerd", Path: nb.Containerd, Args: []string{"--config", filepath.Join(dir, "containerd/config.toml")},
				Env: []string{"PATH=" + filepath.Join(dir, "bin") + ":/usr/sbin:/usr/bin:/sbin:/bin"}, WaitFor: sock},
			{Name: "import-images", Path: "/bin/sh", Args: []string{"-c", fmt.Sprintf("for t in %s %s %s; do %s -a %s -n k8s.io images import $t || exit 1; done",
				nb.PauseTar, nb.TinyTar, nb.CoreDNSTar, nb.Ctr, sock)}},
			{Name: "kubelet", Path: nb.Kubelet, Args: []string{"--config=" + filepath.Join(dir, "kubelet/config.yaml"),
				"--kubeconfig=" + kubeletKC, "--root-dir=" + filepath.Join(dir, "kubelet"), "--hostname-override=" + NodeName,
				"--node-ip=" + NodeIP, "--volume-plugin-dir=" + filepath.Join(dir, "kubelet/volume-plugins"), "--v=2"}},
			{Name: "kube-proxy", Path: nb.KubeProxy, Args: []string{"--config=" + filepath.Join(dir, "kube-proxy.yaml"), "--v=2"}},
		},
	}
	if err := writeJSON(filepath.Join(dir, "spec.json"), spec); err != nil {
		return err
	}

	// kube-scheduler: a control-plane process on loopback.
	schedKC := filepath.Join(c.Dir, "scheduler.kubeconfig")
	crt, key, _, err := c.IssueClientCert("system:kube-scheduler", nil)
	if err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(c.Dir, "scheduler.crt"), crt, 0o600)
	_ = os.WriteFile(filepath.Join(c.Dir, "scheduler.key"), key, 0o600)
	if err := writeKubeconfig(schedKC, fmt.Sprintf("https://127.0.0.1:%d", apiPort), pk.caCert,
		filepath.Join(c.Dir, "scheduler.crt"), filepath.Join(c.Dir, "scheduler.key")); err != nil {
		return err
	}
	if err := c.start(o, "kube-scheduler", nb.KubeScheduler, nil, 0, "--kubeconfig="+schedKC, "--leader-elect=false", "--secure-port=0"); err != nil {
		return err
	}

	// The node: its supervisor in new namespaces, then the veth between it and the host.
	if err := c.start(o, "realnode", nb.Supervisor, nil, syscall.CLONE_NEWNS|syscall.CLONE_NEWNET|syscall.CLONE_NEWPID, "node", "-dir", dir); err != nil {
		return err
	}
	pid := strconv.Itoa(c.proc("realnode").pid)
	hostCmds := [][]string{
		{"ip", "link", "add", hostVeth, "type", "veth", "peer", "name", "eth0", "netns", pid},
		{"ip", "addr", "add", RealNodeHostIP + "/30", "dev", hostVeth},
		{"ip", "link", "set", hostVeth, "up"},
		{"ip", "route", "add", podsRoute, "via", NodeIP},
		{"ip", "route", "add", ServiceCIDR, "via", NodeIP},
		{"nsenter", "-t", pid, "-n", "ip", "link", "set", "lo", "up"},
		{"nsenter", "-t", pid, "-n", "ip", "addr", "add", NodeIP + "/30", "dev", "eth0"},
		{"nsenter", "-t", pid, "-n", "ip", "link", "set", "eth0", "up"},
		// Inside the node only (these sysctls are per network namespace): route between pods and the
		// veth. No default route: the node reaches the host and nothing beyond it.
		{"nsenter", "-t", pid, "-n", "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
	}
	for i, args := range hostCmds {
		if i == 3 {
			// The host's routes need the node's address up; wait for the link.
			time.Sleep(100 * time.Millisecond)
		}
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "network-ready"), nil, 0o644); err != nil {
		return err
	}
	// The relay: the node's programs reach the API server (loopback only) at the host's veth address.
	if err := c.start(o, "apiserver-relay", nb.Supervisor, nil, 0, "relay", "-listen", fmt.Sprintf("%s:%d", RealNodeHostIP, apiPort),
		"-to", fmt.Sprintf("127.0.0.1:%d", apiPort)); err != nil {
		return err
	}
	// The kubernetes Service's endpoint (the API server runs with --endpoint-reconciler-type=none).
	if err := c.publishAPIServerEndpoint(ctx, apiPort); err != nil {
		return err
	}
	if err := poll(ctx, c.proc("realnode"), 3*time.Minute, func(ctx context.Context) (bool, error) {
		n, err := c.Kube.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range n.Status.Conditions {
			if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return fmt.Errorf("node %s never Ready (logs in %s): %w\n%s", NodeName, dir, err, tail(filepath.Join(dir, "kubelet.log"), 20))
	}
	logf("real node %s Ready (%s)", NodeName, time.Since(t0).Round(time.Millisecond))
	if err := deployCoreDNS(ctx, c.Kube); err != nil {
		return err
	}
	logf("CoreDNS %s available at %s (%s)", CoreDNSVersion, ClusterDNSIP, time.Since(t0).Round(time.Millisecond))
	// Host processes reach Services by name as pods do: the KubeRay operator calls a head's dashboard
	// at http://<svc>.<ns>.svc.cluster.local:8265 (its HTTP_PROXY, as with the stand-in).
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	c.ServiceProxyURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	if err := c.start(o, "service-proxy", nb.Supervisor, nil, 0, "proxy", "-listen", hostPort(c.ServiceProxyURL),
		"-dns", ClusterDNSIP+":53", "-allow", nodeRange); err != nil {
		return err
	}
	return poll(ctx, c.proc("service-proxy"), 10*time.Second, func(context.Context) (bool, error) {
		conn, err := net.DialTimeout("tcp", hostPort(c.ServiceProxyURL), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil, nil
	})
}

// nodeRange holds every address of the real node: the node, its pods, its Services.
const nodeRange = "198.18.0.0/16"

// proxyEnv points a host process's HTTP clients (Go's default transport) at proxy; the API server
// on loopback is never proxied.
func proxyEnv(proxy string) []string {
	return []string{"HTTP_PROXY=" + proxy, "http_proxy=" + proxy, "HTTPS_PROXY=", "https_proxy=",
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"}
}

// ServiceClient is an HTTP client on the host that reaches Services by their cluster names
// (http://<svc>.<ns>.svc.cluster.local:8265) and pods by their IPs, through ServiceProxyURL.
func (c *ControlPlane) ServiceClient(timeout time.Duration) *http.Client {
	proxy, _ := url.Parse(c.ServiceProxyURL)
	return &http.Client{Timeout: timeout, Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}}
}

// writeRegistryFiles writes the registry's account, htpasswd, serving certificate and configuration,
// and the node's view of it: /etc/hosts and containerd's hosts.toml trusting the cluster CA.
func (c *ControlPlane) writeRegistryFiles(ctx context.Context, dir string, nb *NodeBinaries, pk *pki) error {
	pw := make([]byte, 18)
	if _, err := rand.Read(pw); err != nil {
		return err
	}
	authFile := filepath.Join(dir, "registry/auth")
	if err := os.WriteFile(authFile, []byte(RegistryUser+":"+hex.EncodeToString(pw)), 0o600); err != nil {
		return err
	}
	htpasswd, err := exec.CommandContext(ctx, nb.ImageTool, "htpasswd", "-auth", authFile).Output()
	if err != nil {
		return fmt.Errorf("htpasswd: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "registry/htpasswd"), htpasswd, 0o600); err != nil {
		return err
	}
	host, _, _ := strings.Cut(RegistryHost, ":")
	crt, key, err := pk.issue("registry", host, nil, true, []string{host}, []net.IP{net.ParseIP(NodeIP)})
	if err != nil {
		return err
	}
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	files := map[string]string{
		"registry/config.yml": fmt.Sprintf(`version: 0.1
log: {level: info, accesslog: {disabled: false}}
storage:
  filesystem: {rootdirectory: %q}
  delete: {enabled: true}
http:
  addr: %s
  secret: %s
  tls: {certificate: %q, key: %q}
auth:
  htpasswd: {realm: raysync-e2e, path: %q}
`, filepath.Join(dir, "registry/data"), registryAddr, hex.EncodeToString(secret), crt, key, filepath.Join(dir, "registry/htpasswd")),
		"hosts": fmt.Sprintf("127.0.0.1 localhost\n%s %s\n", NodeIP, host),
		"containerd/certs.d/" + RegistryHost + "/hosts.toml": fmt.Sprintf(`server = "https://%s"

[host."https://%s"]
  capabilities = ["pull", "resolve"]
  ca = %q
`, RegistryHost, RegistryHost, pk.caCert),
		// The same registry by the address the host pushes to: an image pushed as 198.18.0.2:5000/… (make
		// release's REGISTRY) pulls by that name.
		"containerd/certs.d/" + registryAddr + "/hosts.toml": fmt.Sprintf(`server = "https://%s"

[host."https://%s"]
  capabilities = ["pull", "resolve"]
  ca = %q
`, registryAddr, registryAddr, pk.caCert),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// NodeLogPath is where a program of the real node logs (containerd, kubelet, kube-proxy, registry).
func (c *ControlPlane) NodeLogPath(name string) string {
	return filepath.Join(c.Dir, nodeSubdir, name+".log")
}

// PushImage pushes an image tarball to the node's registry as repoTag (e.g. "private/tiny:1") with
// the registry's account and returns the reference the node pulls it by.
func (c *ControlPlane) PushImage(ctx context.Context, tar, repoTag string) (string, error) {
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(c.Dir, nodeSubdir)
	out, err := exec.CommandContext(ctx, filepath.Join(cache, "bin", ImageToolName), "push", "-tar", tar, "-ref", registryAddr+"/"+repoTag,
		"-ca", filepath.Join(c.Dir, "ca.crt"), "-auth", filepath.Join(dir, "registry/auth")).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("push %s: %v\n%s", repoTag, err, out)
	}
	return RegistryHost + "/" + repoTag, nil
}

// RegistryPullSecret returns a kubernetes.io/dockerconfigjson Secret holding the registry's account under
// both its names (RegistryHost, RegistryPush); its data is also a Docker config.json for pushes from the host.
func (c *ControlPlane) RegistryPullSecret(namespace, name string) (*corev1.Secret, error) {
	b, err := os.ReadFile(filepath.Join(c.Dir, nodeSubdir, "registry/auth"))
	if err != nil {
		return nil, err
	}
	user, pw, _ := strings.Cut(string(b), ":")
	account := map[string]string{"username": user, "password": pw, "auth": base64.StdEncoding.EncodeToString(b)}
	cfg, err := json.Marshal(map[string]any{"auths": map[string]any{RegistryHost: account, RegistryPush: account}})
	if err != nil {
		return nil, err
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{corev1.DockerConfigJsonKey: cfg}}, nil
}

func (c *ControlPlane) publishAPIServerEndpoint(ctx context.Context, apiPort int) error {
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: "default", Labels: map[string]string{
			discoveryv1.LabelServiceName: "kubernetes", discoveryv1.LabelManagedBy: "raysync-e2e"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{RealNodeHostIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(apiPort)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	_, err := c.Kube.DiscoveryV1().EndpointSlices("default").Create(ctx, slice, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		err = nil
	}
	return err
}

func containerdConfig(dir string) string {
	return fmt.Sprintf(`version = 3
root = %q
state = %q

[grpc]
  address = %q

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.runtime"]
  netns_mounts_under_state_dir = true
  # The harness runs without CAP_SYS_RESOURCE (its bounding set lacks it): runc cannot lower a
  # container's oom_score_adj below containerd's own (the sandbox's -998 failed with "failed to update
  # /proc/self/oom_score_adj: Permission denied"). As for rootless containerd, clamp it instead.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %q
`, filepath.Join(dir, "containerd/root"), filepath.Join(dir, "containerd/state"), filepath.Join(dir, "containerd/containerd.sock"),
		filepath.Join(dir, "cni/bin"), filepath.Join(dir, "cni/net.d"), PauseImage, filepath.Join(dir, "containerd/certs.d"))
}

func kubeletConfig(sock, ca string) string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 (cgroup2 beside it): kubelet 1.37 refuses v1 unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /%s
containerRuntimeEndpoint: unix://%s
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization:
  mode: Webhook
# No host resolv.conf: a pod resolves nothing outside the cluster; CoreDNS (a pod) answers for it.
resolvConf: ""
clusterDomain: cluster.local
clusterDNS: [%s]
failSwapOn: false
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, cgroupRoot, sock, NodeIP, ca, ClusterDNSIP)
}

func kubeProxyConfig(kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
mode: iptables
clusterCIDR: %s
# Every Service connection is masqueraded: a pod calling a Service backed by a pod on the same bridge
# gets its answer back through kube-proxy's translation without br_netfilter.
iptables: {masqueradeAll: true}
# Leave the kernel-wide conntrack table and timeouts as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`, kubeconfig, NodeName, podsRoute)
}

// NodeCPUShares is the CPU weight of the node's cgroup root, under which the kubelet puts every pod:
// eight processes' worth (a process at nice 0 weighs 1024). A node has CPUs of its own; this one
// shares 2 cores with the rest of make test (the e2e package's control planes beside it), and at the
// default weight, one process's, its pods got a few percent of them: Ray's head then failed to
// register its raylet within the 30 s that Ray 2.60 hard-codes (node.py) and exited, again and again.
// It is a weight, not a limit: an idle node takes nothing from the host.
const NodeCPUShares = 8192

// nodeCPUSharesFile is cgroup v1's cpu.shares of the node's cgroup root (the cpu controller is on v1
// here, so cgroup2 has none to weigh).
var nodeCPUSharesFile = filepath.Join("/sys/fs/cgroup/cpu", cgroupRoot, "cpu.shares")

// weighNodeCPU gives the node's cgroup root its CPU weight.
func weighNodeCPU() error {
	if err := os.WriteFile(nodeCPUSharesFile, []byte(strconv.Itoa(NodeCPUShares)), 0o644); err != nil {
		return fmt.Errorf("the node's CPU weight: %w", err)
	}
	return nil
}

// NodeCPUWeight reads the cpu.shares of the node's cgroup root.
func NodeCPUWeight() (int, error) {
	b, err := os.ReadFile(nodeCPUSharesFile)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// cgroupDirs are the kubelet's cgroup root under every mounted cgroup hierarchy.
func cgroupDirs() []string {
	var dirs []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		if e.IsDir() || e.Type()&os.ModeSymlink != 0 {
			d := filepath.Join("/sys/fs/cgroup", e.Name())
			if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
				dirs = append(dirs, filepath.Join(d, cgroupRoot))
			}
		}
	}
	return dirs
}

// teardownRealNode undoes what the node changed outside itself, after its supervisor has exited
// (its processes, mounts, network namespace, veth and routes went with it): the kubelet's sysctls
// and its cgroups. It is a no-op for a control plane without a real node.
func teardownRealNode(cpDir string) error {
	dir := filepath.Join(cpDir, nodeSubdir)
	var undo nodeUndo
	b, err := os.ReadFile(filepath.Join(dir, undoFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &undo); err != nil {
		return err
	}
	var errs []error
	for s, v := range undo.Sysctls {
		if err := os.WriteFile("/proc/sys/"+s, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", s, err))
		}
	}
	for _, d := range cgroupDirs() {
		if err := removeCgroupTree(d); err != nil {
			errs = append(errs, err)
		}
	}
	// The veth goes with the node's network namespace; delete it in case a process still holds that.
	if _, err := net.InterfaceByName(hostVeth); err == nil {
		_ = exec.Command("ip", "link", "del", hostVeth).Run()
	}
	return errors.Join(errs...)
}

// removeCgroupTree removes a cgroup directory and its children, deepest first (cgroupfs only lets
// an empty cgroup go; a cgroup whose last process just died may need a moment).
func removeCgroupTree(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			if err := removeCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	var rmErr error
	for i := 0; i < 50; i++ {
		if rmErr = syscall.Rmdir(dir); rmErr == nil || errors.Is(rmErr, os.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, rmErr)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// KubeletSysctls reads the kernel-wide settings the kubelet changes (teardown restores them).
func KubeletSysctls() (map[string]string, error) {
	m := map[string]string{}
	for _, s := range kubeletSysctls {
		v, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			return nil, err
		}
		m[s] = strings.TrimSpace(string(v))
	}
	return m, nil
}

// RealNodeLeftovers lists whatever of a real node is still on the host: its veth, routes into it,
// processes of its binaries, mounts of its directories, cgroups. Empty after a clean teardown.
func RealNodeLeftovers() []string {
	var left []string
	if _, err := net.InterfaceByName(hostVeth); err == nil {
		left = append(left, "interface "+hostVeth)
	}
	if out, err := exec.Command("ip", "-4", "route", "show").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, hostVeth) || strings.HasPrefix(l, podsRoute) || strings.HasPrefix(l, ServiceCIDR) {
				left = append(left, "route "+l)
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/exe")
	for _, p := range procs {
		exe, err := os.Readlink(p)
		if err != nil {
			continue
		}
		base := filepath.Base(strings.TrimSuffix(exe, " (deleted)"))
		for _, prefix := range []string{"kubelet-", "kube-proxy-", "kube-scheduler-", "containerd", "ctr-", "realnode-", "pause", "runc"} {
			if strings.HasPrefix(base, prefix) {
				left = append(left, fmt.Sprintf("process %s (%s)", filepath.Dir(p), exe))
			}
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			// Pod network namespaces live under containerd's state directory, inside the node's mounts.
			if strings.Contains(l, "/"+nodeSubdir+"/") || strings.Contains(l, "containerd") || strings.Contains(l, "kubelet") {
				left = append(left, "mount "+l)
			}
		}
	}
	for _, d := range cgroupDirs() {
		if _, err := os.Stat(d); err == nil {
			left = append(left, "cgroup "+d)
		}
	}
	return left
}

// NodeInfo describes the real node for tools and people (make dev-cluster NODE=real writes it to
// .dev/node.json).
type NodeInfo struct {
	Name             string `json:"name"`
	IP               string `json:"ip"`
	PodCIDR          string `json:"podCIDR"`
	ServiceCIDR      string `json:"serviceCIDR"`
	KubeletVersion   string `json:"kubeletVersion"`
	ContainerRuntime string `json:"containerRuntime"`
	// TinyImage is an image already on the node (imagePullPolicy: Never).
	TinyImage string `json:"tinyImage"`
	// Registry is the private registry's host as the node knows it (htpasswd, TLS from the cluster CA);
	// RegistryPush is where the host reaches it, RegistryCA the CA to trust there.
	Registry     string `json:"registry"`
	RegistryPush string `json:"registryPush"`
	RegistryCA   string `json:"registryCA"`
	// PrivateImage is the Ray image in the registry, which only pulls with PullSecret (namespace/name, a
	// kubernetes.io/dockerconfigjson Secret holding the registry's account).
	PrivateImage string `json:"privateImage,omitempty"`
	PullSecret   string `json:"pullSecret,omitempty"`
	// ServiceProxy is an HTTP proxy on loopback to Services by their cluster names and to pod IPs
	// (curl -x).
	ServiceProxy string `json:"serviceProxy"`
	// Dir holds the node's configuration and its programs' logs.
	Dir string `json:"dir"`
}

// WriteNodeInfo pushes the private image (the Ray image, built into the cache on first use), creates
// the pull secret platform-secrets/regcred for it, and writes the real node's description as JSON to path.
func (c *ControlPlane) WriteNodeInfo(ctx context.Context, path string, logf func(string, ...any)) (*NodeInfo, error) {
	n, err := c.Kube.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	private, err := c.PushRayImage(ctx, logf)
	if err != nil {
		return nil, err
	}
	const ns, name = "platform-secrets", "regcred"
	if _, err := c.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	secret, err := c.RegistryPullSecret(ns, name)
	if err != nil {
		return nil, err
	}
	if _, err := c.Kube.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	info := &NodeInfo{Name: NodeName, IP: NodeIP, PodCIDR: PodCIDR, ServiceCIDR: ServiceCIDR,
		KubeletVersion: n.Status.NodeInfo.KubeletVersion, ContainerRuntime: n.Status.NodeInfo.ContainerRuntimeVersion,
		TinyImage: TinyImage, Dir: filepath.Join(c.Dir, nodeSubdir),
		Registry: RegistryHost, RegistryPush: registryAddr, RegistryCA: filepath.Join(c.Dir, "ca.crt"),
		PrivateImage: private, PullSecret: ns + "/" + name, ServiceProxy: c.ServiceProxyURL}
	return info, writeJSON(path, info)
}

// Kubectl builds kubectl v1.37.2 (e2e/tools/kube) into the cache unless it is there.
func Kubectl(ctx context.Context, logf func(string, ...any)) (string, error) {
	return ensureStep(ctx, func(bin string) buildStep { return kubeSteps(bin, "kubectl")[0] }, logf)
}

// PushRaysyncImage builds raysync's image as the Dockerfile's final stage describes it — the static
// /syncer, user 65532:65532, entrypoint /syncer — on an empty base instead of distroless (which
// cannot be fetched here; raysync needs none of its files: no shell, no CA bundle, it trusts the
// ServiceAccount's CA) and pushes it to the node's registry as raysync:tag. Returns the node's reference.
func (c *ControlPlane) PushRaysyncImage(ctx context.Context, tag string, logf func(string, ...any)) (string, error) {
	bin, err := BuildSyncer("syncer-image")
	if err != nil {
		return "", err
	}
	tool, err := EnsureImageTool(ctx, logf)
	if err != nil {
		return "", err
	}
	tar := filepath.Join(c.Dir, "raysync-image.tar")
	if out, err := exec.CommandContext(ctx, tool, "build", "-binary", bin, "-out", tar).CombinedOutput(); err != nil {
		return "", fmt.Errorf("image build: %v\n%s", err, out)
	}
	return c.PushImage(ctx, tar, "raysync:"+tag)
}

// Helm runs helm with its configuration, cache and registry logins inside the control plane's
// directory (never the user's home).
func (c *ControlPlane) Helm(ctx context.Context, logf func(string, ...any), args ...string) (string, error) {
	return c.helm(ctx, logf, "", args...)
}

func (c *ControlPlane) helm(ctx context.Context, logf func(string, ...any), stdin string, args ...string) (string, error) {
	helm, err := EnsureHelm(ctx, logf)
	if err != nil {
		return "", err
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	home := filepath.Join(c.Dir, "helm")
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data",
		"HELM_REGISTRY_CONFIG="+home+"/registry.json", "KUBECONFIG="+c.Kubeconfig)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w\n%s", args[0], err, out)
	}
	return string(out), nil
}

// RegistryChartRepo is where charts go in the node's registry (as the host reaches it).
const RegistryChartRepo = "oci://" + registryAddr + "/charts"

// PushChart packages deploy/helm/raysync at version and pushes it to the node's registry
// (helm push, OCI); `helm install raysync oci://198.18.0.2:5000/charts/raysync --version <version>`.
func (c *ControlPlane) PushChart(ctx context.Context, version string, logf func(string, ...any)) error {
	dir := filepath.Join(c.Dir, "charts")
	if _, err := c.Helm(ctx, logf, "package", "deploy/helm/raysync", "--version", version, "--app-version", version, "-d", dir); err != nil {
		return err
	}
	auth, err := os.ReadFile(filepath.Join(c.Dir, nodeSubdir, "registry/auth"))
	if err != nil {
		return err
	}
	user, pw, _ := strings.Cut(string(auth), ":")
	ca := filepath.Join(c.Dir, "ca.crt")
	if _, err := c.helm(ctx, logf, pw, "registry", "login", registryAddr, "--username", user, "--password-stdin", "--ca-file", ca); err != nil {
		return err
	}
	_, err = c.Helm(ctx, logf, "push", filepath.Join(dir, "raysync-"+version+".tgz"), RegistryChartRepo, "--ca-file", ca)
	return err
}

// ChartVersion is deploy/helm/raysync's version (Chart.yaml).
func ChartVersion() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy/helm/raysync/Chart.yaml"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "version:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", errors.New("no version in Chart.yaml")
}
