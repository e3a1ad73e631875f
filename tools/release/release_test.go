package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/raysync/raysync/e2e/framework"
)

func TestCheckVersion(t *testing.T) {
	for v, want := range map[string]string{
		"0.3.0":          "",
		"1.0.0-rc.1":     "",
		"0.3.0-alpha-2":  "",
		"":               "VERSION is required",
		"v0.3.0":         "without the leading v (0.3.0)",
		"V1.2.3":         "without the leading v (1.2.3)",
		"0.3.0+build.7":  "build metadata (+build.7) cannot be an OCI tag",
		"0.3":            "not a semantic version",
		"01.2.3":         "not a semantic version",
		"0.3.0-":         "not a semantic version",
		"0.3.0 ":         "not a semantic version",
		"vv0.3.0":        "not a semantic version",
		"0.3.0\n0.4.0":   "not a semantic version",
		"0.3.0-rc.01":    "not a semantic version",
		"latest":         "not a semantic version",
		"1.2.3-rc.1+sha": "build metadata (+sha)",
	} {
		err := checkVersion(v)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("checkVersion(%q) = %v, want %q", v, err, want)
		}
	}
}

func TestCheckRegistry(t *testing.T) {
	for in, want := range map[string]string{
		"ghcr.io/my-org":                       "ghcr.io/my-org",
		"ghcr.io/my-org/":                      "ghcr.io/my-org",
		"registry.example.com:5000/platform//": "registry.example.com:5000/platform",
		"198.18.0.2:5000":                      "198.18.0.2:5000",
		"localhost:5000/a/b_c/d.e":             "localhost:5000/a/b_c/d.e",
		"":                                     "error: REGISTRY is required",
		"/":                                    "error: REGISTRY is required",
		"oci://ghcr.io/my-org":                 "error: without a scheme",
		"https://ghcr.io":                      "error: without a scheme",
		"ghcr.io/My-Org":                       "error: is not host[:port][/path]",
		"ghcr.io/org/raysync:0.3.0":            "error: is not host[:port][/path]",
		"ghcr.io/org@sha256:00":                "error: is not host[:port][/path]",
		"ghcr.io/org raysync":                  "error: is not host[:port][/path]",
	} {
		got, err := checkRegistry(in)
		if err != nil {
			got = "error: " + err.Error()
		}
		if !strings.HasPrefix(want, "error: ") && got != want || strings.HasPrefix(want, "error: ") && !strings.Contains(got, strings.TrimPrefix(want, "error: ")) {
			t.Errorf("checkRegistry(%q) = %q, want %q", in, got, want)
		}
	}
}

// The version's one place: Chart.yaml's version and appVersion agree, and the kustomize base (the
// chart rendered) names the same version.
func TestOneVersion(t *testing.T) {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, chartFile))
	if err != nil {
		t.Fatal(err)
	}
	version, appVersion, err := chartVersions(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if version != appVersion {
		t.Errorf("%s: version %s, appVersion %s: one version", chartFile, version, appVersion)
	}
	if err := checkVersion(version); err != nil {
		t.Errorf("%s: %v", chartFile, err)
	}
	for _, f := range versionFiles {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(b), `app.kubernetes.io/version: "`); n == 0 || n != strings.Count(string(b), `app.kubernetes.io/version: "`+version+`"`) {
			t.Errorf("%s: %d version labels, not all %q", f, n, version)
		}
	}
}

