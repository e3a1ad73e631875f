// Command devcluster starts or stops the local control plane used by `make dev-cluster`, `make demo`
// and `E2E_KUBECONFIG=.dev/kubeconfig make e2e`: etcd, kube-apiserver, kube-controller-manager, the
// kubelet and Ray stand-in and the stock KubeRay operator on loopback, left running in the background.
//
//	go run ./e2e/cmd/devcluster up [-kuberay v1.6.1] [-dir .dev] [-node standin|real]
//	go run ./e2e/cmd/devcluster down [-dir .dev]
//	go run ./e2e/cmd/devcluster image|chart [-dir .dev] [-version V]   # push to a real node's registry
//	go run ./e2e/cmd/devcluster ray-image                              # build the Ray image into the cache
//	go run ./e2e/cmd/devcluster build [-first]                         # build what make test's e2e uses into the cache
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/raysync/raysync/e2e/framework"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down" && os.Args[1] != "image" && os.Args[1] != "chart" && os.Args[1] != "ray-image" && os.Args[1] != "build") {
		fmt.Fprintln(os.Stderr, "usage: devcluster up|down|image|chart|ray-image|build [-first] [-kuberay VERSION] [-dir DIR] [-node standin|real] [-version V]")
		os.Exit(2)
	}
	if os.Args[1] == "build" {
		first := len(os.Args) > 2 && os.Args[2] == "-first"
		if err := framework.Prebuild(context.Background(), first, func(f string, a ...any) { fmt.Printf(f+"\n", a...) }); err != nil {
			fail(err)
		}
		return
	}
	if os.Args[1] == "ray-image" {
		b, err := framework.EnsureRayImage(context.Background(), func(f string, a ...any) { fmt.Printf(f+"\n", a...) })
		if err != nil {
			fail(err)
		}
		fmt.Printf("%s (%d MiB; built now: %v)\n", b.Tar, b.TarBytes>>20, b.Built)
		return
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	version := fs.String("kuberay", envOr("KUBERAY_VERSION", "v1.6.1"), "KubeRay operator version (v1.5.1 or v1.6.1)")
	dir := fs.String("dir", ".dev", "state directory (PKI, data, logs, pids, kubeconfig)")
	node := fs.String("node", envOr("NODE", "standin"), "standin: the kubelet and Ray stand-in (hundreds of pods on 2 cores); real: a real node (kubelet, containerd, kube-proxy; needs root)")
	realRay := fs.Bool("real-ray", !framework.RealRayDisabled(), "install Ray "+framework.RayVersion+" and run real Ray in namespaces annotated "+framework.StandInRay+"=real")
	pushVersion := fs.String("version", "", "image tag and chart version for image and chart (default: the chart's version)")
	_ = fs.Parse(os.Args[2:])
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fail(err)
	}
	if os.Args[1] == "image" || os.Args[1] == "chart" {
		push(os.Args[1], abs, *pushVersion)
		return
	}
	if os.Args[1] == "down" {
		cp, err := framework.Attach(abs)
		if os.IsNotExist(err) {
			fmt.Println("no dev cluster recorded in", abs)
			return
		}
		if err != nil {
			fail(err)
		}
		if err := cp.Stop(); err != nil {
			fail(err)
		}
		_ = os.Remove(filepath.Join(abs, "pids"))
		fmt.Println("dev cluster stopped")
		return
	}

	if cp, err := framework.Attach(abs); err == nil && len(cp.Running()) > 0 {
		fail(fmt.Errorf("a dev cluster is already running from %s (%v); run `make dev-cluster-down` first", abs, cp.Running()))
	}
	// A fresh state directory each time: old etcd data would hold objects from a previous run.
	if err := os.RemoveAll(abs); err != nil {
		fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	if *node != "standin" && *node != "real" {
		fail(fmt.Errorf("-node %q: standin or real", *node))
	}
	var venv string
	if *realRay && *node == "standin" {
		if venv, err = framework.EnsureRay(ctx, logf); err != nil {
			fail(err)
		}
	}
	cp, err := framework.Start(ctx, framework.Options{
		KubeRayVersion: *version,
		Dir:            abs,
		Detached:       true,
		RealNode:       *node == "real",
		StandIn:        framework.StandInOptions{RayVenv: venv},
		Logf:           logf,
	})
	if err != nil {
		fail(err)
	}
	kubeconfig := filepath.Join(abs, "kubeconfig")
	b, err := os.ReadFile(cp.Kubeconfig)
	if err != nil {
		fail(err)
	}
	if err := os.WriteFile(kubeconfig, b, 0o600); err != nil {
		fail(err)
	}
	rel, _ := filepath.Rel(must(os.Getwd()), kubeconfig)
	if *node == "real" {
		info, err := cp.WriteNodeInfo(ctx, filepath.Join(abs, "node.json"), logf)
		if err != nil {
			fail(err)
		}
		fmt.Printf(`
Dev cluster is up: real kube-apiserver %s, KubeRay operator %s, and a real node %s (kubelet %s, %s)
at %s in network, mount and PID namespaces of its own; pods get addresses in %s, Services %s.
  export KUBECONFIG=%s
  kubectl get nodes -o wide
Node facts: %s    Logs: %s/*.log, %s/node/*.log    Stop it: make dev-cluster-down
`, framework.KubernetesVersion, *version, info.Name, info.KubeletVersion, info.ContainerRuntime, info.IP, framework.PodCIDR,
			framework.ServiceCIDR, rel, filepath.Join(abs, "node.json"), abs, abs)
		return
	}
	fmt.Printf(`
Dev cluster is up: real kube-apiserver %s, KubeRay operator %s, and a kubelet and Ray stand-in:
Ray pods start (bound to Node "standin", pod IPs 198.19.x.y that are data only) with emulated Ray inside.
  export KUBECONFIG=%s
  kubectl get crd rayclusters.ray.io
  curl -s %s/                 # the stand-in's JSON endpoint: requests per caller, 401/403, join failures, token fingerprints
  curl -s -x %s http://<cluster>-head-svc.<namespace>.svc.cluster.local:8265/api/jobs/ -H "Authorization: Bearer $TOKEN"
Logs: %s/*.log    Stop it: make dev-cluster-down
`, framework.KubernetesVersion, *version, rel, cp.Ray.APIURL, cp.Ray.ClientProxyURL, abs)
}

