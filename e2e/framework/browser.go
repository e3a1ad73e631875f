package framework

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Chromium is the browser the dashboard test drives: Debian's package, installed on first use by
// e2e/tools/browser/install-chromium.sh (CI machines do not have it).
const Chromium = "/usr/bin/chromium"

// EnsureBrowser installs Chromium if needed and builds e2e/tools/browser (a chromedp program that
// logs in to Ray's dashboard and opens its jobs page); it returns the program.
func EnsureBrowser(ctx context.Context, logf func(string, ...any)) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	cache, err := CacheDir()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(Chromium); err != nil {
		logf("installing Debian's chromium (first run only)")
		if err := runPackageScript(ctx, cache, filepath.Join(root, "e2e/tools/browser/install-chromium.sh")); err != nil {
			return "", err
		}
	}
	step, err := browserStep(root)
	if err != nil {
		return "", err
	}
	return ensureStep(ctx, step, logf)
}

// browserStep is the build of e2e/tools/browser, named by a hash of its sources (an edit rebuilds it).
func browserStep(root string) (func(bin string) buildStep, error) {
	name, err := sourceName(root, "browser", "e2e/tools/browser")
	if err != nil {
		return nil, err
	}
	return func(bin string) buildStep { return toolStep(bin, name, "e2e/tools/browser", ".", "") }, nil
}

// sourceName is prefix-<hash of dir's main.go, go.mod and go.sum>: the cached name of a tool whose
// sources are this repository's.
func sourceName(root, prefix, dir string) (string, error) {
	h := sha256.New()
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(root, dir, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	return prefix + "-" + hex.EncodeToString(h.Sum(nil))[:12], nil
}

// runPackageScript runs one of the scripts that apt-get install Debian packages, one at a time per
// cache (apt-get fails when another holds dpkg's lock).
func runPackageScript(ctx context.Context, cache, script string) error {
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(filepath.Join(cache, "apt.lock"))
	if err != nil {
		return err
	}
	defer unlock()
	out, err := exec.CommandContext(ctx, script).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v\n%s", filepath.Base(script), err, lastLines(string(out), 20))
	}
	return nil
}
