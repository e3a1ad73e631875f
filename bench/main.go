// Command bench measures raysync on a fresh local control plane (no KubeRay operator: the bench
// creates RayClusters and KubeRay-shaped auth Secrets itself to reach scale) and prints a Markdown
// table; the numbers go to bench/results/latest.json.
//
//	go run ./bench                 # N = 100, 1000, 5000; idle 5 min; M = 0 and 20,000 unrelated Secrets
//	go run ./bench -smoke          # tiny N and M, seconds
//
// Scenarios so far: rotation fan-out vs. a minimal client, idle cost, memory. Still to come (issue
// #6): the new-cluster race with the operator running, and External Secrets Operator side by side.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

type result struct {
	Commit   string           `json:"commit"`
	CPUs     int              `json:"cpus"`
	Smoke    bool             `json:"smoke"`
	Rotation []rotationResult `json:"rotation"`
	Idle     *idleResult      `json:"idle,omitempty"`
	Memory   []memoryResult   `json:"memory"`
}

type rotationResult struct {
	N             int     `json:"n"`
	P50Ms         float64 `json:"p50_ms"`
	P99Ms         float64 `json:"p99_ms"`
	LastMs        float64 `json:"last_ms"`
	Writes        int     `json:"target_writes"`
	MinimalLastMs float64 `json:"minimal_client_last_ms"`
	Ratio         float64 `json:"ratio_to_minimal"`
}

type idleResult struct {
	N              int     `json:"n"`
	Seconds        float64 `json:"seconds"`
	Writes         int     `json:"target_writes"`
	RequestsPerSec float64 `json:"api_requests_per_s"`
}

type memoryResult struct {
	N, M      int
	PeakRSSMi float64 `json:"peak_rss_mib"`
}

func main() {
	smoke := flag.Bool("smoke", false, "tiny sizes, a few seconds")
	out := flag.String("out", "bench/results/latest.json", "where to write the numbers")
	flag.Parse()
	ns := []int{100, 1000, 5000}
	idleFor, memN, memM := 5*time.Minute, 1000, 20000
	if *smoke {
		ns, idleFor, memN, memM = []int{20}, 5*time.Second, 20, 200
	}
	ctx := context.Background()
	cp, err := framework.Start(ctx, framework.Options{KubeRayVersion: "v1.6.1", NoOperator: true,
		Logf: func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) }})
	check(err)
	defer cp.Stop()
	bin := buildSyncer()
	res := result{Commit: gitCommit(), CPUs: runtime.NumCPU(), Smoke: *smoke}

	// Memory: raysync's peak RSS with N clusters, before and after M unrelated 8 KiB Secrets exist.
	b := &bench{cp: cp, bin: bin, ns: "memory"}
	b.setup(memN)
	for _, m := range []int{0, memM} {
		if m > 0 {
			b.unrelatedSecrets(m)
		}
		s := b.startSyncer("--all-namespaces")
		b.waitAll(memN, b.token)
		time.Sleep(2 * time.Second)
		res.Memory = append(res.Memory, memoryResult{N: memN, M: m, PeakRSSMi: s.peakRSSMiB()})
		s.stop()
	}
	for i, n := range ns {
		b := &bench{cp: cp, bin: bin, ns: fmt.Sprintf("fanout-%d", n)}
		b.setup(n)
		s := b.startSyncer("--namespaces=" + b.ns)
		b.waitAll(n, b.token)
		r := b.rotate(n)
		r.MinimalLastMs = b.minimalClient(n)
		r.Ratio = r.LastMs / r.MinimalLastMs
		res.Rotation = append(res.Rotation, r)
		if res.Idle == nil && (n == 1000 || i == len(ns)-1) {
			res.Idle = b.idle(s, n, idleFor)
		}
		s.stop()
	}
	printTable(res)
	b2, _ := json.MarshalIndent(res, "", "  ")
	check(os.MkdirAll(filepath.Dir(*out), 0o755))
	check(os.WriteFile(*out, append(b2, '\n'), 0o644))
}

type bench struct {
	cp    *framework.ControlPlane
	bin   string
	ns    string
	token string
	objs  []*corev1.Secret
}

var rcGVR = kuberay.RayClusterGVR

