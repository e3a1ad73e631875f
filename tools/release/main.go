// Command release cuts a raysync release from this checkout, with no Docker engine:
//
//	go run ./tools/release -version 0.3.0 -registry registry.example.com/platform   # make release VERSION=… REGISTRY=…
//
// It writes into -dist (default dist/) the syncer binaries for linux and darwin (amd64, arm64), a
// CycloneDX SBOM of each (from the binary's own build info), the packaged chart, and SHA256SUMS; it
// pushes REGISTRY/raysync:VERSION (an OCI index of linux/amd64 and linux/arm64) and the chart to
// oci://REGISTRY/charts/raysync. The version's one place is deploy/helm/raysync/Chart.yaml: VERSION
// must equal it, or -set-version writes it there first. Credentials come from the Docker config
// ($DOCKER_CONFIG or ~/.docker/config.json, with its credential helpers), which helm reads too.
package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/raysync/raysync/e2e/framework"
)

// source is where a release's code lives (the images' org.opencontainers.image.source).
const source = "https://github.com/raysync/raysync"

// versionPkg receives -X version=… and commit=… (cmd/syncer/app/version.go).
const versionPkg = "github.com/raysync/raysync/cmd/syncer/app"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	version, registry, dist, caFile, docsURL string
	setVersion, plainHTTP                    bool
}

// run returns 0 released, 1 failed midway, 2 refused before doing anything.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.version, "version", "", "the release's version, x.y.z[-pre-release] (must equal Chart.yaml's unless -set-version)")
	fs.StringVar(&o.registry, "registry", "", "host[:port][/path]: the image goes to REGISTRY/raysync, the chart to oci://REGISTRY/charts")
	fs.StringVar(&o.dist, "dist", "dist", "directory for the binaries, SBOMs, chart and SHA256SUMS")
	fs.StringVar(&o.caFile, "ca-file", "", "CA bundle to trust for the registry, besides the system's")
	fs.StringVar(&o.docsURL, "docs-url", "", "where you serve this release's docs site (make docs builds it into site/): the published chart's docsURL, which every alert and the install notes link into (default: the chart's, mkdocs.yml's site_url)")
	fs.BoolVar(&o.setVersion, "set-version", false, "when VERSION differs from Chart.yaml's, write it there (and into the kustomize base) and stop: commit, then release")
	fs.BoolVar(&o.plainHTTP, "plain-http", false, "talk HTTP, not HTTPS, to the registry (a local test registry)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	root, err := framework.RepoRoot()
	var set string
	if err == nil {
		set, err = o.check(root)
	}
	if err != nil {
		fmt.Fprintln(stderr, "release:", err)
		return 2
	}
	if set != "" {
		// A release records a commit: the new version is committed before anything is built.
		fmt.Fprintf(stdout, "%s: %s → %s (and the kustomize base). Run make docs-gen, add the chart's CHANGELOG entry, commit, then make release VERSION=%s REGISTRY=%s\n",
			chartFile, set, o.version, o.version, o.registry)
		return 0
	}
	if err := o.release(ctx, root, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "release:", err)
		return 1
	}
	return 0
}

// check refuses a release that would not be one version everywhere. With -set-version it writes a
// different version into Chart.yaml instead, and returns the version it replaced.
func (o *options) check(root string) (replaced string, err error) {
	if err := checkVersion(o.version); err != nil {
		return "", err
	}
	if o.docsURL != "" {
		if _, err := withDocsURL("docsURL: x", o.docsURL); err != nil {
			return "", err
		}
	}
	reg, err := checkRegistry(o.registry)
	if err != nil {
		return "", err
	}
	o.registry = reg
	b, err := os.ReadFile(filepath.Join(root, chartFile))
	if err != nil {
		return "", err
	}
	version, appVersion, err := chartVersions(string(b))
	if err != nil {
		return "", err
	}
	switch {
	case version != appVersion:
		return "", fmt.Errorf("%s: version %s and appVersion %s differ; they are one version (chart N runs raysync N)", chartFile, version, appVersion)
	case version == o.version:
		return "", nil
	case !o.setVersion:
		return "", fmt.Errorf("VERSION %s but %s says %s: release that, or set it with SET_VERSION=1 (-set-version) and commit", o.version, chartFile, version)
	}
	return version, setVersion(root, version, o.version)
}

