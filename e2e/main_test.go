package e2e

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/raysync/raysync/e2e/framework"
)

// controlPlanes are the clusters every test runs against: one local control plane per KubeRay version,
// or the single cluster named by E2E_KUBECONFIG.
var controlPlanes []*framework.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	flag.Parse()
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		return 0
	}
	// No deadline of its own: a cold build of the control plane takes ~8 minutes on an idle 2-core
	// machine and much longer on a busy one; go test's -timeout bounds the whole run.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if kc := os.Getenv("E2E_KUBECONFIG"); kc != "" {
		// go test runs in the package directory; a relative path is meant from the repository root.
		if root, err := framework.RepoRoot(); err == nil && !filepath.IsAbs(kc) {
			kc = filepath.Join(root, kc)
		}
		cp, err := framework.Connect(kc)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: E2E_KUBECONFIG:", err)
			return 1
		}
		controlPlanes = []*framework.ControlPlane{cp}
	} else {
		versions := framework.KubeRayVersions
		if v := os.Getenv("E2E_KUBERAY_VERSIONS"); v != "" {
			versions = strings.Split(v, ",")
		}
		// Binaries first (sequentially, under a lock), then start the stacks side by side.
		for _, v := range versions {
			if _, err := framework.EnsureBinaries(ctx, v, logf); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
				return 1
			}
		}
		// Real Ray for the real-Ray tests (RAYSYNC_REAL_RAY=off skips them, saying so).
		var venv string
		if !framework.RealRayDisabled() {
			var err error
			if venv, err = framework.EnsureRay(ctx, logf); err != nil {
				fmt.Fprintln(os.Stderr, "e2e:", err)
				return 1
			}
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		var startErr error
		for _, v := range versions {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cp, err := framework.Start(ctx, framework.Options{KubeRayVersion: v, Logf: logf, StandIn: framework.StandInOptions{RayVenv: venv}})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					startErr = fmt.Errorf("KubeRay %s: %w", v, err)
					return
				}
				controlPlanes = append(controlPlanes, cp)
			}()
		}
		wg.Wait()
		defer stopAll()
		// In the order of versions, whichever started first: tests that take one control plane
		// (newestKubeRay) run on the same KubeRay version every time.
		slices.SortFunc(controlPlanes, func(a, b *framework.ControlPlane) int {
			return slices.Index(versions, a.KubeRayVersion) - slices.Index(versions, b.KubeRayVersion)
		})
		if startErr != nil {
			fmt.Fprintln(os.Stderr, "e2e:", startErr)
			return 1
		}
		// Ctrl-C or SIGTERM: stop the stacks before dying. (SIGKILL is covered by Pdeathsig.)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() {
			s := <-sig
			fmt.Fprintf(os.Stderr, "e2e: %v: stopping control planes\n", s)
			stopAll()
			os.Exit(1)
		}()
	}
	return m.Run()
}

var stopOnce sync.Once

func stopAll() {
	stopOnce.Do(func() {
		var wg sync.WaitGroup
		for _, cp := range controlPlanes {
			wg.Add(1)
			go func() { defer wg.Done(); _ = cp.Stop() }()
		}
		wg.Wait()
	})
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", args...)
}

// newestKubeRay is the control plane of the newest KubeRay version the run has (nil: none), for the
// tests whose outcome the operator's code does not decide.
func newestKubeRay() *framework.ControlPlane {
	if len(controlPlanes) == 0 {
		return nil
	}
	return controlPlanes[len(controlPlanes)-1]
}

// eachKubeRay runs f once per control plane (KubeRay version), the versions in parallel.
func eachKubeRay(t *testing.T, f func(t *testing.T, env *Env)) {
	t.Helper()
	for _, cp := range controlPlanes {
		t.Run("kuberay-"+cp.KubeRayVersion, func(t *testing.T) {
			t.Parallel()
			f(t, newEnv(t, cp))
		})
	}
}
