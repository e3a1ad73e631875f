package framework

import (
	"context"
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
	step, err := sourceStep(root, "e2e/tools/browser")
	if err != nil {
		return "", err
	}
	return ensureStep(ctx, step, logf)
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