func (o *options) release(ctx context.Context, root string, stdout, stderr io.Writer) error {
	logf := func(format string, args ...any) { fmt.Fprintf(stderr, "release: "+format+"\n", args...) }
	commit, created, err := revision(ctx, root)
	if err != nil {
		return err
	}
	if strings.HasSuffix(commit, "-dirty") {
		logf("the working tree has uncommitted changes: the release records commit %s", commit)
	}
	dist, err := filepath.Abs(o.dist)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dist, 0o755); err != nil {
		return err
	}
	// Only this release's files: SHA256SUMS covers the whole directory.
	for _, pattern := range []string{"syncer-*", "raysync-*.tgz", "SHA256SUMS"} {
		old, _ := filepath.Glob(filepath.Join(dist, pattern))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				return err
			}
		}
	}
	var imageBins []string
	for _, p := range framework.ReleasePlatforms {
		goos, goarch, _ := strings.Cut(p, "/")
		bin := filepath.Join(dist, "syncer-"+goos+"-"+goarch)
		t0 := time.Now()
		if err := buildSyncer(ctx, root, bin, goos, goarch, o.version, commit); err != nil {
			return err
		}
		if err := writeSBOM(bin, o.version, p, created); err != nil {
			return err
		}
		logf("built %s and its SBOM in %s", filepath.Base(bin), time.Since(t0).Round(time.Millisecond))
		if goos == "linux" {
			imageBins = append(imageBins, "-binary", p+"="+bin)
		}
	}

	image := o.registry + "/raysync:" + o.version
	digest, err := o.pushImage(ctx, image, imageBins, commit, created, logf)
	if err != nil {
		return err
	}
	logf("pushed %s (%s)", image, digest)

	chart, err := o.packageChart(ctx, root, dist, logf)
	if err != nil {
		return err
	}
	if err := writeSums(dist); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image  %s\n       %s\nchart  oci://%s/charts/raysync --version %s\nfiles  %s (binaries, SBOMs, %s, SHA256SUMS)\n",
		image, digest, o.registry, o.version, dist, filepath.Base(chart))
	return nil
}

// pushImage pushes the OCI index of the linux binaries (-binary OS/ARCH=FILE pairs) with the image
// tool and returns its digest reference.
func (o *options) pushImage(ctx context.Context, image string, bins []string, commit string, created time.Time, logf func(string, ...any)) (string, error) {
	tool, err := framework.EnsureImageTool(ctx, logf)
	if err != nil {
		return "", err
	}
	args := []string{"index", "-ref", image, "-created", strconv.FormatInt(created.Unix(), 10)}
	for _, l := range []string{"title=raysync", "version=" + o.version, "revision=" + commit, "source=" + source, "created=" + created.Format(time.RFC3339)} {
		args = append(args, "-label", "org.opencontainers.image."+l)
	}
	args = append(append(args, bins...), o.registryFlags("-ca", "-plain-http")...)
	out, err := exec.CommandContext(ctx, tool, args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("push image %s: %v\n%s", image, err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// registryFlags are the CA and plain-HTTP flags under the names a tool takes them.
func (o *options) registryFlags(caFlag, plainFlag string) []string {
	var f []string
	if o.caFile != "" {
		ca, _ := filepath.Abs(o.caFile)
		f = append(f, caFlag, ca)
	}
	if o.plainHTTP {
		f = append(f, plainFlag)
	}
	return f
}

// revision is the commit being released (with -dirty when the tree has changes) and the time every
// artifact carries: $SOURCE_DATE_EPOCH, else the commit's time, so a rebuild gives the same bytes.
func revision(ctx context.Context, root string) (string, time.Time, error) {
	git := func(args ...string) (string, error) {
		cmd := exec.CommandContext(ctx, "git", args...)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out)), nil
	}
	commit, err := git("rev-parse", "HEAD")
	if err != nil {
		return "", time.Time{}, err
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err != nil {
		return "", time.Time{}, err
	} else if st != "" {
		commit += "-dirty"
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return "", time.Time{}, err
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", epoch, err)
	}
	return commit, time.Unix(sec, 0).UTC(), nil
}

// buildSyncer builds the static syncer as the Dockerfile does, stamped with the version and commit.
func buildSyncer(ctx context.Context, root, out, goos, goarch, version, commit string) error {
	ldflags := fmt.Sprintf("-s -w -X %s.version=%s -X %s.commit=%s", versionPkg, version, versionPkg, commit)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags="+ldflags, "-o", out, "./cmd/syncer")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s/%s: %v\n%s", goos, goarch, err, b)
	}
	return nil
}

