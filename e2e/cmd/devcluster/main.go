// Command devcluster starts or stops the local control plane used by `make dev-cluster`, `make demo`
// and `E2E_KUBECONFIG=.dev/kubeconfig make e2e`: etcd, kube-apiserver, kube-controller-manager, the
// kubelet and Ray stand-in and the stock KubeRay operator on loopback, left running in the background.
//
//	go run ./e2e/cmd/devcluster up [-kuberay v1.6.1] [-dir .dev] [-node standin|real]
//	go run ./e2e/cmd/devcluster down [-dir .dev]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/raysync/raysync/e2e/framework"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: devcluster up|down [-kuberay VERSION] [-dir DIR]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	version := fs.String("kuberay", envOr("KUBERAY_VERSION", "v1.6.1"), "KubeRay operator version (v1.5.1 or v1.6.1)")
	dir := fs.String("dir", ".dev", "state directory (PKI, data, logs, pids, kubeconfig)")
	node := fs.String("node", envOr("NODE", "standin"), "standin: the kubelet and Ray stand-in (hundreds of pods on 2 cores); real: a real node (kubelet, containerd, kube-proxy; needs root)")
	realRay := fs.Bool("real-ray", !framework.RealRayDisabled(), "install Ray "+framework.RayVersion+" and run real Ray in namespaces annotated "+framework.StandInRay+"=real")
	_ = fs.Parse(os.Args[2:])
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fail(err)
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
		info, err := cp.WriteNodeInfo(ctx, filepath.Join(abs, "node.json"))
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