// Refusals come before any build or push, with exit 2 and one line; -set-version writes the version
// everywhere it lives.
func TestRunRefuses(t *testing.T) {
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(root, chartFile))
	current, _, _ := chartVersions(string(b))
	dist := t.TempDir()
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no version":          {[]string{"-registry", "r.example/x"}, "VERSION is required"},
		"leading v":           {[]string{"-version", "v" + current, "-registry", "r.example/x"}, "leading v"},
		"build metadata":      {[]string{"-version", current + "+1", "-registry", "r.example/x"}, "build metadata"},
		"not the chart's":     {[]string{"-version", "99.0.0", "-registry", "r.example/x"}, "VERSION 99.0.0 but " + chartFile + " says " + current},
		"no registry":         {[]string{"-version", current}, "REGISTRY is required"},
		"registry with a tag": {[]string{"-version", current, "-registry", "r.example/x/raysync:1"}, "not host[:port][/path]"},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append(tc.args, "-dist", dist), &out, &errOut)
		if code != 2 || out.Len() > 0 || strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 2 and %q", name, code, out.String(), errOut.String(), tc.want)
		}
	}
	if entries, _ := os.ReadDir(dist); len(entries) > 0 {
		t.Errorf("a refused release wrote %v", entries)
	}
}

func TestSetVersion(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		chartFile:       "apiVersion: v2\nname: raysync\nversion: 0.2.0\nappVersion: \"0.2.0\"\nkubeVersion: \">=1.29.0-0\"\n",
		versionFiles[0]: "    app.kubernetes.io/version: \"0.2.0\"\n          image: \"ghcr.io/raysync/syncer:0.2.0\"\n    x: 0.2.0\n",
		versionFiles[1]: "    app.kubernetes.io/version: \"0.2.0\"\n",
	}
	for f, s := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := setVersion(root, "0.2.0", "0.3.0-rc.1"); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		chartFile:       "apiVersion: v2\nname: raysync\nversion: 0.3.0-rc.1\nappVersion: \"0.3.0-rc.1\"\nkubeVersion: \">=1.29.0-0\"\n",
		versionFiles[0]: "    app.kubernetes.io/version: \"0.3.0-rc.1\"\n          image: \"ghcr.io/raysync/syncer:0.3.0-rc.1\"\n    x: 0.2.0\n",
		versionFiles[1]: "    app.kubernetes.io/version: \"0.3.0-rc.1\"\n",
	}
	for f, w := range want {
		if b, _ := os.ReadFile(filepath.Join(root, f)); string(b) != w {
			t.Errorf("%s:\n%s\nwant:\n%s", f, b, w)
		}
	}
}

func TestWithImageRepository(t *testing.T) {
	values := "name: \"\"\nautoscalerTLS:\n  repository: keep\nimage:\n  repository: ghcr.io/raysync/syncer\n  tag: \"\"\nimagePullSecrets: []\n"
	got, err := withImageRepository(values, "r.example/x/raysync")
	if err != nil {
		t.Fatal(err)
	}
	if want := "name: \"\"\nautoscalerTLS:\n  repository: keep\nimage:\n  repository: r.example/x/raysync\n  tag: \"\"\nimagePullSecrets: []\n"; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if _, err := withImageRepository("image:\n  tag: x\n", "r"); err == nil {
		t.Error("values without image.repository: no error")
	}
	root, _ := framework.RepoRoot()
	real, _ := os.ReadFile(filepath.Join(root, "deploy/helm/raysync/values.yaml"))
	if _, err := withImageRepository(string(real), "r"); err != nil {
		t.Errorf("the chart's values.yaml: %v", err)
	}
}

func TestWithDocsURL(t *testing.T) {
	root, _ := framework.RepoRoot()
	real, _ := os.ReadFile(filepath.Join(root, "deploy/helm/raysync/values.yaml"))
	for in, want := range map[string]string{
		"https://docs.example.com/raysync":  "docsURL: https://docs.example.com/raysync/",
		"https://docs.example.com/raysync/": "docsURL: https://docs.example.com/raysync/",
	} {
		got, err := withDocsURL(string(real), in)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got, "\n"+want+"\n") || strings.Count(got, "docsURL:") != 1 {
			t.Errorf("%s: docsURL lines %q", in, regexpLines(got, "docsURL:"))
		}
	}
	for _, bad := range []string{"docs.example.com", "ftp://x", "https://x y", "https://x/#a"} {
		if _, err := withDocsURL(string(real), bad); err == nil {
			t.Errorf("DOCS_URL %q accepted", bad)
		}
	}
}

