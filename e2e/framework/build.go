// Package framework runs a real control plane on loopback for raysync's e2e tests:
// etcd, kube-apiserver, kube-controller-manager and the stock KubeRay operator, all
// built on demand from the Go module proxy into a git-ignored cache inside the repo.
package framework

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
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
	if err := runSteps(ctx, root, controlPlaneSteps(bin), logf); err != nil {
		return nil, err
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

// buildStep is the `go build` of package pkg of the module in dir (relative to the repository) into
// out, with flags (-ldflags, -tags) after -trimpath.
type buildStep struct {
	out, dir, pkg string
	flags         []string
}

// kubeLdflags stamp a Kubernetes binary the way its release build does (it reports its version from them).
func kubeLdflags() string {
	return fmt.Sprintf("-ldflags=-s -w -X k8s.io/component-base/version.gitVersion=%s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=%s",
		KubernetesVersion, strings.Split(KubernetesVersion, ".")[1])
}

// kubeSteps are the builds of the named commands of Kubernetes (e2e/tools/kube) into bin.
func kubeSteps(bin string, cmds ...string) []buildStep {
	var steps []buildStep
	for _, c := range cmds {
		steps = append(steps, buildStep{filepath.Join(bin, c+"-"+KubernetesVersion), "e2e/tools/kube", "k8s.io/kubernetes/cmd/" + c, []string{kubeLdflags()}})
	}
	return steps
}

// controlPlaneSteps are the builds of etcd (which needs no stamp) and the two Kubernetes binaries.
func controlPlaneSteps(bin string) []buildStep {
	return append([]buildStep{{filepath.Join(bin, "etcd-"+EtcdVersion), "e2e/tools/etcd", "go.etcd.io/etcd/server/v3", []string{"-ldflags=-s -w"}}},
		kubeSteps(bin, "kube-apiserver", "kube-controller-manager")...)
}

// toolStep is the build of a tool named name into bin, with extra -X flags appended to -s -w.
func toolStep(bin, name, dir, pkg, ldflags string, flags ...string) buildStep {
	return buildStep{filepath.Join(bin, name), dir, pkg, append([]string{"-ldflags=-s -w" + ldflags}, flags...)}
}

// runSteps builds the steps whose output is missing. Consecutive steps of one module with the same
// flags go to one `go build` (the go command then links one binary while it compiles the next, which
// keeps both cores busy); each output appears under its name only once complete. The caller holds
// the cache's build lock.
func runSteps(ctx context.Context, root string, steps []buildStep, logf func(string, ...any)) error {
	var todo []buildStep
	for _, s := range steps {
		if !fileExists(s.out) {
			todo = append(todo, s)
		}
	}
	for len(todo) > 0 {
		n := 1
		for n < len(todo) && todo[n].dir == todo[0].dir && slices.Equal(todo[n].flags, todo[0].flags) {
			n++
		}
		group := todo[:n]
		todo = todo[n:]
		var names, pkgs []string
		for _, s := range group {
			names = append(names, filepath.Base(s.out))
			pkgs = append(pkgs, s.pkg)
		}
		logf("building %s (first run only)", strings.Join(names, ", "))
		t0 := time.Now()
		if len(group) == 1 {
			args := append(append([]string{"build", "-trimpath"}, group[0].flags...), "-o", group[0].out+".tmp", group[0].pkg)
			if err := goCmd(ctx, filepath.Join(root, group[0].dir), nil, args...); err != nil {
				return err
			}
			if err := os.Rename(group[0].out+".tmp", group[0].out); err != nil {
				return err
			}
		} else {
			tmp, err := os.MkdirTemp(filepath.Dir(group[0].out), "build-")
			if err != nil {
				return err
			}
			args := append(append(append([]string{"build", "-trimpath"}, group[0].flags...), "-o", tmp+string(filepath.Separator)), pkgs...)
			err = goCmd(ctx, filepath.Join(root, group[0].dir), nil, args...)
			for _, s := range group {
				if err == nil {
					err = os.Rename(filepath.Join(tmp, commandName(s.pkg)), s.out)
				}
			}
			os.RemoveAll(tmp)
			if err != nil {
				return err
			}
		}
		logf("built %s in %s", strings.Join(names, ", "), time.Since(t0).Round(time.Second))
	}
	return nil
}

// commandName is the file name `go build -o dir/` gives package pkg's command: the last element of
// its path, or the one before a major-version suffix (go.etcd.io/etcd/server/v3 → server), as the go
// command names it.
func commandName(pkg string) string {
	base := path.Base(pkg)
	// The go command's rule (isVersionElement): v2, v3, … but not v0, v1 or v01.
	if base != pkg && len(base) >= 2 && base[0] == 'v' && base[1] != '0' && base != "v1" && strings.Trim(base[1:], "0123456789") == "" {
		return path.Base(path.Dir(pkg))
	}
	return base
}

// sourceStep is the build of the program in dir, a tools module whose main.go is this repository's,
// cached as <base of dir>-<hash of its main.go, go.mod and go.sum>: an edit rebuilds it.
func sourceStep(root, dir string) (func(bin string) buildStep, error) {
	h := sha256.New()
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, dir, f))
		if err != nil {
			return nil, err
		}
		h.Write(b)
	}
	name := path.Base(dir) + "-" + hex.EncodeToString(h.Sum(nil))[:12]
	return func(bin string) buildStep { return toolStep(bin, name, dir, ".", "") }, nil
}

