package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

var (
	syncerOnce sync.Once
	syncerPath string
	syncerErr  error
)

// buildSyncer builds cmd/syncer once per test run: e2e tests run raysync as its real binary.
func buildSyncer() (string, error) {
	syncerOnce.Do(func() { syncerPath, syncerErr = framework.BuildSyncer("syncer-e2e") })
	return syncerPath, syncerErr
}

// Syncer is a running raysync binary.
type Syncer struct {
	t          *testing.T
	cmd        *exec.Cmd
	out        *lockedBuffer
	MetricsURL string
	ProbeURL   string
	done       chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Secret registers a value that must never appear in raysync's output and returns it.
func (e *Env) Secret(v string) string {
	e.secrets = append(e.secrets, v)
	return v
}

// StartSyncer runs raysync against this control plane with args plus loopback servers and the admin
// kubeconfig, waits until it is ready, and stops it when the test ends.
func (e *Env) StartSyncer(args ...string) *Syncer {
	e.t.Helper()
	return e.StartSyncerAs(e.Kubeconfig, args...)
}

// StartSyncerAs runs raysync with the given kubeconfig (for example a ServiceAccount's).
func (e *Env) StartSyncerAs(kubeconfig string, args ...string) *Syncer {
	e.t.Helper()
	return e.startSyncer(kubeconfig, "/readyz", args...)
}

// StartSyncerUnready runs raysync and waits only until it is alive (/healthz), not ready.
func (e *Env) StartSyncerUnready(args ...string) *Syncer {
	e.t.Helper()
	return e.startSyncer(e.Kubeconfig, "/healthz", args...)
}

func (e *Env) startSyncer(kubeconfig, probe string, args ...string) *Syncer {
	e.t.Helper()
	if !hasFlag(args, "--leader-elect") {
		args = append(args, "--leader-elect=false")
	}
	return e.startBinary(kubeconfig, probe, nil, nil, args...)
}

// startBinary runs the syncer binary (argv0: a subcommand and its first arguments) on loopback ports
// of its own and waits for probe; on cleanup it stops it and checks nothing it exposed holds a secret.
func (e *Env) startBinary(kubeconfig, probe string, env, argv0 []string, args ...string) *Syncer {
	e.t.Helper()
	path, err := buildSyncer()
	if err != nil {
		e.t.Fatal(err)
	}
	ports, err := freePortPair()
	if err != nil {
		e.t.Fatal(err)
	}
	s := &Syncer{t: e.t, out: &lockedBuffer{}, done: make(chan struct{}),
		MetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[0]),
		ProbeURL:   fmt.Sprintf("http://127.0.0.1:%d", ports[1])}
	full := append(append(slices.Clone(argv0), "--kubeconfig="+kubeconfig,
		fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", ports[0]),
		fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", ports[1]),
		"--log-level=debug"), args...)
	s.cmd = exec.Command(path, full...)
	s.cmd.Env = append(os.Environ(), env...)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	e.t.Cleanup(func() {
		// Scan what raysync exposes besides its logs: every metric line, and every Event in the cluster.
		var exposed strings.Builder
		if resp, err := http.Get(s.MetricsURL); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			exposed.Write(b)
		}
		if evs, err := e.Kube.CoreV1().Events("").List(context.Background(), metav1.ListOptions{}); err == nil {
			for _, ev := range evs.Items {
				exposed.WriteString(ev.Message + "\n")
			}
		}
		s.Stop()
		logs := s.out.String()
		out := logs + exposed.String()
		for _, v := range e.secrets {
			for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
				if len(form) >= 8 && strings.Contains(out, form) {
					e.t.Errorf("raysync's output, metrics or Events contain a secret value (or its base64 form)")
				}
			}
		}
		if e.t.Failed() {
			e.t.Logf("raysync output (last 40 lines):\n%s", lastLines(logs, 40))
		}
	})
	err = wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-s.done:
			return false, fmt.Errorf("raysync exited: %s", lastLines(s.out.String(), 20))
		default:
		}
		resp, err := http.Get(s.ProbeURL + probe)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		e.t.Fatalf("raysync not answering %s with 200: %v", probe, err)
	}
	return s
}

// Stop sends SIGTERM and waits for exit.
func (s *Syncer) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Kill sends SIGKILL (a crash: no lease release, no cleanup) and waits for exit.
func (s *Syncer) Kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// Ready reports whether /readyz answers 200.
func (s *Syncer) Ready() bool {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(s.ProbeURL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Output is everything raysync logged so far.
func (s *Syncer) Output() string { return s.out.String() }

// Metrics scrapes /metrics.
func (s *Syncer) Metrics() map[string]*dto.MetricFamily {
	s.t.Helper()
	resp, err := http.Get(s.MetricsURL)
	if err != nil {
		s.t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		s.t.Fatalf("parse metrics: %v", err)
	}
	return fams
}

// MetricSum is the sum of every series of the counter or gauge name (0 when it has none).
func (s *Syncer) MetricSum(name string) float64 {
	sum := 0.0
	for _, m := range s.Metrics()[name].GetMetric() {
		sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return sum
}

// Metric returns the value of the series of name whose labels include want (found=false if none).
func (s *Syncer) Metric(name string, want map[string]string) (float64, bool) {
	fam, ok := s.Metrics()[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range fam.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// WaitMetric waits until the series equals v.
func (s *Syncer) WaitMetric(name string, labels map[string]string, v float64, timeout time.Duration) {
	s.t.Helper()
	var last float64
	var found bool
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if last, found = s.Metric(name, labels); found && last == v {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("metric %s%v = %v (found %v), want %v", name, labels, last, found, v)
}

// Events lists Events in ns from the given component with the given reason (all reasons if "").
func (e *Env) Events(ns, component, reason string) []corev1.Event {
	e.t.Helper()
	l, err := e.Kube.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var out []corev1.Event
	for _, ev := range l.Items {
		if ev.Source.Component == component && (reason == "" || ev.Reason == reason) {
			out = append(out, ev)
		}
	}
	return out
}

// WaitEvent waits for an Event with reason from raysync on the named object.
func (e *Env) WaitEvent(ns, object, reason string, timeout time.Duration) corev1.Event {
	e.t.Helper()
	var found corev1.Event
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, ev := range e.Events(ns, "raysync", reason) {
			if ev.InvolvedObject.Name == object {
				found = ev
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no %s Event from raysync on %s/%s within %s", reason, ns, object, timeout)
	}
	return found
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

func freePortPair() ([]int, error) {
	a, err := framework.FreePort()
	if err != nil {
		return nil, err
	}
	for {
		b, err := framework.FreePort()
		if err != nil {
			return nil, err
		}
		if b != a {
			return []int{a, b}, nil
		}
	}
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}
