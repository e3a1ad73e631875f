// Command demo is `make demo`: raysync's main job end to end on a local control plane with stock
// KubeRay v1.6.1 and Ray in the loop (the kubelet and Ray stand-in). It starts (or reuses) the dev
// cluster in .dev/, creates a canonical token Secret, starts raysync, deploys a token-auth
// RayService and shows it Ready and serving, submits a job with the canonical token (accepted) and
// one with a wrong token (refused), walks the RayService through a blue-green upgrade to the end and
// through a token rotation, and prints what happened. Tokens are never printed. `make demo-down`
// stops everything.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

const (
	ns         = "ray-demo"
	sourceName = "ray-token"
	svcName    = "inference"
	// platformNS holds the registry credentials and the autoscaler's client certificate (in
	// production: filled by External Secrets Operator and cert-manager); raysync copies them.
	platformNS = "platform-secrets"
	apiProxy   = "https://k8s-api-proxy.example.internal:6443"
	// realAPIServer is where real Ray's autoscaler reaches the API server: the Node's relay to it.
	realAPIServer = "https://kubernetes.default.svc:443"
)

// realRay: the demo's pods run Ray 2.60 itself (the default), or emulated Ray (-emulated).
var realRay = true

func main() {
	down := flag.Bool("down", false, "stop raysync and the dev cluster started by the demo")
	emulated := flag.Bool("emulated", framework.RealRayDisabled(), "run the pods with emulated Ray instead of Ray "+framework.RayVersion)
	flag.Parse()
	realRay = !*emulated
	root, err := framework.RepoRoot()
	check(err)
	dir := filepath.Join(root, ".dev")
	if *down {
		stopSyncer(dir)
		if cp, err := framework.Attach(dir); err == nil {
			check(cp.Stop())
			_ = os.Remove(filepath.Join(dir, "pids"))
		}
		fmt.Println("demo stopped: raysync and the dev cluster are down")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	step("1. Local control plane: etcd, kube-apiserver, kube-controller-manager, stock KubeRay v1.6.1")
	cp := devCluster(ctx, dir)
	kube := cp.Kube

	step("2. The canonical token: one Secret (in production, filled by External Secrets Operator)")
	var annotations map[string]string
	if realRay {
		annotations = map[string]string{framework.StandInRay: "real"}
	}
	_, _ = kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Annotations: annotations}}, metav1.CreateOptions{})
	token := newToken()
	putSource(ctx, cp, token)
	fmt.Printf("   Secret %s/%s, key auth_token (value never printed)\n", ns, sourceName)
	putPlatformSecrets(ctx, cp)
	fmt.Printf("   plus %s/regcred (private registry) and %s/autoscaler-tls (client certificate for an authenticating API proxy)\n", platformNS, platformNS)

	step("3. Start raysync")
	metricsURL := startSyncer(ctx, root, dir, cp)
	fmt.Printf("   raysync --auth-source=%s/%s --namespaces=%s --pull-secret=%s/regcred \\\n     --autoscaler-tls-secret=%s/autoscaler-tls --autoscaler-api-server=%s \\\n     --webhook-addr=127.0.0.1:PORT --webhook-ips=127.0.0.1 --webhook-configuration=%s\n   logs: .dev/syncer.log, metrics: %s\n",
		ns, sourceName, ns, platformNS, platformNS, apiServer(), webhookName, metricsURL)
	fmt.Printf("   its admission webhook (MutatingWebhookConfiguration %s, failurePolicy Ignore) gives Ray pods their pull secret and\n   autoscaler TLS, and a new cluster's auth Secret the canonical token, as they are created\n", webhookName)

	step("4. Apply a token-auth RayService (private image, autoscaling); KubeRay creates its RayCluster")
	svc := rayService()
	if _, err := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		check(err)
	}
	created := time.Now()
	blue := waitNewCluster(ctx, cp, "")
	waitCanonical(ctx, cp, blue)
	show(ctx, cp)
	showPods(ctx, cp, blue, metricsURL)
	waitReady(ctx, cp, blue)
	fmt.Printf("   RayService %s Ready %s after it was applied (cluster %s active)\n", svcName, time.Since(created).Round(time.Second), blue)
	serving(ctx, cp)
	showProcessTokens(ctx, cp, blue, token)

	step("5. Ray jobs through the head Service, as Airflow or CI would submit them")
	if realRay {
		fmt.Println("   the first job needs a worker CPU: Ray's autoscaler asks the API server for a worker with raysync's client certificate")
	}
	submitJob(ctx, cp, "canonical token", token)
	if realRay {
		showWorkers(ctx, cp, blue)
	}
	submitJob(ctx, cp, "wrong token", "not-the-"+token)

	step("6. Blue-green upgrade: change the RayService, KubeRay starts a NEW cluster with a new name")
	headSeen := watchHeadPods(ctx, cp)
	upgrade := time.Now()
	_, err = cp.Dynamic.Resource(rayServiceGVR).Namespace(ns).Patch(ctx, svcName, types.MergePatchType,
		[]byte(`{"spec":{"rayClusterConfig":{"headGroupSpec":{"template":{"metadata":{"labels":{"model":"v2"}}}}}}}`), metav1.PatchOptions{})
	check(err)
	green := waitNewCluster(ctx, cp, blue)
	waitCanonical(ctx, cp, green)
	raceReport(ctx, cp, green, headSeen)
	waitReady(ctx, cp, green)
	fmt.Printf("   traffic switched to %s %s after the change: the RayService's Services select it\n", green, time.Since(upgrade).Round(time.Second))
	serving(ctx, cp)
	showProcessTokens(ctx, cp, green, token)
	waitGone(ctx, cp, blue)
	fmt.Printf("   old cluster %s deleted %s after the change (rayClusterDeletionDelaySeconds: %d): upgrade complete\n", blue, time.Since(upgrade).Round(time.Second), deletionDelay)
	show(ctx, cp)

	step("7. Rotate the canonical token (what ESO does when Vault rotates it)")
	fmt.Println("   Ray accepts only the token a process started with, so raysync never changes a running cluster's Secret:")
	fmt.Println("   it asks KubeRay for a new cluster (the RayService's own zero-downtime upgrade), which starts on the new token")
	start := time.Now()
	rotated := newToken()
	putSource(ctx, cp, rotated)
	fmt.Println("   (until the new cluster serves, the serving cluster accepts the previous token, as before)")
	next := waitNewCluster(ctx, cp, green)
	waitCanonical(ctx, cp, next)
	waitReady(ctx, cp, next)
	fmt.Printf("   traffic switched to %s %s after the rotation\n", next, time.Since(start).Round(time.Second))
	serving(ctx, cp)
	showProcessTokens(ctx, cp, next, rotated)
	submitJob(ctx, cp, "new token, on the new cluster", rotated)
	waitGone(ctx, cp, green)
	fmt.Printf("   old cluster %s deleted %s after the rotation: the RayService serves on the new token\n", green, time.Since(start).Round(time.Second))
	show(ctx, cp)
	metricsExcerpt(metricsURL)

	fmt.Printf(`
Keep exploring (raysync, the cluster and %s keep running):
  export KUBECONFIG=%s
  kubectl -n %s get rayservices,rayclusters,pods -o wide
  kubectl -n %s get secrets -o custom-columns=NAME:.metadata.name,SYNCED:.metadata.annotations.raysync\.dev/synced-at
  kubectl -n %s get events --field-selector source=raysync
  curl -s %s | grep ^raysync_
  curl -s %s/v1/clusters        # what each Ray cluster saw: requests per caller, 401/403, join failures
  curl -s -x %s http://%s-serve-svc.%s.svc.cluster.local:8000%s
  tail -f .dev/syncer.log .dev/standin.log
Stop everything: make demo-down
`, map[bool]string{true: "real Ray", false: "emulated Ray"}[realRay], filepath.Join(dir, "kubeconfig"), ns, ns, ns, metricsURL, cp.Ray.APIURL, cp.Ray.ClientProxyURL, svcName, ns, servePath())
}

