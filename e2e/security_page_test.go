package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/raysync/raysync/e2e/framework"
)

// TestSecurityPageMatchesTheChart: every row of docs/security.md's permission table is a rule the chart
// renders, verbs exactly; and every rule the chart renders for raysync is a row. A permission the page
// claims and the chart contradicts (or grants without saying) fails here.
func TestSecurityPageMatchesTheChart(t *testing.T) {
	root, _ := framework.RepoRoot()
	page, err := os.ReadFile(filepath.Join(root, "docs", "security.md"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, "template", "rel", chart, "--namespace", "raysync", "--set",
		"authSource.namespace=src,authSource.name=ray-token,namespaces={ml},gateway.enabled=true")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	// Where the page says a rule is, and the rules the chart renders there, as "resource|verbs".
	where := map[string]func(ns, name, kind string) bool{
		"each managed namespace":  func(ns, name, kind string) bool { return kind == "Role" && ns == "ml" },
		"each source's namespace": func(ns, name, kind string) bool { return kind == "Role" && ns == "src" },
		"raysync's namespace":     func(ns, name, kind string) bool { return kind == "Role" && ns == "raysync" },
		"cluster":                 func(ns, name, kind string) bool { return kind == "ClusterRole" },
	}
	rendered := map[string][]string{}
	for _, o := range renderedObjects(t, out) {
		if o.GetKind() != "Role" && o.GetKind() != "ClusterRole" {
			continue
		}
		if strings.Contains(o.GetName(), "gateway") {
			continue // the gateway's own ServiceAccount: its page is the gateway's
		}
		rules, _ := o.Object["rules"].([]any)
		for w, in := range where {
			if !in(o.GetNamespace(), o.GetName(), o.GetKind()) {
				continue
			}
			for _, r := range rules {
				rule := r.(map[string]any)
				var verbs []string
				for _, v := range rule["verbs"].([]any) {
					verbs = append(verbs, v.(string))
				}
				slices.Sort(verbs)
				named := ""
				if _, ok := rule["resourceNames"]; ok {
					named = ", by name"
				}
				for _, res := range rule["resources"].([]any) {
					rendered[w] = append(rendered[w], res.(string)+named+"|"+strings.Join(verbs, ","))
				}
			}
		}
	}
	var claimed = map[string][]string{}
	w := ""
	_, table, _ := strings.Cut(string(page), "| Where | Resource | Verbs | Why |")
	table, _, _ = strings.Cut(table, "\n\n")
	for _, line := range strings.Split(table, "\n")[2:] {
		cells := strings.Split(line, "|")
		if len(cells) < 5 {
			continue
		}
		if c := strings.TrimSpace(cells[1]); c != "" {
			w = strings.TrimSpace(strings.Split(c, "(")[0])
		}
		res := strings.TrimSpace(cells[2])
		res = strings.ReplaceAll(res, "`", "")
		res, _, _ = strings.Cut(res, " (") // "services (gateway on)"
		if base, _, ok := strings.Cut(res, ", by name"); ok {
			res = base + ", by name"
		}
		verbs := strings.Split(strings.ReplaceAll(strings.TrimSpace(cells[3]), " ", ""), ",")
		slices.Sort(verbs)
		claimed[w] = append(claimed[w], res+"|"+strings.Join(verbs, ","))
	}
	for w := range where {
		for _, c := range claimed[w] {
			if !slices.Contains(rendered[w], c) {
				t.Errorf("docs/security.md claims %s: %s; the chart renders there %v", w, c, rendered[w])
			}
		}
		for _, r := range rendered[w] {
			if !slices.Contains(claimed[w], r) {
				t.Errorf("the chart grants %s: %s, which docs/security.md does not list", w, r)
			}
		}
	}
}
