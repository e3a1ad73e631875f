package framework

import (
	"bytes"
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
	dir := filepath.Join(root, "e2e", "tools", "browser")
	if _, err := os.Stat(Chromium); err != nil {
		unlock, err := lockFile(filepath.Join(cache, "build.lock"))
		if err != nil {
			return "", err
		}
		logf("installing Debian's chromium (first run only)")
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, filepath.Join(dir, "install-chromium.sh"))
		cmd.Stdout, cmd.Stderr = &out, &out
		err = cmd.Run()
		unlock()
		if err != nil {
			return "", fmt.Errorf("install chromium: %v\n%s", err, lastLines(out.String(), 20))
		}
	}
	h := sha256.New()
	for _, f := range []string{"main.go", "go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	return EnsureTool(ctx, "browser-"+hex.EncodeToString(h.Sum(nil))[:12], "e2e/tools/browser", ".", logf)
}
