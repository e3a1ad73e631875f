package app

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit are stamped by `make release` (tools/release) with -ldflags -X from
// deploy/helm/raysync/Chart.yaml, the version's one place, and the release's git commit.
var version, commit string

// versionLine is what `syncer version` prints: a release names its version and commit; any other
// build says it is a development build and names the commit Go recorded, if any.
func versionLine(version, commit string, info *debug.BuildInfo) string {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	if version != "" {
		return fmt.Sprintf("syncer %s (commit %s, %s, %s)", version, orUnknown(commit), runtime.Version(), platform)
	}
	if commit == "" && info != nil {
		var modified bool
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if commit != "" && modified {
			commit += "-dirty"
		}
	}
	return fmt.Sprintf("syncer development build, not a release (commit %s, %s, %s)", orUnknown(commit), runtime.Version(), platform)
}

// releaseVersion is the version a running raysync logs at start: the release's, or "development build".
func releaseVersion() string {
	if version == "" {
		return "development build"
	}
	return version
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

func (x *cli) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:               "version",
		Short:             "print raysync's version and the commit it was built from",
		Args:              noArgs,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info, _ := debug.ReadBuildInfo()
			_, err := fmt.Fprintln(x.stdout, versionLine(version, commit, info))
			return err
		},
	}
}