// writeSBOM writes bin.cdx.json from the build info Go embedded in bin.
func writeSBOM(bin, version, platform string, created time.Time) error {
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	info, err := buildinfo.Read(bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("build info of %s: %w", bin, err)
	}
	doc, err := sbomFor(info, version, platform, sha256Of(b), created)
	if err != nil {
		return err
	}
	return os.WriteFile(bin+".cdx.json", append(doc, '\n'), 0o644)
}

// packageChart packages the chart at the release's version with image.repository defaulting to the
// pushed image, and pushes it with helm to oci://REGISTRY/charts.
func (o *options) packageChart(ctx context.Context, root, dist string, logf func(string, ...any)) (string, error) {
	helm := os.Getenv("HELM")
	if helm == "" {
		var err error
		if helm, err = framework.EnsureHelm(ctx, logf); err != nil {
			return "", err
		}
	}
	tmp, err := os.MkdirTemp("", "raysync-chart-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	src, dst := filepath.Join(root, "deploy/helm/raysync"), filepath.Join(tmp, "raysync")
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		return "", err
	}
	values, err := os.ReadFile(filepath.Join(dst, "values.yaml"))
	if err != nil {
		return "", err
	}
	v, err := withImageRepository(string(values), o.registry+"/raysync")
	if err != nil {
		return "", err
	}
	if o.docsURL != "" {
		if v, err = withDocsURL(v, o.docsURL); err != nil {
			return "", err
		}
	}
	if err := os.WriteFile(filepath.Join(dst, "values.yaml"), []byte(v), 0o644); err != nil {
		return "", err
	}
	helmRun := func(args ...string) error {
		out, err := exec.CommandContext(ctx, helm, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("helm %s: %v\n%s", args[0], err, out)
		}
		return nil
	}
	if err := helmRun("package", dst, "--version", o.version, "--app-version", o.version, "-d", dist); err != nil {
		return "", err
	}
	tgz := filepath.Join(dist, "raysync-"+o.version+".tgz")
	ref := "oci://" + o.registry + "/charts"
	if err := helmRun(append([]string{"push", tgz, ref}, o.registryFlags("--ca-file", "--plain-http")...)...); err != nil {
		return "", err
	}
	logf("pushed %s/raysync:%s", ref, o.version)
	return tgz, nil
}

// writeSums writes SHA256SUMS (sha256sum's format: `sha256sum -c SHA256SUMS` checks it) over every
// other file in dist.
func writeSums(dist string) error {
	entries, err := os.ReadDir(dist)
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != "SHA256SUMS" {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(dist, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%x  %s\n", sha256Of(data), n)
	}
	return os.WriteFile(filepath.Join(dist, "SHA256SUMS"), []byte(b.String()), 0o644)
}
