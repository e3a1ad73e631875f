package e2e

import (
	"context"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raysync/raysync/e2e/framework"
)

// TestImage checks what can be checked without a Docker engine: the Dockerfile's shape, that the
// binary it builds (same flags) is static, and that an image assembled like its final stage (by
// go-containerregistry, on an empty base) has one file, a numeric non-root user and the entrypoint.
func TestImage(t *testing.T) {
	root, _ := framework.RepoRoot()
	df, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "FROM gcr.io/distroless/static", "USER 65532:65532", `ENTRYPOINT ["/syncer"]`} {
		if !strings.Contains(string(df), want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "syncer")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/syncer")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("syncer has a dynamic loader (PT_INTERP): not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("syncer links shared libraries: %v", libs)
	}
	f.Close()

	tool, err := framework.EnsureImageTool(context.Background(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	tarPath := filepath.Join(dir, "raysync.tar")
	if out, err := exec.Command(tool, "build", "-binary", bin, "-out", tarPath).CombinedOutput(); err != nil {
		t.Fatalf("image build: %v\n%s", err, out)
	}
	out, err := exec.Command(tool, "inspect", tarPath).Output()
	if err != nil {
		t.Fatalf("image inspect: %v", err)
	}
	var r struct {
		User       string
		Entrypoint []string
		Layers     int
		Files      []struct {
			Name string
			Mode int64
		}
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatal(err)
	}
	if r.User != "65532:65532" || strings.Join(r.Entrypoint, " ") != "/syncer" || r.Layers != 1 || len(r.Files) != 1 ||
		r.Files[0].Name != "syncer" || r.Files[0].Mode&0o222 != 0 {
		t.Errorf("image: %s", out)
	}
}
