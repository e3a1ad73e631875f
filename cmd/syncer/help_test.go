package main

import (
	"bytes"
	"strings"
	"testing"
)

// --help is an answer, not an error, and names the subcommands.
func TestHelp(t *testing.T) {
	t.Run("syncer status --help", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code := runStatus([]string{"--help"}, &out, &errOut)
		all := out.String() + errOut.String()
		if code != 0 || strings.Contains(all, "flag: help requested") || !strings.Contains(all, "usage: syncer status") || !strings.Contains(all, "-auth-source") {
			t.Errorf("exit %d, output:\n%s", code, all)
		}
	})
	t.Run("syncer --help", func(t *testing.T) {
		var out bytes.Buffer
		usage(&out)
		if !strings.Contains(out.String(), "syncer status") || !strings.Contains(out.String(), "-auth-source") {
			t.Errorf("usage does not mention the status subcommand:\n%s", out.String())
		}
	})
}
