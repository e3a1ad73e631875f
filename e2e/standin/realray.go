package standin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
)

// AnnotationRay "real" on a namespace runs its pods' containers as real processes (real Ray from
// the harness's virtualenv) instead of the emulation.
const AnnotationRay = "standin.raysync.dev/ray"

// RealConfig enables real processes. Zero value: everything is emulated.
type RealConfig struct {
	Venv      string // Ray's virtualenv (its bin/ goes first on every container's PATH)
	Self      string // this binary, which runs each container under `standin sandbox`
	Dir       string // where pods keep their volumes, hosts file, /tmp, home and logs
	APIServer string // host:port of the API server, relayed to nodeIP:443 in the node network
}

// realRuntime runs real containers: the node network, the API relay, pods' files.
type realRuntime struct {
	cfg RealConfig
	net *nodeNetwork
}

func newRealRuntime(cfg RealConfig) (*realRuntime, error) {
	if cfg.Venv == "" {
		return nil, nil
	}
	if _, err := os.Stat(filepath.Join(cfg.Venv, "bin", "ray")); err != nil {
		return nil, fmt.Errorf("no Ray in %s: %w", cfg.Venv, err)
	}
	n, err := newNodeNetwork()
	if err != nil {
		return nil, err
	}
	r := &realRuntime{cfg: cfg, net: n}
	if err := r.relay(); err != nil {
		n.close()
		return nil, err
	}
	return r, nil
}

func (r *realRuntime) close() {
	if r != nil {
		r.net.close()
	}
}

// relay forwards nodeIP:443 in the node network to the API server, as a Service's ClusterIP would:
// what pods reach as https://kubernetes.default.svc (their hosts file names the Node's IP).
func (r *realRuntime) relay() error {
	l, err := r.net.listen(net.JoinHostPort(nodeIP, "443"))
	if err != nil {
		return fmt.Errorf("API relay: %w", err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", r.cfg.APIServer, 10*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				splice(c, up)
			}()
		}
	}()
	return nil
}

// splice copies both ways until either side ends.
func splice(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if t, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = t.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
}

// NetworkReport is how a client joins real pods' network (GET /v1/network): run it under `standin
// sandbox` in NetNS with ClientHosts as its /etc/hosts.
type NetworkReport struct {
	NetNS       string `json:"netns"`
	ClientHosts string `json:"clientHosts"`
	Venv        string `json:"venv"`
	Sandbox     string `json:"sandbox"` // the stand-in binary (`standin sandbox SPEC`)
	Dir         string `json:"dir"`     // the stand-in's directory for pods (clients may keep their files there)
}

func (r *realRuntime) clientHosts() string { return filepath.Join(r.cfg.Dir, "client-hosts") }

// writeClientHosts keeps the hosts file of clients in the node network: every Service by its
// cluster DNS names.
func (k *Kubelet) writeClientHosts() {
	for {
		writeIfChanged(k.real.clientHosts(), "127.0.0.1\tlocalhost\n"+k.serviceHosts(""))
		time.Sleep(time.Second)
	}
}

// realPod is what a real pod has besides its containers: its namespace, files and volumes.
type realPod struct {
	netns string
	dir   string
}

// setUpReal gives a bound real pod its network namespace and directories, then puts its volumes in
// place, waiting (its containers ContainerCreating) while a Secret or ConfigMap they need is missing.
func (p *podRuntime) setUpReal() bool {
	r := p.k.real
	p.mu.Lock()
	ip := p.ip
	p.mu.Unlock()
	if r == nil {
		p.waitAll("RealRayUnavailable", "this stand-in runs no real processes (no Ray virtualenv, or not root)")
		<-p.ctx.Done()
		return false
	}
	dir := filepath.Join(r.cfg.Dir, string(p.pod.UID))
	for _, d := range []string{"volumes", "tmp", "ray-tmp", "home", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			p.k.log.Error("pod directory", "pod", p.String(), "err", err)
			return false
		}
	}
	ns, err := r.net.addPod(ip)
	if err != nil {
		p.k.log.Error("pod network", "pod", p.String(), "err", err)
		p.waitAll("ContainerCreating", "pod network: "+err.Error())
		<-p.ctx.Done()
		return false
	}
	p.mu.Lock()
	p.real = &realPod{netns: ns, dir: dir}
	p.mu.Unlock()
	go func() { <-p.done; r.net.removePod(ns); _ = os.RemoveAll(dir) }()
	for {
		err := p.writeVolumes()
		if err == nil {
			break
		}
		p.waitAll("ContainerCreating", "MountVolume.SetUp failed: "+err.Error())
		if !sleep(p.ctx, p.k.cfg.Backoff) {
			return false
		}
	}
	p.writeHosts()
	go p.keepFilesCurrent()
	return true
}