// setup creates the namespace, the source and n RayClusters with KubeRay-shaped auth Secrets.
func (b *bench) setup(n int) {
	ctx := context.Background()
	_, _ = b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{})
	b.token = "bench-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err := b.cp.Kube.CoreV1().Secrets(b.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		Data: map[string][]byte{"auth_token": []byte(b.token)}}, metav1.CreateOptions{})
	check(err)
	b.objs = make([]*corev1.Secret, n)
	parallel(n, 16, func(i int) {
		name := fmt.Sprintf("c%05d", i)
		rc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
			"metadata": map[string]any{"name": name, "namespace": b.ns},
			"spec": map[string]any{"rayVersion": "2.52.0", "authOptions": map[string]any{"mode": "token"},
				"headGroupSpec": map[string]any{"rayStartParams": map[string]any{}, "template": map[string]any{"spec": map[string]any{
					"containers": []any{map[string]any{"name": "ray-head", "image": "rayproject/ray:2.52.0"}}}}}}}}
		created, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, rc, metav1.CreateOptions{})
		check(err)
		yes := true
		s, err := b.cp.Kube.CoreV1().Secrets(b.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:          map[string]string{kuberay.ClusterLabel: name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: name, UID: created.GetUID(), Controller: &yes}}},
			Data: map[string][]byte{"auth_token": []byte("kuberay-random-" + name)}}, metav1.CreateOptions{})
		check(err)
		b.objs[i] = s
	})
}

func (b *bench) waitAll(n int, token string) {
	ctx := context.Background()
	check(wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel})
		if err != nil {
			return false, nil
		}
		ok := 0
		for _, s := range l.Items {
			if string(s.Data["auth_token"]) == token {
				ok++
			}
		}
		return ok == n, nil
	}))
}

// rotate changes the source and times each target reaching the new token (from the source write).
func (b *bench) rotate(n int) rotationResult {
	ctx := context.Background()
	l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{Limit: 1})
	check(err)
	w, err := b.cp.Kube.CoreV1().Secrets(b.ns).Watch(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel, ResourceVersion: l.ResourceVersion})
	check(err)
	defer w.Stop()
	newToken := b.token + "-rotated"
	src, err := b.cp.Kube.CoreV1().Secrets(b.ns).Get(ctx, "ray-token", metav1.GetOptions{})
	check(err)
	src.Data["auth_token"] = []byte(newToken)
	start := time.Now()
	_, err = b.cp.Kube.CoreV1().Secrets(b.ns).Update(ctx, src, metav1.UpdateOptions{})
	check(err)
	done := map[string]time.Duration{}
	writes := 0
	timeout := time.After(10 * time.Minute)
	for len(done) < n {
		select {
		case ev := <-w.ResultChan():
			s, ok := ev.Object.(*corev1.Secret)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			writes++
			if string(s.Data["auth_token"]) == newToken {
				if _, seen := done[s.Name]; !seen {
					done[s.Name] = time.Since(start)
				}
			}
		case <-timeout:
			check(fmt.Errorf("rotation of %d targets incomplete after 10 minutes (%d done)", n, len(done)))
		}
	}
	time.Sleep(time.Second) // count any extra write
	for len(w.ResultChan()) > 0 {
		if ev := <-w.ResultChan(); ev.Type == watch.Modified {
			writes++
		}
	}
	b.token = newToken
	var d []float64
	for _, v := range done {
		d = append(d, float64(v.Microseconds())/1000)
	}
	sort.Float64s(d)
	return rotationResult{N: n, P50Ms: d[len(d)/2], P99Ms: d[(len(d)*99)/100], LastMs: d[len(d)-1], Writes: writes}
}

// minimalClient is the physical limit: a 16-goroutine pool updating targets it already knows.
func (b *bench) minimalClient(n int) float64 {
	ctx := context.Background()
	// Fresh copies with current resourceVersions (raysync wrote them).
	l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel})
	check(err)
	start := time.Now()
	parallel(len(l.Items), 16, func(i int) {
		s := l.Items[i].DeepCopy()
		s.Data["auth_token"] = []byte(b.token)
		s.Annotations = map[string]string{"bench/minimal": strconv.Itoa(i)}
		_, err := b.cp.Kube.CoreV1().Secrets(b.ns).Update(ctx, s, metav1.UpdateOptions{})
		check(err)
	})
	return float64(time.Since(start).Microseconds()) / 1000
}

