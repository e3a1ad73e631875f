// Package framework runs a real control plane on loopback for raysync's e2e tests:
// etcd, kube-apiserver, kube-controller-manager and the stock KubeRay operator, all
// built on demand from the Go module proxy into a git-ignored cache inside the repo.
package framework

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Pinned versions. The tools modules under e2e/tools hold their go.sum files.
const (
	EtcdVersion       = "v3.6.16"
	KubernetesVersion = "v1.37.2"
	kuberayModule     = "github.com/ray-project/kuberay/ray-operator"
)

// KubeRayVersions are the operator releases the suite runs against.
var KubeRayVersions = []string{"v1.5.1", "v1.6.1"}

// Binaries are the paths of everything the control plane runs.
type Binaries struct {
	Etcd, APIServer, ControllerManager, KubeRay string
	// KubeRayCRDs is the operator module's config/crd/bases directory.
	KubeRayCRDs string
}

// RepoRoot finds the raysync checkout from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/raysync/raysync\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the raysync repository (no go.mod for github.com/raysync/raysync above the working directory)")
		}
		dir = parent
	}
}

// CacheDir is where built binaries live: $RAYSYNC_CACHE_DIR or <repo>/.cache.
func CacheDir() (string, error) {
	if d := os.Getenv("RAYSYNC_CACHE_DIR"); d != "" {
		return filepath.Abs(d)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, ".cache"), nil
}

// EnsureBinaries builds whatever is missing for the given KubeRay version and returns the paths.
// A cold build takes ~8 minutes on 2 cores; afterwards it returns at once.
func EnsureBinaries(ctx context.Context, kuberayVersion string, logf func(string, ...any)) (*Binaries, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(cache, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return nil, err
	}
	// One build at a time per cache, also across processes (two test binaries, make dev-cluster).
	unlock, err := lockFile(filepath.Join(cache, "build.lock"))
	if err != nil {
		return nil, err
	}
	defer unlock()

	b := &Binaries{
		Etcd:              filepath.Join(bin, "etcd-"+EtcdVersion),
		APIServer:         filepath.Join(bin, "kube-apiserver-"+KubernetesVersion),
		ControllerManager: filepath.Join(bin, "kube-controller-manager-"+KubernetesVersion),
		KubeRay:           filepath.Join(bin, "kuberay-operator-"+kuberayVersion),
	}
	for _, s := range controlPlaneSteps(b, root) {
		if fileExists(s.out) {
			continue
		}
		logf("building %s (first run only; the whole control plane takes ~8 minutes cold)", filepath.Base(s.out))
		if err := goCmd(ctx, s.dir, nil, s.args...); err != nil {
			return nil, err
		}
		if err := os.Rename(s.out+".tmp", s.out); err != nil {
			return nil, err
		}
	}
	if !fileExists(b.KubeRay) {
		logf("building %s", filepath.Base(b.KubeRay))
		gobin, err := os.MkdirTemp(bin, "kuberay-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(gobin)
		// The operator module has no replace directives, so `go install module@version` builds it exactly.
		if err := goCmd(ctx, root, []string{"GOBIN=" + gobin}, "install", "-trimpath", kuberayModule+"@"+kuberayVersion); err != nil {
			return nil, err
		}
		if err := os.Rename(filepath.Join(gobin, "ray-operator"), b.KubeRay); err != nil {
			return nil, err
		}
	}
	dir, err := moduleDir(ctx, root, kuberayModule+"@"+kuberayVersion)
	if err != nil {
		return nil, err
	}
	b.KubeRayCRDs = filepath.Join(dir, "config", "crd", "bases")
	return b, nil
}

// buildStep is one `go build` of a control-plane binary into out.
type buildStep struct {
	out, dir string
	args     []string
}

// controlPlaneSteps are the builds of etcd and the two Kubernetes binaries: each stamped the way its
// release build is (Kubernetes reports its version from -X flags; etcd needs none).
func controlPlaneSteps(b *Binaries, root string) []buildStep {
	kube := fmt.Sprintf("-s -w -X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=%s",
		KubernetesVersion, strings.Split(KubernetesVersion, ".")[1])
	return []buildStep{
		{b.Etcd, filepath.Join(root, "e2e/tools/etcd"), []string{"build", "-trimpath", "-ldflags=-s -w", "-o", b.Etcd + ".tmp", "go.etcd.io/etcd/server/v3"}},
		{b.APIServer, filepath.Join(root, "e2e/tools/kube"), []string{"build", "-trimpath", "-ldflags=" + kube, "-o", b.APIServer + ".tmp", "k8s.io/kubernetes/cmd/kube-apiserver"}},
		{b.ControllerManager, filepath.Join(root, "e2e/tools/kube"), []string{"build", "-trimpath", "-ldflags=" + kube, "-o", b.ControllerManager + ".tmp", "k8s.io/kubernetes/cmd/kube-controller-manager"}},
	}
}

// toolArgs is the `go build` of a tool into out, with extra -X flags appended to -s -w.
func toolArgs(out, pkg, ldflags string) []string {
	return []string{"build", "-trimpath", "-ldflags=-s -w" + ldflags, "-o", out + ".tmp", pkg}
}

// EnsureTool builds package pkg of the tools module in dir (relative to the repository) into the
// cache as name, unless it is there already, and returns its path.
func EnsureTool(ctx context.Context, name, dir, pkg string, logf func(string, ...any)) (string, error) {
	return ensureTool(ctx, name, dir, pkg, "", logf)
}

func ensureTool(ctx context.Context, name, dir, pkg, ldflags string, logf func(string, ...any)) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(cache, "build.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	out := filepath.Join(bin, name)
	if fileExists(out) {
		return out, nil
	}
	logf("building %s (first run only)", name)
	if err := goCmd(ctx, filepath.Join(root, dir), nil, toolArgs(out, pkg, ldflags)...); err != nil {
		return "", err
	}
	return out, os.Rename(out+".tmp", out)
}

// HelmVersion is the helm the tests lint and render the chart with (built from e2e/tools/helm).
const HelmVersion = "v3.22.0"

// helmKubeVersion is the Kubernetes version helm assumes for `template` and `lint` without a cluster:
// helm's own release build sets it from the client-go it is built with (v0.37 for v3.22), a plain
// `go build` leaves helm's fallback v1.20, which fails the chart's kubeVersion.
const helmKubeVersion = "1.37"

// EnsureHelm builds helm into the cache if needed and returns its path.
func EnsureHelm(ctx context.Context, logf func(string, ...any)) (string, error) {
	return ensureTool(ctx, "helm-"+HelmVersion+"-k"+helmKubeVersion, "e2e/tools/helm", "helm.sh/helm/v3/cmd/helm", helmLdflags(), logf)
}

// helmLdflags are the -X flags helm's release build sets: its version and the Kubernetes version.
func helmLdflags() string {
	major, minor, _ := strings.Cut(helmKubeVersion, ".")
	var ldflags string
	for _, p := range []string{"helm.sh/helm/v3/pkg/chartutil", "helm.sh/helm/v3/pkg/lint/rules"} {
		ldflags += " -X " + p + ".k8sVersionMajor=" + major + " -X " + p + ".k8sVersionMinor=" + minor
	}
	return ldflags + " -X helm.sh/helm/v3/internal/version.version=" + HelmVersion
}

func moduleDir(ctx context.Context, root, modVersion string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", modVersion)
	cmd.Dir = root
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go mod download %s: %w", modVersion, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		return "", err
	}
	if m.Error != "" || m.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %s", modVersion, m.Error)
	}
	return m.Dir, nil
}