// deletionDelay is the RayService's rayClusterDeletionDelaySeconds: how long the old cluster keeps
// running after traffic switched.
const deletionDelay = 10

var rayServiceGVR = kuberay.RayClusterGVR.GroupVersion().WithResource("rayservices")

func apiServer() string {
	if realRay {
		return realAPIServer
	}
	return apiProxy
}

// realServeConfig is e2e/ray/serveapp/hello.py, a replica that needs no CPU.
func realServeConfig() string {
	root, err := framework.RepoRoot()
	check(err)
	return "applications:\n  - name: hello\n    route_prefix: /\n    import_path: hello:app\n    runtime_env:\n      env_vars:\n        PYTHONPATH: " +
		filepath.Join(root, "e2e", "ray", "serveapp") + "\n    deployments:\n      - name: Hello\n        num_replicas: 1\n"
}

func rayService() *unstructured.Unstructured {
	if realRay {
		return realRayService()
	}
	container := func(name string) []any {
		return []any{map[string]any{"name": name, "image": "registry.example.internal/ml/ray:2.52.0"}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": svcName, "namespace": ns},
		"spec": map[string]any{
			"rayClusterDeletionDelaySeconds": int64(deletionDelay),
			"serveConfigV2":                  "applications:\n  - name: fruit\n    route_prefix: /fruit\n    import_path: fruit.deployment_graph\n",
			"rayClusterConfig": map[string]any{
				"rayVersion":              "2.52.0",
				"authOptions":             map[string]any{"mode": "token"},
				"enableInTreeAutoscaling": true,
				"headGroupSpec": map[string]any{"rayStartParams": map[string]any{},
					"template": map[string]any{"spec": map[string]any{"containers": container("ray-head")}}},
				"workerGroupSpecs": []any{map[string]any{"groupName": "gpu", "replicas": int64(2), "minReplicas": int64(0), "maxReplicas": int64(4),
					"rayStartParams": map[string]any{},
					"template":       map[string]any{"spec": map[string]any{"containers": container("ray-worker")}}}},
			},
		},
	}}
}