// idle counts target writes and raysync's API requests over d with nothing changing.
func (b *bench) idle(s *syncer, n int, d time.Duration) *idleResult {
	ctx := context.Background()
	time.Sleep(2 * time.Second)
	l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{Limit: 1})
	check(err)
	w, err := b.cp.Kube.CoreV1().Secrets(b.ns).Watch(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel, ResourceVersion: l.ResourceVersion})
	check(err)
	defer w.Stop()
	before := s.requests()
	deadline := time.After(d)
	writes := 0
loop:
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified || ev.Type == watch.Added {
				writes++
			}
		case <-deadline:
			break loop
		}
	}
	return &idleResult{N: n, Seconds: d.Seconds(), Writes: writes, RequestsPerSec: (s.requests() - before) / d.Seconds()}
}

func (b *bench) unrelatedSecrets(m int) {
	ctx := context.Background()
	payload := bytes.Repeat([]byte("x"), 8192)
	const perNS = 1000
	for i := 0; i*perNS < m; i++ {
		_, _ = b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("unrelated-%d", i)}}, metav1.CreateOptions{})
	}
	parallel(m, 16, func(i int) {
		_, err := b.cp.Kube.CoreV1().Secrets(fmt.Sprintf("unrelated-%d", i/perNS)).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%05d", i)}, Data: map[string][]byte{"blob": payload}}, metav1.CreateOptions{})
		check(err)
	})
}

type syncer struct {
	cmd        *exec.Cmd
	metricsURL string
}

func (b *bench) startSyncer(scope string) *syncer {
	mp, err := framework.FreePort()
	check(err)
	pp, err := framework.FreePort()
	check(err)
	cmd := exec.Command(b.bin, "--kubeconfig="+b.cp.Kubeconfig, "--auth-source="+b.ns+"/ray-token", scope,
		"--leader-elect=false", "--log-level=warn", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp), fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", pp))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	check(cmd.Start())
	check(wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", pp))
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	}))
	return &syncer{cmd: cmd, metricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", mp)}
}

func (s *syncer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
}

// peakRSSMiB reads VmHWM (the peak resident set) from /proc.
func (s *syncer) peakRSSMiB() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	check(err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func (s *syncer) requests() float64 {
	resp, err := http.Get(s.metricsURL)
	check(err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	check(err)
	var sum float64
	for _, m := range fams["raysync_rest_client_requests_total"].GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

func printTable(r result) {
	fmt.Printf("\n### raysync bench (commit %s, %d CPUs%s)\n\n", r.Commit, r.CPUs, map[bool]string{true: ", smoke", false: ""}[r.Smoke])
	fmt.Println("| rotation fan-out N | p50 | p99 | last | target writes | minimal client (N writes) | raysync / minimal |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, x := range r.Rotation {
		fmt.Printf("| %d | %.0f ms | %.0f ms | %.0f ms | %d | %.0f ms | %.2fx |\n", x.N, x.P50Ms, x.P99Ms, x.LastMs, x.Writes, x.MinimalLastMs, x.Ratio)
	}
	if r.Idle != nil {
		fmt.Printf("\n| idle (N=%d, %.0f s) | target writes %d | API requests/s %.3f |\n|---|---|---|\n", r.Idle.N, r.Idle.Seconds, r.Idle.Writes, r.Idle.RequestsPerSec)
	}
	fmt.Println("\n| memory: clusters N | unrelated 8 KiB Secrets M | peak RSS |\n|---|---|---|")
	for _, m := range r.Memory {
		fmt.Printf("| %d | %d | %.1f MiB |\n", m.N, m.M, m.PeakRSSMi)
	}
}

func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func buildSyncer() string {
	cache, err := framework.CacheDir()
	check(err)
	root, err := framework.RepoRoot()
	check(err)
	bin := filepath.Join(cache, "bin", "syncer-bench")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/syncer")
	cmd.Dir, cmd.Stderr = root, os.Stderr
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	check(cmd.Run())
	return bin
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