func regexpLines(s, prefix string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// The SBOM lists every module of the build info (a replaced one by its replacement) and the standard
// library, and is the same document for the same binary.
func TestSBOM(t *testing.T) {
	info := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/raysync/raysync", Version: "(devel)"},
		Deps: []*debug.Module{
			{Path: "k8s.io/client-go", Version: "v0.37.2", Sum: "h1:abc="},
			{Path: "github.com/prometheus/client_golang", Version: "v1.25.0"},
			{Path: "example.com/old", Version: "v1.0.0", Replace: &debug.Module{Path: "example.com/fork", Version: "v1.0.1"}},
		},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "0123"}, {Key: "GOOS", Value: "linux"}}}
	digest := sha256Of([]byte("binary"))
	created := time.Unix(1700000000, 0)
	b, err := sbomFor(info, "0.3.0", "linux/arm64", digest, created)
	if err != nil {
		t.Fatal(err)
	}
	var doc bom
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, c := range doc.Components {
		got[c.Name] = c.Version + " " + c.PURL
	}
	want := map[string]string{
		"stdlib":                              "go1.26.8 pkg:golang/stdlib@go1.26.8",
		"k8s.io/client-go":                    "v0.37.2 pkg:golang/k8s.io/client-go@v0.37.2?type=module",
		"github.com/prometheus/client_golang": "v1.25.0 pkg:golang/github.com/prometheus/client_golang@v1.25.0?type=module",
		"example.com/fork":                    "v1.0.1 pkg:golang/example.com/fork@v1.0.1?type=module",
	}
	if len(got) != len(want) {
		t.Errorf("components %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("component %s: %q, want %q", k, got[k], v)
		}
	}
	m := doc.Metadata.Component
	if doc.BOMFormat != "CycloneDX" || doc.SpecVersion != "1.5" || m.Name != "syncer" || m.Version != "0.3.0" ||
		m.Hashes[0].Content != "9a3a45d01531a20e89ac6ae10b0b0beb0492acd7216a368aa062d1a5fecaf9cd" || doc.Metadata.Timestamp != "2023-11-14T22:13:20Z" {
		t.Errorf("document: %s", b)
	}
	if len(doc.Dependencies) != 1 || len(doc.Dependencies[0].DependsOn) != 4 {
		t.Errorf("dependencies %+v", doc.Dependencies)
	}
	if !strings.HasPrefix(doc.SerialNumber, "urn:uuid:") || len(doc.SerialNumber) != len("urn:uuid:")+36 || doc.SerialNumber[9+14] != '5' {
		t.Errorf("serial number %q", doc.SerialNumber)
	}
	again, _ := sbomFor(info, "0.3.0", "linux/arm64", digest, created)
	if !bytes.Equal(b, again) {
		t.Error("the same binary gave two documents")
	}
}

// -set-version with a new version writes it and stops: a release records a commit, so nothing is
// built from the uncommitted change.
func TestRunSetVersionStops(t *testing.T) {
	root := t.TempDir()
	for f, s := range map[string]string{
		"go.mod":        "module github.com/raysync/raysync\n",
		chartFile:       "version: 0.2.0\nappVersion: \"0.2.0\"\n",
		versionFiles[0]: "    app.kubernetes.io/version: \"0.2.0\"\n",
		versionFiles[1]: "    app.kubernetes.io/version: \"0.2.0\"\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, f), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Chdir(root)
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"-version", "0.3.0", "-registry", "r.example/x/", "-set-version"}, &out, &errOut); code != 0 ||
		!strings.Contains(out.String(), "0.2.0 → 0.3.0") || !strings.Contains(out.String(), "make release VERSION=0.3.0 REGISTRY=r.example/x\n") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if b, _ := os.ReadFile(filepath.Join(root, chartFile)); string(b) != "version: 0.3.0\nappVersion: \"0.3.0\"\n" {
		t.Errorf("Chart.yaml: %q", b)
	}
	if _, err := os.Stat(filepath.Join(root, "dist")); err == nil {
		t.Error("dist/ was written")
	}
}
