package app

import (
	"bytes"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionLine(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	for name, tc := range map[string]struct {
		version, commit string
		info            *debug.BuildInfo
		want            string
	}{
		"release":                 {"0.3.0", "0123abc", vcs("fff", "false"), "syncer 0.3.0 (commit 0123abc, "},
		"release without commit":  {"0.3.0", "", nil, "syncer 0.3.0 (commit unknown, "},
		"dev build from git":      {"", "", vcs("4567def", "false"), "syncer development build, not a release (commit 4567def, "},
		"dev build, changed tree": {"", "", vcs("4567def", "true"), "syncer development build, not a release (commit 4567def-dirty, "},
		"dev build without vcs":   {"", "", &debug.BuildInfo{}, "syncer development build, not a release (commit unknown, "},
	} {
		if got := versionLine(tc.version, tc.commit, tc.info); !strings.HasPrefix(got, tc.want) {
			t.Errorf("%s: %q, want it to start with %q", name, got, tc.want)
		}
	}
}

func TestVersionCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main([]string{"version"}, &out, &errOut, func(string) string { return "" }); code != 0 || errOut.Len() > 0 ||
		!strings.HasPrefix(out.String(), "syncer development build, not a release") {
		t.Errorf("syncer version: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if code := Main([]string{"version", "extra"}, &out, &errOut, func(string) string { return "" }); code != 2 {
		t.Errorf("syncer version extra: exit %d, want 2", code)
	}
}