func devCluster(ctx context.Context, dir string) *framework.ControlPlane {
	if cp, err := framework.Attach(dir); err == nil && len(cp.Running()) == 5 && cp.Ray != nil {
		fmt.Println("   reusing the dev cluster already running in .dev/")
		c, err := framework.Connect(filepath.Join(dir, "kubeconfig"))
		check(err)
		c.Ray = cp.Ray
		if _, err := c.Ray.Network(ctx); realRay && err != nil {
			check(fmt.Errorf("the running dev cluster has no real Ray (%v): run `make dev-cluster-down` first, or `go run ./e2e/cmd/demo -emulated`", err))
		}
		return c
	}
	check(os.RemoveAll(dir))
	logf := func(f string, a ...any) { fmt.Printf("   "+f+"\n", a...) }
	var venv string
	if realRay {
		var err error
		venv, err = framework.EnsureRay(ctx, logf)
		check(err)
	}
	cp, err := framework.Start(ctx, framework.Options{KubeRayVersion: "v1.6.1", Dir: dir, Detached: true,
		StandIn: framework.StandInOptions{RayVenv: venv}, Logf: logf})
	check(err)
	b, err := os.ReadFile(cp.Kubeconfig)
	check(err)
	check(os.WriteFile(filepath.Join(dir, "kubeconfig"), b, 0o600))
	return cp
}

func putSource(ctx context.Context, cp *framework.ControlPlane, token string) {
	data := map[string][]byte{kuberay.AuthTokenKey: []byte(token)}
	cur, err := cp.Kube.CoreV1().Secrets(ns).Get(ctx, sourceName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cp.Kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sourceName, Namespace: ns},
			Type: corev1.SecretTypeOpaque, Data: data}, metav1.CreateOptions{})
		check(err)
		return
	}
	check(err)
	cur.Data = data
	_, err = cp.Kube.CoreV1().Secrets(ns).Update(ctx, cur, metav1.UpdateOptions{})
	check(err)
}

func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