// push builds raysync's image or packages its chart and pushes it to the registry of the real node
// that `make dev-cluster NODE=real` started in dir.
func push(what, dir, version string) {
	cp, err := framework.Attach(dir)
	if err != nil || len(cp.Running()) == 0 {
		fail(fmt.Errorf("no dev cluster running from %s: make dev-cluster NODE=real first", dir))
	}
	if _, err := os.Stat(filepath.Join(dir, "node.json")); err != nil {
		fail(fmt.Errorf("the dev cluster in %s has no real node (no node.json): make dev-cluster NODE=real", dir))
	}
	if version == "" {
		if version, err = framework.ChartVersion(); err != nil {
			fail(err)
		}
	}
	logf := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
	ctx := context.Background()
	if what == "image" {
		ref, err := cp.PushRaysyncImage(ctx, version, logf)
		if err != nil {
			fail(err)
		}
		fmt.Printf("pushed %s (the node pulls it with the pull secret in node.json; helm --set image.repository=%s)\n", ref, strings.TrimSuffix(ref, ":"+version))
		return
	}
	if err := cp.PushChart(ctx, version, logf); err != nil {
		fail(err)
	}
	fmt.Printf("pushed %s/raysync:%s\n  KUBECONFIG=%s helm install raysync %s/raysync --version %s --ca-file %s -n raysync ...\n",
		framework.RegistryChartRepo, version, filepath.Join(dir, "kubeconfig"), framework.RegistryChartRepo, version, filepath.Join(dir, "ca.crt"))
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func must(s string, err error) string {
	if err != nil {
		fail(err)
	}
	return s
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "devcluster:", err)
	os.Exit(1)
}