// ensureStep runs the build step unless its output is there (checked first without the build lock,
// so a finished tool never waits for another's build) and returns the output's path.
func ensureStep(ctx context.Context, step func(bin string) buildStep, logf func(string, ...any)) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(cache, "bin")
	s := step(bin)
	if fileExists(s.out) {
		return s.out, nil
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(cache, "build.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	return s.out, runSteps(ctx, root, []buildStep{s}, logf)
}

// HelmVersion is the helm the tests lint and render the chart with (built from e2e/tools/helm).
const HelmVersion = "v3.22.0"

// helmKubeVersion is the Kubernetes version helm assumes for `template` and `lint` without a cluster:
// helm's own release build sets it from the client-go it is built with (v0.37 for v3.22), a plain
// `go build` leaves helm's fallback v1.20, which fails the chart's kubeVersion.
const helmKubeVersion = "1.37"

// EnsureHelm builds helm into the cache if needed and returns its path.
func EnsureHelm(ctx context.Context, logf func(string, ...any)) (string, error) {
	return ensureStep(ctx, helmStep, logf)
}

func helmStep(bin string) buildStep {
	return toolStep(bin, "helm-"+HelmVersion+"-k"+helmKubeVersion, "e2e/tools/helm", "helm.sh/helm/v3/cmd/helm", helmLdflags())
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
	bin, err = ensureStep(ctx, esoStep, logf)
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

func esoStep(bin string) buildStep {
	return toolStep(bin, "eso-"+ESOVersion, "e2e/tools/eso", "github.com/external-secrets/external-secrets", "")
}

// ImageToolName names the cached build of e2e/tools/image; bump it when the tool changes.
const ImageToolName = "image-7"

func imageToolStep(bin string) buildStep {
	return toolStep(bin, ImageToolName, "e2e/tools/image", ".", "")
}

// EnsureImageTool builds e2e/tools/image (go-containerregistry: images without a Docker engine).
func EnsureImageTool(ctx context.Context, logf func(string, ...any)) (string, error) {
	return ensureStep(ctx, imageToolStep, logf)
}

// EnsurePromQL builds e2e/tools/promql (Prometheus' PromQL parser in a program).
func EnsurePromQL(ctx context.Context, logf func(string, ...any)) (string, error) {
	return ensureStep(ctx, promqlStep, logf)
}

func promqlStep(bin string) buildStep { return toolStep(bin, "promql", "e2e/tools/promql", ".", "") }

// EnsurePromtool builds Prometheus' promtool (e2e/tools/promtool) for its rule tester. It is built
// with -tags remove_all_sd, Prometheus' own build option that leaves out the service discoveries
// (and their cloud SDKs): the rule tester uses none, and they were 60% of its cold build.
func EnsurePromtool(ctx context.Context, logf func(string, ...any)) (string, error) {
	return ensureStep(ctx, promtoolStep, logf)
}

func promtoolStep(bin string) buildStep {
	return toolStep(bin, "promtool-remove_all_sd", "e2e/tools/promtool", "github.com/prometheus/prometheus/cmd/promtool", "", "-tags=remove_all_sd")
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