// startSyncer builds bin/syncer and runs it detached, its pid in .dev/syncer.pid.
func startSyncer(ctx context.Context, root, dir string, cp *framework.ControlPlane) string {
	stopSyncer(dir)
	bin := filepath.Join(root, "bin", "syncer")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/syncer")
	build.Dir, build.Stdout, build.Stderr = root, os.Stdout, os.Stderr
	check(build.Run())
	port, err := framework.FreePort()
	check(err)
	probe, err := framework.FreePort()
	check(err)
	logf, err := os.Create(filepath.Join(dir, "syncer.log"))
	check(err)
	defer logf.Close()
	hook, err := framework.FreePort()
	check(err)
	api := cp.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	_ = api.Delete(ctx, webhookName, metav1.DeleteOptions{}) // an earlier demo's, with another port
	_, err = api.Create(ctx, framework.WebhookConfiguration(webhookName, hook, []string{ns}), metav1.CreateOptions{})
	check(err)
	cmd := exec.Command(bin, "--kubeconfig="+filepath.Join(dir, "kubeconfig"), "--auth-source="+ns+"/"+sourceName,
		"--namespaces="+ns, "--leader-election-namespace="+ns,
		"--pull-secret="+platformNS+"/regcred", "--autoscaler-tls-secret="+platformNS+"/autoscaler-tls", "--autoscaler-api-server="+apiServer(),
		fmt.Sprintf("--webhook-addr=127.0.0.1:%d", hook), "--webhook-ips=127.0.0.1", "--webhook-configuration="+webhookName,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", port), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", probe))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	check(cmd.Start())
	check(os.WriteFile(filepath.Join(dir, "syncer.pid"), []byte(strconv.Itoa(cmd.Process.Pid)+" "+bin), 0o644))
	check(wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", probe))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	}))
	// Ready means caches synced; wait for the leader Lease so the walkthrough starts with a leader.
	check(wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Kube.CoordinationV1().Leases(ns).Get(ctx, "raysync", metav1.GetOptions{})
		return err == nil && l.Spec.HolderIdentity != nil, nil
	}))
	return fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
}

func stopSyncer(dir string) {
	b, err := os.ReadFile(filepath.Join(dir, "syncer.pid"))
	if err != nil {
		return
	}
	pidStr, bin, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	pid, _ := strconv.Atoi(pidStr)
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil && strings.TrimSuffix(exe, " (deleted)") == bin {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 100; i++ {
			if _, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = os.Remove(filepath.Join(dir, "syncer.pid"))
}

// waitNewCluster waits for a RayService cluster other than exclude and returns its name.
func waitNewCluster(ctx context.Context, cp *framework.ControlPlane, exclude string) string {
	var name string
	check(wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.OriginatedFromNameLabel + "=" + svcName})
		if err != nil {
			return false, nil
		}
		for _, rc := range l.Items {
			if rc.GetName() != exclude {
				name = rc.GetName()
				return true, nil
			}
		}
		return false, nil
	}))
	fmt.Printf("   RayCluster %s created by RayService %s\n", name, svcName)
	return name
}

func waitCanonical(ctx context.Context, cp *framework.ControlPlane, cluster string) {
	check(wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		return matchesSource(ctx, cp, kuberay.CheckName(cluster)), nil
	}))
}

func matchesSource(ctx context.Context, cp *framework.ControlPlane, secret string) bool {
	src, err1 := cp.Kube.CoreV1().Secrets(ns).Get(ctx, sourceName, metav1.GetOptions{})
	s, err2 := cp.Kube.CoreV1().Secrets(ns).Get(ctx, secret, metav1.GetOptions{})
	return err1 == nil && err2 == nil && string(s.Data[kuberay.AuthTokenKey]) == string(src.Data[kuberay.AuthTokenKey])
}

// raceReport tells who created the new cluster's Secret and whether it held the canonical token
// before KubeRay created the head pod.
func raceReport(ctx context.Context, cp *framework.ControlPlane, cluster string, headSeen func(string) time.Time) {
	s, err := cp.Kube.CoreV1().Secrets(ns).Get(ctx, kuberay.CheckName(cluster), metav1.GetOptions{})
	check(err)
	creator := "KubeRay (raysync then replaced its random token)"
	if len(s.ManagedFields) > 0 && s.ManagedFields[0].Manager == "raysync" {
		creator = "raysync, before KubeRay: KubeRay adopted it as-is"
	}
	syncedAt, _ := time.Parse(time.RFC3339Nano, s.Annotations["raysync.dev/synced-at"])
	var head time.Time
	check(wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		head = headSeen(cluster)
		return !head.IsZero(), nil
	}))
	fmt.Printf("   Secret %s created by %s\n", s.Name, creator)
	if d := head.Sub(syncedAt); d >= 0 {
		fmt.Printf("   canonical token in place %s BEFORE KubeRay's head pod appeared\n", d.Round(time.Millisecond))
	} else {
		fmt.Printf("   canonical token in place %s after KubeRay's head pod appeared (its containers had not started)\n", (-d).Round(time.Millisecond))
	}
}

