package framework

import (
	"regexp"
	"strings"
	"testing"
)

// TestBuildFlagsAreWellFormed checks every `go build` the harness runs on a cold cache: a malformed
// -ldflags (once "-s -w-s -w", from a concatenation) only fails where nothing is cached, which is CI.
func TestBuildFlagsAreWellFormed(t *testing.T) {
	b := &Binaries{Etcd: "/c/etcd", APIServer: "/c/apiserver", ControllerManager: "/c/kcm"}
	var builds [][]string
	for _, s := range controlPlaneSteps(b, "/repo") {
		builds = append(builds, s.args)
	}
	builds = append(builds, toolArgs("/c/tool", "example.com/tool", ""), toolArgs("/c/helm", "helm.sh/helm/v3/cmd/helm", helmLdflags()))
	x := regexp.MustCompile(`^[a-zA-Z0-9./_-]+\.[A-Za-z_][A-Za-z0-9_]*=\S+$`)
	for _, args := range builds {
		var ldflags string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "-ldflags="); ok {
				ldflags = v
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
