package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/metrics"
)

// checkPromQL parses every expression with Prometheus' own parser (e2e/tools/promql) and checks that
// each metric it selects exists in raysync's registry (or is Prometheus' own "up").
func checkPromQL(t *testing.T, where string, exprs []string) {
	t.Helper()
	if len(exprs) == 0 {
		t.Fatalf("%s: no expressions found", where)
	}
	tool, err := framework.EnsurePromQL(context.Background(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tool)
	cmd.Stdin = strings.NewReader(strings.Join(exprs, "\n") + "\n")
	var out bytes.Buffer
	cmd.Stdout = &out
	runErr := cmd.Run()
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if len(lines) != len(exprs) {
		t.Fatalf("%s: promql tool: %v\n%s", where, runErr, out.String())
	}
	known := map[string]bool{"up": true}
	for _, n := range append(metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} }).Names(), metrics.NewGateway().Names()...) {
		for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
			known[n+suffix] = true
		}
	}
	for i, l := range lines {
		if strings.HasPrefix(l, "ERROR:") {
			t.Errorf("%s: %q does not parse: %s", where, exprs[i], l)
			continue
		}
		for _, name := range strings.Fields(l) {
			if !known[name] {
				t.Errorf("%s: %q uses %s, which raysync does not export", where, exprs[i], name)
			}
		}
	}
}

// renderedAlerts is the rule file as the chart renders it with the gateway on: alerts.yaml and the
// gateway's group appended.
func renderedAlerts(t *testing.T, behindSeconds string) []byte {
	t.Helper()
	root, _ := framework.RepoRoot()
	files := filepath.Join(root, "deploy/helm/raysync/files")
	rules, err := os.ReadFile(filepath.Join(files, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	gw, err := os.ReadFile(filepath.Join(files, "gateway-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	all := strings.TrimSuffix(string(rules), "\n") + "\n" + string(gw)
	all = strings.NewReplacer("__JOB__", "raysync-metrics", "__GATEWAY_JOB__", "raysync-gateway", "__BEHIND_SECONDS__", behindSeconds, "__PAUSED_FOR__", "2h").Replace(all)
	// As templates/prometheusrule.yaml does with prometheusRule.runbookURL = https://docs.example/raysync/runbooks/{alert}/.
	return []byte(runbookPlaceholder.ReplaceAllString(all, "https://docs.example/raysync/runbooks/${1}/"))
}

var runbookPlaceholder = regexp.MustCompile(`__RUNBOOK__\(([a-z]+)\)`)

func TestAlertRulesParseAndUseRealMetrics(t *testing.T) {
	b := renderedAlerts(t, "604800")
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string
				Expr        string
				Annotations map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			exprs = append(exprs, r.Expr)
			if r.Annotations["summary"] == "" || r.Annotations["runbook"] == "" || !strings.HasPrefix(r.Annotations["runbook_url"], "https://docs.example/raysync/runbooks/") {
				t.Errorf("alert %s lacks summary, runbook text or runbook_url", r.Alert)
			}
		}
	}
	for _, want := range []string{"RaysyncSourceInvalid", "RaysyncTargetsOutOfSync", "RaysyncStalePods", "RaysyncPodsRecycledRepeatedly",
		"RaysyncAutoscalerCertExpiringSoon", "RaysyncDown", "RaysyncNoLeader", "RaysyncRotationBlocked", "RaysyncClustersBehind",
		"RaysyncGatewayUpstreamAuthFailures", "RaysyncGatewayTableInvalid", "RaysyncGatewayDown", "RaysyncGatewayRefusingClients"} {
		if !alerts[want] {
			t.Errorf("alert %s missing", want)
		}
	}
	checkPromQL(t, "alerts.yaml", exprs)
}

func TestDashboardQueriesUseRealMetrics(t *testing.T) {
	root, _ := framework.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "deploy/grafana/raysync.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var exprs []string
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	checkPromQL(t, "raysync.json", exprs)
}

func TestMetricsDocSLIsParse(t *testing.T) {
	root, _ := framework.RepoRoot()
	b, err := os.ReadFile(filepath.Join(root, "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), "```promql")
	block, _, _ := strings.Cut(rest, "```")
	var exprs []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			exprs = append(exprs, l)
		}
	}
	checkPromQL(t, "docs/metrics.md", exprs)
	// Every metric raysync exports is documented.
	for _, n := range append(metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} }).Names(), metrics.NewGateway().Names()...) {
		short := strings.TrimPrefix(n, "raysync_workqueue")
		if !strings.Contains(string(b), n) && !strings.Contains(string(b), short) {
			t.Errorf("docs/metrics.md does not mention %s", n)
		}
	}
}

// TestAlertRulesFireWhenTheyShould runs Prometheus' own rule tester (promtool, built from the Prometheus
// module in e2e/tools/promtool) on the alerts as the chart renders them: alerts_test.yaml has series
// that make each rotation alert fire and series that must not.
func TestAlertRulesFireWhenTheyShould(t *testing.T) {
	root, _ := framework.RepoRoot()
	promtool, err := framework.EnsurePromtool(context.Background(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := filepath.Join(root, "deploy/helm/raysync/files")
	rendered := renderedAlerts(t, "86400")
	tests, err := os.ReadFile(filepath.Join(files, "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts.yaml"), rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(promtool, "test", "rules", "alerts_test.yaml")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