func goCmd(ctx context.Context, dir string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=readonly"), env...)
	var stderr bytes.Buffer
	cmd.Stdout = os.Stderr
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s (in %s): %w\n%s", strings.Join(args, " "), dir, err, stderr.String())
	}
	return nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

func lockFile(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
}

// ESOVersion is the External Secrets Operator `make bench` compares raysync with (built from
// e2e/tools/eso, whose go.mod repeats ESO's own replace directive).
const ESOVersion = "v0.16.2"

// EnsureESO builds External Secrets Operator into the cache if needed (~7 minutes cold on 2 cores)
// and returns the binary and the directory of its CRDs.
func EnsureESO(ctx context.Context, logf func(string, ...any)) (bin, crds string, err error) {
	bin, err = EnsureTool(ctx, "eso-"+ESOVersion, "e2e/tools/eso", "github.com/external-secrets/external-secrets", logf)
	if err != nil {
		return "", "", err
	}
	root, err := RepoRoot()
	if err != nil {
		return "", "", err
	}
	dir, err := moduleDir(ctx, root, "github.com/external-secrets/external-secrets@"+ESOVersion)
	if err != nil {
		return "", "", err
	}
	return bin, filepath.Join(dir, "config", "crds", "bases"), nil
}

// BuildSyncer builds raysync's cmd/syncer into <cache>/bin/<name> (e2e and bench run the real binary)
// and returns its path. Each caller names its own output, so concurrent runs never share a binary.
func BuildSyncer(name string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "bin", name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/syncer")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build syncer: %v\n%s", err, out)
	}
	return bin, nil
}
