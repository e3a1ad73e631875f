package framework

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/raysync/raysync/e2e/standin"
)

// Real Ray: the harness installs Ray from the Python package index into a virtualenv under the cache
// (from the hash-pinned e2e/ray/requirements.txt, on first use, as it builds the control-plane
// binaries), and the stand-in runs real Ray processes for the pods of namespaces annotated
// standin.raysync.dev/ray=real.

// RayVersion is the Ray release the real-Ray tests run: the first with the autoscaler's client
// certificate (RAY_KUBERAY_CLIENT_CERT_PATH) is 2.59.0.
const RayVersion = "2.60.0"

// StandInRay is the namespace annotation that makes the stand-in run real Ray ("real").
const StandInRay = standin.AnnotationRay

// RealRayOff is the environment variable that turns real Ray off ("off"): real-Ray tests then skip,
// saying so. Without it a machine that cannot install or run Ray fails those tests.
const RealRayOff = "RAYSYNC_REAL_RAY"

// RealRayDisabled reports whether RAYSYNC_REAL_RAY=off.
func RealRayDisabled() bool { return os.Getenv(RealRayOff) == "off" }

// EnsureRay installs Ray into <cache>/ray-<version> unless it is there (or its lock file changed) and
// returns the virtualenv. It needs Python 3.11 with venv and pip, root and iproute2 (for the pods'
// network namespaces).
func EnsureRay(ctx context.Context, logf func(string, ...any)) (string, error) {
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("real Ray pods need root (network and mount namespaces); set %s=off to run without real Ray", RealRayOff)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "", fmt.Errorf("real Ray pods need iproute2's ip; set %s=off to run without real Ray", RealRayOff)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	lock, err := os.ReadFile(filepath.Join(root, "e2e", "ray", "requirements.txt"))
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	// A lock of its own: pip waits on the network, and the Go builds (build.lock) go on meanwhile.
	unlock, err := lockFile(filepath.Join(cache, "ray.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	venv := filepath.Join(cache, "ray-"+RayVersion)
	marker := filepath.Join(venv, ".installed")
	if b, err := os.ReadFile(marker); err == nil && string(b) == want {
		return venv, nil
	}
	python, err := python311(ctx)
	if err != nil {
		return "", err
	}
	logf("installing Ray %s into %s (first run only; ~1 minute)", RayVersion, venv)
	if err := os.RemoveAll(venv); err != nil {
		return "", err
	}
	// The virtualenv's scripts name its path: it is built where it stays, and counts as installed
	// only once the marker is written.
	steps := [][]string{
		{python, "-m", "venv", venv},
		{filepath.Join(venv, "bin", "pip"), "install", "--no-cache-dir", "--disable-pip-version-check", "--require-hashes", "--no-deps",
			"-r", filepath.Join(root, "e2e", "ray", "requirements.txt")},
	}
	for _, s := range steps {
		cmd := exec.CommandContext(ctx, s[0], s[1:]...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("install Ray (%s): %v\n%s\nset %s=off to run without real Ray", strings.Join(s, " "), err, lastLines(out.String(), 20), RealRayOff)
		}
	}
	return venv, os.WriteFile(marker, []byte(want), 0o644)
}

// python311 finds a Python 3.11 (the lock file pins CPython 3.11 wheels).
func python311(ctx context.Context) (string, error) {
	for _, name := range []string{"python3.11", "python3"} {
		path, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		out, err := exec.CommandContext(ctx, path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])").Output()
		if err == nil && strings.TrimSpace(string(out)) == "3.11" {
			return path, nil
		}
	}
	return "", fmt.Errorf("real Ray needs Python 3.11 (e2e/ray/requirements.txt pins cp311 wheels); set %s=off to run without real Ray", RealRayOff)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Network is how a client joins the real pods' network (nil error only when the stand-in runs real Ray).
func (r *RayStandIn) Network(ctx context.Context) (standin.NetworkReport, error) {
	var n standin.NetworkReport
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, r.APIURL+"/v1/network", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return n, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return n, fmt.Errorf("stand-in: %s", strings.TrimSpace(string(b)))
	}
	return n, json.NewDecoder(resp.Body).Decode(&n)
}

// RayClient is a command run as a client in the pods' network (Service names resolve as in the
// cluster), with Ray's virtualenv on its PATH: `ray job submit`, a Python client, `ray start`.
type RayClient struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// StartRayClient starts argv with env (besides PATH and HOME) as a client in the pods' network.
func (r *RayStandIn) StartRayClient(ctx context.Context, env map[string]string, argv ...string) (*RayClient, error) {
	n, err := r.Network(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(n.Dir, "client-")
	if err != nil {
		return nil, err
	}
	full := map[string]string{"PATH": filepath.Join(n.Venv, "bin") + ":/usr/local/bin:/usr/bin:/bin", "HOME": dir,
		"RAY_USAGE_STATS_ENABLED": "0", "LANG": "C.UTF-8", "GRPC_DNS_RESOLVER": "native"}
	for k, v := range env {
		full[k] = v
	}
	var list []string
	for k, v := range full {
		list = append(list, k+"="+v)
	}
	sort.Strings(list)
	rayTmp := filepath.Join(dir, "ray")
	if err := os.Mkdir(rayTmp, 0o755); err != nil {
		return nil, err
	}
	spec := standin.SandboxSpec{NetNS: n.NetNS, Hosts: n.ClientHosts, Env: list, Argv: argv, Dir: dir, Log: filepath.Join(dir, "output"),
		Mounts: []standin.MountSpec{{Source: rayTmp, Target: "/tmp/ray"}}}
	cmd, err := standin.SandboxCommand(n.Sandbox, filepath.Join(dir, "spec.json"), spec)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &RayClient{cmd: cmd, log: spec.Log, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
		case <-c.done:
		}
	}()
	return c, nil
}

// RunRayClient runs a client to its end (at most timeout) and returns its output and exit code.
func (r *RayStandIn) RunRayClient(ctx context.Context, timeout time.Duration, env map[string]string, argv ...string) (string, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := r.StartRayClient(ctx, env, argv...)
	if err != nil {
		return "", 0, err
	}
	code, err := c.Wait(ctx)
	return c.Output(), code, err
}

// Wait waits for the client to end and returns its exit code.
func (c *RayClient) Wait(ctx context.Context) (int, error) {
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode(), nil
	case <-ctx.Done():
		_ = c.cmd.Process.Kill()
		<-c.done
		return -1, errors.New("client did not finish in time")
	}
}

// Stop ends the client (SIGTERM) and waits for it.
func (c *RayClient) Stop() {
	_ = c.cmd.Process.Signal(os.Interrupt)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// Output is what the client printed so far (stdout and stderr).
func (c *RayClient) Output() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}
