package e2e

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/raysync/raysync/e2e/framework"
)

// TestEveryAlertAndNotesLinkIsAPageOfTheSite: every URL the chart gives an operator — each alert's
// runbook_url and each link in the install notes — is under the one docsURL value and names a page of
// the docs site (a docs/ page mkdocs builds at that path; and, once make docs has built site/, the
// built page itself). The default docsURL is mkdocs.yml's site_url, and a docsURL set without its
// trailing slash gives the same pages.
func TestEveryAlertAndNotesLinkIsAPageOfTheSite(t *testing.T) {
	root, _ := framework.RepoRoot()
	var mk struct {
		SiteURL string `yaml:"site_url"`
	}
	b, err := os.ReadFile(filepath.Join(root, "mkdocs.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(stripTags(b), &mk); err != nil {
		t.Fatal(err)
	}
	var values struct {
		DocsURL string `yaml:"docsURL"`
	}
	b, err = os.ReadFile(filepath.Join(root, chart, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	if values.DocsURL != mk.SiteURL {
		t.Errorf("values.yaml docsURL %q, mkdocs.yml site_url %q: one docs site", values.DocsURL, mk.SiteURL)
	}
	_, built := os.Stat(filepath.Join(root, "site", "index.html"))

	// The notes are rendered as a ConfigMap's data in a copy of the chart: helm template has no notes.
	dir := filepath.Join(t.TempDir(), "raysync")
	if err := os.CopyFS(dir, os.DirFS(filepath.Join(root, chart))); err != nil {
		t.Fatal(err)
	}
	notes, err := os.ReadFile(filepath.Join(dir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	must(t, os.WriteFile(filepath.Join(dir, "files", "notes-under-test.txt"), notes, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "templates", "notes-under-test.yaml"), []byte(
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes-under-test}\ndata:\n  notes: {{ tpl (.Files.Get \"files/notes-under-test.txt\") . | toJson }}\n"), 0o644))

	url := regexp.MustCompile(`https?://[^\s"'()<>]+`)
	for _, base := range []string{"", "https://docs.example.com/platform/raysync", "https://docs.example.com/platform/raysync/"} {
		set := "image.repository=registry.example.com/raysync,authSource.namespace=src,authSource.name=ray-token,namespaces={ml},prometheusRule.enabled=true,gateway.enabled=true"
		want := mk.SiteURL
		if base != "" {
			set += ",docsURL=" + base
			want = strings.TrimSuffix(base, "/") + "/"
		}
		out, err := helm(t, "template", "rel", dir, "--namespace", "raysync", "--set", set)
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		var runbooks, noteLinks []string
		for _, o := range renderedObjects(t, out) {
			switch {
			case o.GetKind() == "PrometheusRule":
				groups, _ := o.Object["spec"].(map[string]any)["groups"].([]any)
				for _, g := range groups {
					for _, r := range g.(map[string]any)["rules"].([]any) {
						if a, ok := r.(map[string]any)["annotations"].(map[string]any); ok {
							runbooks = append(runbooks, a["runbook_url"].(string))
						}
					}
				}
			case o.GetName() == "notes-under-test":
				noteLinks = url.FindAllString(o.Object["data"].(map[string]any)["notes"].(string), -1)
			}
		}
		if len(runbooks) < 10 || len(noteLinks) < 3 {
			t.Fatalf("docsURL %q: %d runbook_urls, %d links in the notes: the test reads neither", base, len(runbooks), len(noteLinks))
		}
		for _, link := range append(runbooks, noteLinks...) {
			rel, ok := strings.CutPrefix(link, want)
			if !ok {
				t.Errorf("docsURL %q: %s is not under %s", base, link, want)
				continue
			}
			page, anchor, _ := strings.Cut(rel, "#")
			if page != "" && !strings.HasSuffix(page, "/") {
				t.Errorf("%s: not a page of the site (mkdocs serves pages as directories: .../)", link)
				continue
			}
			page = strings.TrimSuffix(page, "/")
			md, err := os.ReadFile(filepath.Join(root, "docs", page+".md"))
			if err != nil {
				if md, err = os.ReadFile(filepath.Join(root, "docs", page, "index.md")); err != nil {
					t.Errorf("%s: no docs/%s.md or docs/%s/index.md", link, page, page)
					continue
				}
			}
			if anchor != "" && !hasHeading(string(md), anchor) {
				t.Errorf("%s: docs/%s has no heading #%s", link, page, anchor)
			}
			if built == nil {
				if _, err := os.Stat(filepath.Join(root, "site", page, "index.html")); err != nil {
					t.Errorf("%s: the built site has no %s/index.html", link, page)
				}
			}
		}
	}
}

// hasHeading says whether a Markdown page has a heading whose anchor (mkdocs' default slug) is anchor.
func hasHeading(md, anchor string) bool {
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		slug := strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
				return r
			case r == ' ':
				return '-'
			}
			return -1
		}, strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#"))))
		if slug == anchor {
			return true
		}
	}
	return false
}

// stripTags removes mkdocs.yml's Python tags (!!python/name:…), which a YAML decoder cannot resolve.
func stripTags(b []byte) []byte {
	return regexp.MustCompile(`!!python/[^\s]+`).ReplaceAll(b, nil)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
