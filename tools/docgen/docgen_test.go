package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestGeneratedPagesAreCommitted fails when a reference page or the chart's README is not what the code
// generates now: a new constant, Event, metric or value, or a changed comment, without `make docs-gen`.
func TestGeneratedPagesAreCommitted(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	stale, err := run(root, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range stale {
		t.Errorf("%s is not what the code generates: run `make docs-gen` (or `go run ./tools/docgen`) and commit it", p)
	}
}

type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestEveryAlertHasARunbookPage: each alert of the chart links (runbook_url) to its own page under
// docs/runbooks, which exists and is in the site's navigation, and every runbook page belongs to an alert.
func TestEveryAlertHasARunbookPage(t *testing.T) {
	root, _ := repoRoot()
	files := filepath.Join(root, chartDir, "files")
	a, err := os.ReadFile(filepath.Join(files, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	g, err := os.ReadFile(filepath.Join(files, "gateway-alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules ruleFile
	if err := yaml.Unmarshal([]byte(strings.TrimSuffix(string(a), "\n")+"\n"+string(g)), &rules); err != nil {
		t.Fatal(err)
	}
	nav, err := os.ReadFile(filepath.Join(root, "mkdocs.yml"))
	if err != nil {
		t.Fatal(err)
	}
	placeholder := regexp.MustCompile(`^__RUNBOOK__\(([a-z]+)\)$`)
	pages := map[string]bool{}
	for _, grp := range rules.Groups {
		for _, r := range grp.Rules {
			m := placeholder.FindStringSubmatch(r.Annotations["runbook_url"])
			if m == nil || m[1] != strings.ToLower(r.Alert) {
				t.Errorf("%s: runbook_url %q, want __RUNBOOK__(%s)", r.Alert, r.Annotations["runbook_url"], strings.ToLower(r.Alert))
				continue
			}
			page := "runbooks/" + m[1] + ".md"
			pages[page] = true
			b, err := os.ReadFile(filepath.Join(root, "docs", page))
			if err != nil {
				t.Errorf("%s: no runbook page docs/%s", r.Alert, page)
				continue
			}
			if !strings.HasPrefix(string(b), "# "+r.Alert+"\n") {
				t.Errorf("docs/%s does not start with the title %q", page, "# "+r.Alert)
			}
			if !strings.Contains(string(nav), ": "+page+"\n") {
				t.Errorf("docs/%s is not in mkdocs.yml's nav", page)
			}
			if !slices.Contains([]string{"critical", "warning"}, r.Labels["severity"]) {
				t.Errorf("%s: severity %q", r.Alert, r.Labels["severity"])
			}
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "docs", "runbooks"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// The pages that are no alert's: the index, and those for an on-call situation (each in the index).
		if p := "runbooks/" + e.Name(); !pages[p] && !slices.Contains([]string{"index.md", "client-auth-errors.md", "stop-the-wave.md", "wrong-token.md"}, e.Name()) {
			t.Errorf("docs/%s is the runbook of no alert", p)
		}
	}
}

// TestChartDefaultsLeaveOptionalPartsOff: a user installs with only authSource and a scope; what needs
// credentials they may not have, or CRDs they may not have installed, stays off until asked for.
func TestChartDefaultsLeaveOptionalPartsOff(t *testing.T) {
	root, _ := repoRoot()
	raw, err := os.ReadFile(filepath.Join(root, chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		PullSecrets    []string                `yaml:"pullSecrets"`
		AutoscalerTLS  struct{ Secret string } `yaml:"autoscalerTLS"`
		ServiceMonitor struct{ Enabled bool }  `yaml:"serviceMonitor"`
		PrometheusRule struct{ Enabled bool }  `yaml:"prometheusRule"`
		Gateway        struct{ Enabled bool }
		Namespaces     []string
		AllNamespaces  bool `yaml:"allNamespaces"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.PullSecrets) > 0 || v.AutoscalerTLS.Secret != "" || v.ServiceMonitor.Enabled || v.PrometheusRule.Enabled || v.Gateway.Enabled {
		t.Errorf("an optional part is on by default: %+v", v)
	}
	if len(v.Namespaces) > 0 || v.AllNamespaces {
		t.Error("the chart picks a scope by default: sharing one token with every tenant must be a deliberate choice")
	}
}

// fencedBlocks returns the fenced code blocks of md (indentation removed), in order; with marker, only
// those preceded by that line.
func fencedBlocks(md, marker string) []string {
	var blocks []string
	var cur []string
	in, armed := false, marker == ""
	indent := ""
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case marker != "" && trimmed == marker:
			armed = true
		case !in && strings.HasPrefix(trimmed, "```") && armed:
			in, cur, indent = true, nil, line[:len(line)-len(strings.TrimLeft(line, " "))]
		case in && strings.HasPrefix(trimmed, "```"):
			blocks = append(blocks, strings.Join(cur, "\n"))
			in, armed = false, marker == ""
		case in:
			cur = append(cur, strings.TrimPrefix(line, indent))
		}
	}
	return blocks
}

// TestREADMEQuickStartIsTheOneThatRuns: the README's quick start is, command for command, the one
// docs/getting-started/helm.md marks for execution (TestDocsQuickStart runs those).
func TestREADMEQuickStartIsTheOneThatRuns(t *testing.T) {
	root, _ := repoRoot()
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	helm, err := os.ReadFile(filepath.Join(root, "docs/getting-started/helm.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, qs, _ := strings.Cut(string(readme), "## Quick start")
	qs, _, _ = strings.Cut(qs, "\n## ")
	got := fencedBlocks(qs, "")
	want := fencedBlocks(string(helm), "<!-- docs-run: quickstart -->")
	if len(want) != 6 || !slices.Equal(got, want) {
		t.Errorf("the README's quick start differs from the one docs/getting-started/helm.md runs:\nREADME:\n%s\n\ndocs:\n%s",
			strings.Join(got, "\n---\n"), strings.Join(want, "\n---\n"))
	}
}
