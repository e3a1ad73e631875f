package framework

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBuildFlagsAreWellFormed checks every `go build` the harness runs on a cold cache: a malformed
// -ldflags (once "-s -w-s -w", from a concatenation) only fails where nothing is cached, which is CI.
func TestBuildFlagsAreWellFormed(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	browser, err := sourceStep(root, "e2e/tools/browser")
	if err != nil {
		t.Fatal(err)
	}
	rayclient, err := sourceStep(root, "e2e/tools/rayclient")
	if err != nil {
		t.Fatal(err)
	}
	const bin = "/c/bin"
	steps := append(controlPlaneSteps(bin), nodeSteps(bin)...)
	steps = append(steps, kubeSteps(bin, "kubectl")[0], helmStep(bin), imageToolStep(bin), promqlStep(bin), promtoolStep(bin), esoStep(bin), browser(bin), rayclient(bin))
	x := regexp.MustCompile(`^[a-zA-Z0-9./_-]+\.[A-Za-z_][A-Za-z0-9_]*=\S+$`)
	outs := map[string]bool{}
	for _, s := range steps {
		args := s.flags
		if outs[s.out] || !strings.HasPrefix(s.out, bin+"/") {
			t.Errorf("%s: output %s is outside %s or not unique", s.pkg, s.out, bin)
		}
		outs[s.out] = true
		if _, err := os.Stat(filepath.Join(root, s.dir, "go.mod")); err != nil {
			t.Errorf("%s: %s is not a tools module: %v", s.pkg, s.dir, err)
		}
		var ldflags string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "-ldflags="); ok {
				ldflags = v
			} else if !strings.HasPrefix(a, "-tags=") {
				t.Errorf("%v: %q is neither -ldflags nor -tags", args, a)
			}
		}
		fields := strings.Fields(ldflags)
		if len(fields) < 2 || fields[0] != "-s" || fields[1] != "-w" {
			t.Errorf("%v: -ldflags %q does not start with -s -w", args, ldflags)
		}
		for i := 2; i < len(fields); i++ {
			if fields[i] != "-X" || i+1 == len(fields) || !x.MatchString(fields[i+1]) {
				t.Errorf("%v: -ldflags %q: %q is not -X importpath.name=value", args, ldflags, strings.Join(fields[i:], " "))
				break
			}
			i++
		}
	}
}

// TestCommandName: the file `go build -o dir/` writes for each package runSteps builds in one go.
func TestCommandName(t *testing.T) {
	for pkg, want := range map[string]string{
		"k8s.io/kubernetes/cmd/kube-apiserver":                           "kube-apiserver",
		"go.etcd.io/etcd/server/v3":                                      "server",
		"github.com/containerd/containerd/v2/cmd/ctr":                    "ctr",
		"github.com/containernetworking/plugins/plugins/ipam/host-local": "host-local",
		"example.com/v2": "example.com", "example.com/v1": "v1", "example.com/v0": "v0", "example.com/v10": "example.com",
		"v2": "v2",
	} {
		if got := commandName(pkg); got != want {
			t.Errorf("commandName(%q) = %q, want %q", pkg, got, want)
		}
	}
}
