package framework

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Prebuild builds into the cache everything that make test's e2e packages (e2e, e2e/realnode) and
// the bench's smoke test would otherwise build on first use, and returns when all of it is there.
//
// Inside the tests, the two e2e packages each built what their first test needed while the other's
// tests ran, one build at a time behind the cache's build lock, so each package's tests waited for
// builds the other had started: on 2 cores with empty Go caches make test took 73–83 minutes. Here
// the Go builds run back to back, each module's binaries in one `go build` that keeps both cores
// busy, in the order the tests need them, while what waits on the network and the disk — Debian's
// packages, Ray's wheels, the Ray image's root filesystem — runs beside them. With a warm cache it
// returns in seconds.
//
// With first set it builds only what the two e2e packages need before their first test (the
// control plane, both KubeRay operators, the node, helm, kubectl, Ray and the Ray image), and leaves
// the tools that single tests use later (promql, promtool, the browser, External Secrets Operator
// for the bench) to a second call, which make test runs at low priority beside the tests: their
// tests use about one core of two.
func Prebuild(ctx context.Context, first bool, logf func(string, ...any)) error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	cache, err := CacheDir()
	if err != nil {
		return err
	}
	bin := filepath.Join(cache, "bin")
	if err := os.MkdirAll(filepath.Join(bin, "cni-plugins-"+CNIPluginsVersion), 0o755); err != nil {
		return err
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	var pkgErr error
	toolDone := make(chan struct{})
	var once sync.Once
	done := func() { once.Do(func() { close(toolDone) }) }
	wg.Add(1)
	go func() {
		defer wg.Done()
		pkgErr = prebuildPackages(ctx, root, cache, toolDone, logf)
	}()
	goErr := prebuildGo(ctx, root, bin, first, done, logf)
	done()
	wg.Wait()
	if goErr != nil {
		return goErr
	}
	if pkgErr != nil {
		return pkgErr
	}
	if first && os.Geteuid() == 0 {
		// The node's images, assembled from what was just built (seconds). Not in the second call:
		// it runs beside the tests, whose nodes read these files.
		if _, err := EnsureNodeBinaries(ctx, logf); err != nil {
			return err
		}
	}
	if !first {
		if _, _, err := EnsureESO(ctx, logf); err != nil {
			return err
		}
	}
	logf("prebuild (first: %v): done in %s", first, time.Since(t0).Round(time.Second))
	return nil
}

// prebuildGo runs every Go build of the e2e packages and the bench: first what the real node's tests
// need (they are the longest package), then the rest. The build lock is taken per module, so a
// caller that finds its output built never waits for the next one.
func prebuildGo(ctx context.Context, root, bin string, first bool, imageToolDone func(), logf func(string, ...any)) error {
	browser, err := sourceStep(root, "e2e/tools/browser")
	if err != nil {
		return err
	}
	rayclient, err := sourceStep(root, "e2e/tools/rayclient")
	if err != nil {
		return err
	}
	kuberay := func(v string) func() error {
		return func() error { _, err := EnsureBinaries(ctx, v, logf); return err }
	}
	phases := []func() error{
		stepsPhase(ctx, root, bin, logf, imageToolStep(bin)),
		// One go build for all six Kubernetes binaries (they share most of their packages).
		stepsPhase(ctx, root, bin, logf, append(controlPlaneSteps(bin)[:1], kubeSteps(bin,
			"kube-apiserver", "kube-controller-manager", "kubelet", "kube-proxy", "kube-scheduler", "kubectl")...)...),
		kuberay("v1.6.1"),
		stepsPhase(ctx, root, bin, logf, nodeSteps(bin)...),
		stepsPhase(ctx, root, bin, logf, helmStep(bin)),
	}
	for _, v := range KubeRayVersions {
		if v != "v1.6.1" {
			phases = append(phases, kuberay(v))
		}
	}
	// The syncer and the stand-in for this machine are built as the tests start; the other release
	// platforms, which only TestRealNodeRelease needs (late in its package), compile beside the tests:
	// from an empty Go cache they took 7m46s of the first call's 24 minutes, both cores busy.
	platforms := []string{"linux/amd64"}
	if !first {
		platforms = ReleasePlatforms
	}
	phases = append(phases, stepsPhase(ctx, root, bin, logf, rayclient(bin)), func() error { return compileRepo(ctx, root, platforms, logf) })
	if !first {
		phases = append(phases, stepsPhase(ctx, root, bin, logf, promqlStep(bin), promtoolStep(bin), browser(bin)), stepsPhase(ctx, root, bin, logf, esoStep(bin)))
	}
	for i, run := range phases {
		if err := run(); err != nil {
			return err
		}
		if i == 0 {
			imageToolDone()
		}
	}
	return nil
}