func (p *podRuntime) waitAll(reason, msg string) {
	p.mu.Lock()
	for _, c := range append(append([]*containerRuntime{}, p.init...), p.main...) {
		c.state = waiting(reason, msg)
	}
	p.mu.Unlock()
	p.changed()
}

// keepFilesCurrent refreshes Secret and ConfigMap volumes and the hosts file, as the kubelet's sync
// loop and DNS would (a renewed certificate reaches a running process; a new head is found by name).
func (p *podRuntime) keepFilesCurrent() {
	for sleep(p.ctx, 2*time.Second) {
		if err := p.writeVolumes(); err != nil {
			p.k.log.Debug("refresh volumes", "pod", p.String(), "err", err)
		}
		p.writeHosts()
	}
}

func (p *podRuntime) volumeDir(name string) string {
	return filepath.Join(p.real.dir, "volumes", name)
}

// writeVolumes materialises the pod's Secret, ConfigMap and emptyDir volumes (files written only when
// their content changed). Other volume types stay empty directories.
func (p *podRuntime) writeVolumes() error {
	for _, v := range p.pod.Spec.Volumes {
		dir := p.volumeDir(v.Name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		var files map[string][]byte
		switch {
		case v.Secret != nil:
			s, err := p.k.objects.Secret(p.ctx, p.pod.Namespace, v.Secret.SecretName)
			if apierrors.IsNotFound(err) && isTrue(v.Secret.Optional) {
				continue
			} else if err != nil {
				return fmt.Errorf("secret %q: %w", v.Secret.SecretName, err)
			}
			files = projectKeys(s.Data, v.Secret.Items)
		case v.ConfigMap != nil:
			cm, err := p.k.objects.ConfigMap(p.ctx, p.pod.Namespace, v.ConfigMap.Name)
			if apierrors.IsNotFound(err) && isTrue(v.ConfigMap.Optional) {
				continue
			} else if err != nil {
				return fmt.Errorf("configmap %q: %w", v.ConfigMap.Name, err)
			}
			data := map[string][]byte{}
			for k, val := range cm.Data {
				data[k] = []byte(val)
			}
			files = projectKeys(data, v.ConfigMap.Items)
		default:
			continue
		}
		for rel, b := range files {
			path := filepath.Join(dir, rel)
			if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, b) {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := os.WriteFile(path, b, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

func projectKeys(data map[string][]byte, items []corev1.KeyToPath) map[string][]byte {
	out := map[string][]byte{}
	if len(items) == 0 {
		for k, v := range data {
			out[k] = v
		}
		return out
	}
	for _, it := range items {
		if v, ok := data[it.Key]; ok {
			out[it.Path] = v
		}
	}
	return out
}

// writeHosts writes the pod's /etc/hosts: itself, the API server (the Node's relay), and every
// Service of its namespace by the names cluster DNS gives it, each to a pod it selects.
func (p *podRuntime) writeHosts() {
	var b strings.Builder
	p.mu.Lock()
	ip := p.ip
	p.mu.Unlock()
	fmt.Fprintf(&b, "127.0.0.1\tlocalhost\n%s\t%s\n", ip, p.pod.Name)
	b.WriteString(p.k.serviceHosts(p.pod.Namespace))
	writeIfChanged(filepath.Join(p.real.dir, "hosts"), b.String())
}

// serviceHosts lists the API server and the Services of namespace ("": every namespace) as hosts
// file lines.
func (k *Kubelet) serviceHosts(namespace string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\tkubernetes kubernetes.default kubernetes.default.svc kubernetes.default.svc.%s\n", nodeIP, clusterDomain)
	svcs, _ := k.router.services.List(labels.Everything())
	sort.Slice(svcs, func(i, j int) bool { return svcs[i].Namespace+"/"+svcs[i].Name < svcs[j].Namespace+"/"+svcs[j].Name })
	for _, svc := range svcs {
		if (namespace != "" && svc.Namespace != namespace) || len(svc.Spec.Selector) == 0 {
			continue
		}
		target := k.serviceTarget(svc)
		if target == "" {
			continue
		}
		n, ns := svc.Name, svc.Namespace
		fmt.Fprintf(&b, "%s\t%s.%s.svc.%s %s.%s.svc %s.%s", target, n, ns, clusterDomain, n, ns, n, ns)
		if namespace != "" {
			b.WriteString(" " + n)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// serviceTarget is the IP a Service name resolves to: a ready pod it selects, else any with an IP
// (KubeRay's head Service publishes not-ready addresses).
func (k *Kubelet) serviceTarget(svc *corev1.Service) string {
	pods, _ := k.router.pods.Pods(svc.Namespace).List(labels.SelectorFromSet(svc.Spec.Selector))
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	fallback := ""
	for _, pod := range pods {
		if pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
			continue
		}
		if p := k.podByUID(string(pod.UID)); p != nil && p.ready() {
			return pod.Status.PodIP
		}
		if fallback == "" {
			fallback = pod.Status.PodIP
		}
	}
	return fallback
}

func writeIfChanged(path, content string) {
	if cur, err := os.ReadFile(path); err == nil && string(cur) == content {
		return
	}
	// In place, never by rename: the file is bind-mounted over /etc/hosts in running containers.
	_ = os.WriteFile(path, []byte(content), 0o644)
}

// runReal runs a container's command as a real process in the pod's namespaces until it exits or the
// pod goes away.
func (p *podRuntime) runReal(c *containerRuntime, env map[string]string) (int, string) {
	r := p.k.real
	spec := SandboxSpec{NetNS: p.real.netns, Env: realEnv(env, r.cfg.Venv, p.real.dir),
		Dir: c.spec.WorkingDir, Hostname: p.pod.Name,
		Log: filepath.Join(p.real.dir, "logs", fmt.Sprintf("%s-%d.log", c.spec.Name, c.restarts))}
	for _, a := range append(append([]string{}, c.spec.Command...), c.spec.Args...) {
		spec.Argv = append(spec.Argv, expand(a, env))
	}
	if len(spec.Argv) == 0 {
		spec.Argv = []string{"sleep", "infinity"} // an image's entrypoint: Ray images have none
	}
	// A container's own filesystem: its hosts file, and Ray's temp dir (/tmp/ray) unless a volume is
	// mounted there (KubeRay's ray-logs). (Ray puts its sockets under $TMPDIR/ray: TMPDIR stays unset,
	// as in an image, or the socket paths grow past 107 bytes.)
	spec.Hosts = filepath.Join(p.real.dir, "hosts")
	rayTmp := true
	for _, m := range c.spec.VolumeMounts {
		spec.Mounts = append(spec.Mounts, MountSpec{Source: filepath.Join(p.volumeDir(m.Name), m.SubPath), Target: m.MountPath, ReadOnly: m.ReadOnly})
		rayTmp = rayTmp && filepath.Clean(m.MountPath) != "/tmp/ray"
	}
	if rayTmp {
		spec.Mounts = append(spec.Mounts, MountSpec{Source: filepath.Join(p.real.dir, "ray-tmp"), Target: "/tmp/ray"})
	}
	cmd, err := SandboxCommand(r.cfg.Self, filepath.Join(p.real.dir, "sandbox-"+c.spec.Name+".json"), spec)
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		p.k.log.Error("start container", "pod", p.String(), "container", c.spec.Name, "err", err)
		return 128, "StartError"
	}
	p.mu.Lock()
	c.pid = cmd.Process.Pid
	c.logPath = spec.Log
	p.mu.Unlock()
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	if c.spec.ReadinessProbe != nil && !c.init {
		go p.probe(c, c.spec.ReadinessProbe, exited)
	} else if !c.init {
		p.setReady(c)
	}
	select {
	case <-exited:
	case <-p.ctx.Done():
		p.stopReal(cmd, exited)
	}
	code := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code = 128 + int(ws.Signal())
	}
	if code != 0 {
		if log, _ := os.ReadFile(spec.Log); bytes.Contains(log, []byte("InvalidAuthToken")) && p.cluster.name != "" {
			p.k.stats.joinFailure(p.cluster) // Ray: "Authentication token is missing or incorrect"
		}
		return code, "Error"
	}
	return 0, exitCompleted
}

// stopReal stops a container as the kubelet does: SIGTERM, then SIGKILL after the grace period (at
// most 10 s here, so that tests do not wait out Serve's 30 s drain).
func (p *podRuntime) stopReal(cmd *exec.Cmd, exited chan struct{}) {
	grace := 10 * time.Second
	if g := p.pod.Spec.TerminationGracePeriodSeconds; g != nil && time.Duration(*g)*time.Second < grace {
		grace = time.Duration(*g) * time.Second
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// realEnv is the container's environment for a real process: what the kubelet resolved, plus what the
// image would give (Ray's virtualenv first on PATH, a home of its own), no usage reporting, and
// gRPC's native resolver: there is no cluster DNS, names resolve from the pod's hosts file, which
// gRPC's default (c-ares) resolver does not read.
func realEnv(env map[string]string, venv, dir string) []string {
	out := map[string]string{"PATH": filepath.Join(venv, "bin") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME": filepath.Join(dir, "home"), "RAY_USAGE_STATS_ENABLED": "0", "LANG": "C.UTF-8", "GRPC_DNS_RESOLVER": "native"}
	for k, v := range env {
		if k == "PATH" {
			v = filepath.Join(venv, "bin") + ":" + v
		}
		out[k] = v
	}
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	list := make([]string, 0, len(keys))
	for _, k := range keys {
		list = append(list, k+"="+out[k])
	}
	return list
}

// probe runs a readiness probe until the container exits: the container is ready while it passes.
func (p *podRuntime) probe(c *containerRuntime, pr *corev1.Probe, exited chan struct{}) {
	period := time.Duration(max(pr.PeriodSeconds, 1)) * time.Second
	timeout := time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second
	failures, threshold := 0, int(max(pr.FailureThreshold, 1))
	if !sleep(p.ctx, time.Duration(pr.InitialDelaySeconds)*time.Second) {
		return
	}
	for {
		ok := p.probeOnce(c, pr, timeout)
		p.mu.Lock()
		was := c.ready
		switch {
		case ok:
			failures = 0
			c.ready = c.state.Running != nil
		default:
			failures++
			p.event(c, corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: ")
			if failures >= threshold {
				c.ready = false
			}
		}
		changed := was != c.ready
		p.mu.Unlock()
		if changed {
			p.changed()
		}
		select {
		case <-exited:
			return
		case <-p.ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

func (p *podRuntime) probeOnce(c *containerRuntime, pr *corev1.Probe, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(p.ctx, timeout)
	defer cancel()
	p.mu.Lock()
	ip, pid := p.ip, c.pid
	p.mu.Unlock()
	switch {
	case pr.HTTPGet != nil:
		port, ok := probePort(c.spec, pr.HTTPGet.Port.IntValue(), pr.HTTPGet.Port.StrVal)
		if !ok {
			return false
		}
		host := ip
		if pr.HTTPGet.Host != "" {
			host = pr.HTTPGet.Host
		}
		u := url.URL{Scheme: "http", Host: net.JoinHostPort(host, strconv.Itoa(port)), Path: pr.HTTPGet.Path}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		resp, err := (&http.Client{Transport: &http.Transport{DialContext: p.k.real.net.dial}}).Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	case pr.TCPSocket != nil:
		port, ok := probePort(c.spec, pr.TCPSocket.Port.IntValue(), pr.TCPSocket.Port.StrVal)
		if !ok {
			return false
		}
		conn, err := p.k.real.net.dial(ctx, "tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		conn.Close()
		return true
	case pr.Exec != nil && pid != 0:
		// In the container's mount, network and PID namespaces, as the runtime's exec would.
		args := append([]string{"-t", strconv.Itoa(pid), "-m", "-n", "-p", "--"}, pr.Exec.Command...)
		return exec.CommandContext(ctx, "nsenter", args...).Run() == nil
	}
	return false
}

func probePort(c *corev1.Container, port int, name string) (int, bool) {
	if port != 0 {
		return port, true
	}
	for _, cp := range c.Ports {
		if cp.Name == name {
			return int(cp.ContainerPort), true
		}
	}
	return 0, false
}

// realListener is a real pod's port, for the stand-in's proxies: a reverse proxy dialling the pod IP
// from the node network, counting the token verdicts of a head's dashboard as the emulation does.
func (p *podRuntime) realListener(port int) http.Handler {
	p.mu.Lock()
	ip, running := p.ip, len(p.main) > 0 && p.main[0].state.Running != nil
	p.mu.Unlock()
	if !running {
		return nil
	}
	target := &url.URL{Scheme: "http", Host: net.JoinHostPort(ip, strconv.Itoa(port))}
	rp := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target); r.Out.Host = r.In.Host },
		Transport:     &http.Transport{DialContext: p.k.real.net.dial, ResponseHeaderTimeout: time.Minute},
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			http.Error(w, "stand-in: "+err.Error(), http.StatusBadGateway)
		},
	}
	dashboard := p.role == roleHead && port == rayPort(&p.pod.Spec.Containers[0], dashboardPortName, dashboardPort)
	if !dashboard {
		return rp
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		rp.ServeHTTP(rec, r)
		v := accepted
		switch rec.status {
		case http.StatusUnauthorized:
			v = unauthenticated
		case http.StatusForbidden:
			v = forbidden
		}
		p.k.stats.request(p.cluster, callerOf(r.Context()), v)
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// dialPod connects to a real pod's address from the node network (for tunnels: Ray Client's gRPC).
func (k *Kubelet) dialPod(ctx context.Context, addr string) (net.Conn, error) {
	if k.real == nil {
		return nil, errors.New("no real pods")
	}
	return k.real.net.dial(ctx, "tcp", addr)
}

// expand is the kubelet's $(VAR) expansion of a container's command and args: $(NAME) becomes the
// value of NAME in the container's env, $$ is a literal $, and a reference to a variable the env
// does not have stays as written (k8s.io/kubernetes third_party/forked/golang/expansion).
func expand(s string, env map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i++
		case next == '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			name := s[i+2 : i+2+end]
			if v, ok := env[name]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(s[i : i+3+end])
			}
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}