// watchHeadPods records when each cluster's head pod was first seen.
func watchHeadPods(ctx context.Context, cp *framework.ControlPlane) func(string) time.Time {
	w, err := cp.Kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: kuberay.NodeTypeLabel + "=head"})
	check(err)
	var mu sync.Mutex
	seen := map[string]time.Time{}
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				mu.Lock()
				if _, ok := seen[p.Labels[kuberay.ClusterLabel]]; !ok {
					seen[p.Labels[kuberay.ClusterLabel]] = time.Now()
				}
				mu.Unlock()
			}
		}
	}()
	return func(cluster string) time.Time {
		mu.Lock()
		defer mu.Unlock()
		return seen[cluster]
	}
}

func show(ctx context.Context, cp *framework.ControlPlane) {
	l, err := cp.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	check(err)
	sort.Slice(l.Items, func(i, j int) bool {
		return l.Items[i].GetCreationTimestamp().Time.Before(l.Items[j].GetCreationTimestamp().Time)
	})
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "   RAYCLUSTER\tRAYSERVICE\tAUTH SECRET\tHOLDS CANONICAL TOKEN\tSYNCED AT")
	for _, rc := range l.Items {
		name := kuberay.CheckName(rc.GetName())
		s, err := cp.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		synced := "-"
		if err == nil {
			synced = s.Annotations["raysync.dev/synced-at"]
		}
		yes := "no"
		if matchesSource(ctx, cp, name) {
			yes = "yes"
		}
		fmt.Fprintf(w, "   %s\t%s\t%s\t%s\t%s\n", rc.GetName(), rc.GetLabels()[kuberay.OriginatedFromNameLabel], name, yes, synced)
	}
	_ = w.Flush()
}

// recycled reads raysync_pods_recycled_total (all reasons).
func recycled(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	n := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "raysync_pods_recycled_total{") {
			var v float64
			if _, err := fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v); err == nil {
				n += v
			}
		}
	}
	return int(n)
}

func metricsExcerpt(url string) {
	resp, err := http.Get(url)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println("   raysync metrics:")
	for _, line := range strings.Split(string(b), "\n") {
		for _, p := range []string{"raysync_source_", "raysync_targets", "raysync_target_in_sync", "raysync_rotation_clusters", "raysync_rotations_performed_total", "raysync_sync_total", "raysync_propagation_seconds_count", "raysync_propagation_seconds_sum", "raysync_admission_requests_total", "raysync_pods_recycled_total"} {
			if strings.HasPrefix(line, p) {
				fmt.Println("     " + line)
			}
		}
	}
}