// ReleasePlatforms are the platforms a release ships the syncer for (tools/release); the image holds
// the linux ones.
var ReleasePlatforms = []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64"}

// compileRepo compiles, without linking, what the tests build from this repository as their
// binaries are built (-trimpath, no cgo): the syncer for the given platforms (TestRealNodeRelease
// cross-builds all of ReleasePlatforms) and, on linux/amd64, the stand-in and the node's helpers.
// From an empty Go cache that is minutes of compiling each platform's client-go, which the tests
// would otherwise do on their own time; the outputs are discarded, the compiled packages stay in
// Go's build cache.
func compileRepo(ctx context.Context, root string, platforms []string, logf func(string, ...any)) error {
	t0 := time.Now()
	for _, p := range platforms {
		goos, goarch, _ := strings.Cut(p, "/")
		pkgs := []string{"./cmd/syncer", "./cmd/syncer/app"}
		if p == "linux/amd64" {
			pkgs = append(pkgs, "./e2e/cmd/standin", "./e2e/realnode/supervisor", "./e2e/realnode/pause")
		}
		// Two or more packages: go build compiles them and writes nothing.
		if err := goCmd(ctx, root, []string{"GOOS=" + goos, "GOARCH=" + goarch}, append([]string{"build", "-trimpath"}, pkgs...)...); err != nil {
			return err
		}
	}
	logf("compiled the syncer for %s and the stand-in in %s", strings.Join(platforms, ", "), time.Since(t0).Round(time.Second))
	return nil
}

// stepsPhase runs steps under the build lock.
func stepsPhase(ctx context.Context, root, bin string, logf func(string, ...any), steps ...buildStep) func() error {
	return func() error {
		unlock, err := lockFile(filepath.Join(filepath.Dir(bin), "build.lock"))
		if err != nil {
			return err
		}
		defer unlock()
		return runSteps(ctx, root, steps, logf)
	}
}

// prebuildPackages installs what waits on the network: the node's and the browser's Debian packages,
// Ray's virtualenv and the Ray image (which needs the image tool, the first Go build). All of it
// needs root; without root the tests that use it say so themselves.
func prebuildPackages(ctx context.Context, root, cache string, imageTool <-chan struct{}, logf func(string, ...any)) error {
	if os.Geteuid() != 0 {
		logf("prebuild: not root: no Debian packages, Ray or Ray image (the real node and real Ray need root)")
		return nil
	}
	if err := runPackageScript(ctx, cache, filepath.Join(root, "e2e/realnode/supervisor/install-packages.sh")); err != nil {
		return err
	}
	if err := runPackageScript(ctx, cache, filepath.Join(root, "e2e/tools/browser/install-chromium.sh")); err != nil {
		return err
	}
	if RealRayDisabled() {
		return nil
	}
	if _, err := EnsureRay(ctx, logf); err != nil {
		return err
	}
	// The image tool is the first Go build: wait for it rather than build it beside the others.
	<-imageTool
	if _, err := EnsureRayImage(ctx, logf); err != nil {
		return fmt.Errorf("Ray image: %w", err)
	}
	return nil
}
