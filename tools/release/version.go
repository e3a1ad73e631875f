package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// semver is Semantic Versioning 2.0.0's own expression (semver.org), build metadata included so that
// checkVersion can name it.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// checkVersion accepts x.y.z with an optional pre-release: the chart's version, the image's tag and
// what `syncer version` prints are then one string.
func checkVersion(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("VERSION is required (x.y.z, e.g. 0.3.0)")
	case (strings.HasPrefix(v, "v") || strings.HasPrefix(v, "V")) && semver.MatchString(v[1:]):
		return fmt.Errorf("VERSION %q: write it without the leading v (%s): chart versions and image tags are bare semver", v, v[1:])
	case !semver.MatchString(v):
		return fmt.Errorf("VERSION %q is not a semantic version x.y.z[-pre-release]", v)
	}
	if m := semver.FindStringSubmatch(v); m[5] != "" {
		return fmt.Errorf("VERSION %q: build metadata (+%s) cannot be an OCI tag (helm would push the chart as %s and the image tag would differ); use a pre-release such as %s-%s",
			v, m[5], strings.ReplaceAll(v, "+", "_"), strings.SplitN(v, "+", 2)[0], m[5])
	}
	return nil
}

var (
	registryHost = `[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?`
	pathPart     = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
	registryRe   = regexp.MustCompile(`^` + registryHost + `(?:/` + pathPart + `)*$`)
)

// checkRegistry returns REGISTRY as host[:port][/path] without trailing slashes: where the image
// (REGISTRY/raysync) and the chart (oci://REGISTRY/charts/raysync) go.
func checkRegistry(r string) (string, error) {
	r = strings.TrimRight(strings.TrimSpace(r), "/")
	switch {
	case r == "":
		return "", fmt.Errorf("REGISTRY is required (host[:port][/path], e.g. ghcr.io/my-org or registry.example.com:5000/platform)")
	case strings.Contains(r, "://"):
		return "", fmt.Errorf("REGISTRY %q: write it without a scheme (host[:port][/path]); the chart goes to oci://REGISTRY/charts", r)
	case !registryRe.MatchString(r):
		return "", fmt.Errorf("REGISTRY %q is not host[:port][/path] (path parts lowercase letters, digits and . _ -)", r)
	}
	return r, nil
}

// chartFile is the version's one place: Chart.yaml's version, with appVersion equal to it.
const chartFile = "deploy/helm/raysync/Chart.yaml"

// chartVersions reads version and appVersion from Chart.yaml's text.
func chartVersions(chart string) (version, appVersion string, err error) {
	for _, l := range strings.Split(chart, "\n") {
		if v, ok := strings.CutPrefix(l, "version:"); ok {
			version = strings.Trim(strings.TrimSpace(v), `"'`)
		}
		if v, ok := strings.CutPrefix(l, "appVersion:"); ok {
			appVersion = strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	if version == "" || appVersion == "" {
		return "", "", fmt.Errorf("%s: no version or appVersion", chartFile)
	}
	return version, appVersion, nil
}

// versionFiles are the files that name the version besides Chart.yaml: the kustomize base is the
// chart rendered, so its labels and image tag carry it (e2e's TestKustomizeBaseMatchesChart checks).
var versionFiles = []string{"deploy/kustomize/base/raysync.yaml", "deploy/kustomize/overlays/example/rbac.yaml"}

// setVersion rewrites the version in Chart.yaml (version and appVersion) and in versionFiles.
func setVersion(root, old, new string) error {
	path := filepath.Join(root, chartFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	chart := bumpChart(string(b), new)
	if err := os.WriteFile(path, []byte(chart), 0o644); err != nil {
		return err
	}
	for _, f := range versionFiles {
		path := filepath.Join(root, f)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		s := strings.ReplaceAll(string(b), `app.kubernetes.io/version: "`+old+`"`, `app.kubernetes.io/version: "`+new+`"`)
		s = strings.ReplaceAll(s, `/syncer:`+old+`"`, `/syncer:`+new+`"`)
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			return err
		}
	}
	return nil
}

func bumpChart(chart, v string) string {
	lines := strings.Split(chart, "\n")
	for i, l := range lines {
		if strings.HasPrefix(l, "version:") {
			lines[i] = "version: " + v
		}
		if strings.HasPrefix(l, "appVersion:") {
			lines[i] = `appVersion: "` + v + `"`
		}
	}
	return strings.Join(lines, "\n")
}

// withImageRepository returns values.yaml with image.repository set to repo: the released chart
// installs the released image without --set.
func withImageRepository(values, repo string) (string, error) {
	lines := strings.Split(values, "\n")
	inImage, n := false, 0
	for i, l := range lines {
		if l != "" && !strings.HasPrefix(l, " ") && !strings.HasPrefix(l, "#") {
			inImage = l == "image:"
		}
		if inImage && strings.HasPrefix(strings.TrimSpace(l), "repository:") {
			indent := l[:len(l)-len(strings.TrimLeft(l, " "))]
			lines[i] = indent + "repository: " + repo
			n++
		}
	}
	if n != 1 {
		return "", fmt.Errorf("values.yaml: %d image.repository lines, want 1", n)
	}
	return strings.Join(lines, "\n"), nil
}

// withDocsURL sets the top-level docsURL of values.yaml (every alert's runbook_url and the notes' links).
func withDocsURL(values, url string) (string, error) {
	if !strings.HasPrefix(url, "https://") && !strings.HasPrefix(url, "http://") || strings.ContainsAny(url, " \t\n\"'#") {
		return "", fmt.Errorf("DOCS_URL %q: want an http(s) URL, the docs site's base", url)
	}
	lines := strings.Split(values, "\n")
	n := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "docsURL:") {
			lines[i] = "docsURL: " + strings.TrimSuffix(url, "/") + "/"
			n++
		}
	}
	if n != 1 {
		return "", fmt.Errorf("values.yaml: %d docsURL lines, want 1", n)
	}
	return strings.Join(lines, "\n"), nil
}