func putPlatformSecrets(ctx context.Context, cp *framework.ControlPlane) {
	_, _ = cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: platformNS}}, metav1.CreateOptions{})
	crt, key := selfSignedClientCert()
	ca := crt
	if realRay {
		// Real Ray's autoscaler talks to the real API server: a certificate its client CA signed, and
		// what KubeRay's own autoscaler Role grants.
		var err error
		crt, key, ca, err = cp.IssueClientCert(autoscalerUser, nil)
		check(err)
		grantAutoscaler(ctx, cp)
	}
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: platformNS}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"registry.example.internal":{"auth":"` + base64.StdEncoding.EncodeToString([]byte("ray:"+newToken())) + `"}}}`)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "autoscaler-tls", Namespace: platformNS}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca}},
	} {
		if _, err := cp.Kube.CoreV1().Secrets(platformNS).Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			check(err)
		}
	}
}

func selfSignedClientCert() (crt, key []byte) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ray-autoscaler"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(90 * 24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	check(err)
	kb, err := x509.MarshalECPrivateKey(k)
	check(err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// webhookName is the demo's MutatingWebhookConfiguration (URL-form: the API server calls raysync on 127.0.0.1).
const webhookName = "raysync-demo"

// showPods waits until KubeRay's pods carry raysync's pod-level entries and prints them, and how they
// got them: at creation (the webhook) or by recycling.
func showPods(ctx context.Context, cp *framework.ControlPlane, cluster, metricsURL string) {
	var pods []corev1.Pod
	check(wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster})
		if err != nil {
			return false, nil
		}
		pods = pods[:0]
		hasHead := false
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil {
				continue
			}
			if len(p.Spec.ImagePullSecrets) == 0 {
				return false, nil
			}
			if p.Labels[kuberay.NodeTypeLabel] == "head" {
				hasHead = true
				if autoscalerEnv(p)["RAY_KUBERAY_CLIENT_CERT_PATH"] == "" {
					return false, nil
				}
			}
			pods = append(pods, p)
		}
		want := 3 // the head and two workers
		if realRay {
			want = 1 // the head: the autoscaler adds workers when a job needs them
		}
		return hasHead && len(pods) >= want, nil
	}))
	if n := recycled(metricsURL); n == 0 {
		fmt.Println("   every pod was born with raysync's entries (the admission webhook added them at creation; 0 recycled):")
	} else {
		fmt.Printf("   %d pods created without raysync's entries were recycled; the pods now carry:\n", n)
	}
	for _, p := range pods {
		var refs []string
		for _, r := range p.Spec.ImagePullSecrets {
			refs = append(refs, r.Name)
		}
		fmt.Printf("     %-32s imagePullSecrets=%v\n", p.Name, refs)
		if p.Labels[kuberay.NodeTypeLabel] == "head" {
			env := autoscalerEnv(p)
			for _, k := range []string{"RAY_KUBERAY_CLIENT_CERT_PATH", "RAY_KUBERAY_CLIENT_KEY_PATH", "RAY_KUBERAY_CA_CERT_PATH", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT_HTTPS"} {
				fmt.Printf("       autoscaler %s=%s\n", k, env[k])
			}
		}
	}
}

func autoscalerEnv(p corev1.Pod) map[string]string {
	env := map[string]string{}
	for _, c := range p.Spec.Containers {
		if c.Name == "autoscaler" {
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
		}
	}
	return env
}

func step(s string) { fmt.Printf("\n== %s\n", s) }

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

const autoscalerUser = "ray-demo-autoscaler"

func servePath() string {
	if realRay {
		return "/"
	}
	return "/fruit"
}

// realRayService is the demo's RayService on real Ray: a private image, autoscaling with no
// service-account token (the autoscaler has only raysync's client certificate), a head that runs no
// tasks and serves hello.py, 1-CPU workers from 0 to 2.
func realRayService() *unstructured.Unstructured {
	image := framework.PrivateRegistry + "/ml/ray:" + framework.RayVersion
	container := func(name, mem string) []any {
		return []any{map[string]any{"name": name, "image": image, "resources": map[string]any{"limits": map[string]any{"cpu": "1", "memory": mem}}}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": svcName, "namespace": ns},
		"spec": map[string]any{
			"rayClusterDeletionDelaySeconds": int64(deletionDelay),
			"serveConfigV2":                  realServeConfig(),
			"rayClusterConfig": map[string]any{
				"rayVersion":              framework.RayVersion,
				"authOptions":             map[string]any{"mode": "token"},
				"enableInTreeAutoscaling": true,
				"headGroupSpec": map[string]any{"rayStartParams": map[string]any{"num-cpus": "0", "object-store-memory": "100000000"},
					"template": map[string]any{"spec": map[string]any{"automountServiceAccountToken": false, "containers": container("ray-head", "2Gi")}}},
				"workerGroupSpecs": []any{map[string]any{"groupName": "cpu", "replicas": int64(0), "minReplicas": int64(0), "maxReplicas": int64(2),
					"rayStartParams": map[string]any{"num-cpus": "1", "object-store-memory": "100000000"},
					"template":       map[string]any{"spec": map[string]any{"containers": container("ray-worker", "1Gi")}}}},
			},
		},
	}}
}

// grantAutoscaler gives the autoscaler's certificate user what KubeRay's autoscaler Role grants.
func grantAutoscaler(ctx context.Context, cp *framework.ControlPlane) {
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{"ray.io"}, Resources: []string{"rayclusters"}, Verbs: []string{"get", "patch"}}}}
	if _, err := cp.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		check(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: autoscalerUser}}}
	if _, err := cp.Kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		check(err)
	}
}
