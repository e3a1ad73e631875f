package app

import (
	"bytes"
	"strings"
	"testing"
)

// --help is an answer, not an error (exit 0, on stdout), and names every command and its flags.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"syncer [command]", "status", "rotate", "uninstall", "revoke-previous", "gateway", "completion", "--auth-source", "--webhook-addr"}},
		{[]string{"status", "--help"}, []string{"syncer status [flags]", "-o, --output", "--auth-source"}},
		{[]string{"revoke-previous", "-h"}, []string{"syncer revoke-previous [flags]", "--name", "--dry-run"}},
		{[]string{"rotate", "--help"}, []string{"syncer rotate TARGET... | --all [flags]", "--all"}},
		{[]string{"gateway", "--help"}, []string{"syncer gateway [flags]", "--table-secret"}},
		{[]string{"help", "uninstall"}, []string{"syncer uninstall [flags]", "--yes"}},
	} {
		var out, errOut bytes.Buffer
		code := Main(tc.args, &out, &errOut, func(string) string { return "" })
		if code != 0 || errOut.Len() > 0 {
			t.Errorf("syncer %s: exit %d, stderr %q", strings.Join(tc.args, " "), code, errOut.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("syncer %s does not say %q:\n%s", strings.Join(tc.args, " "), w, out.String())
			}
		}
	}
}

// Errors are one line on stderr with exit 2, named after the command, whatever went wrong.
func TestErrorsAreOneLine(t *testing.T) {
	for args, want := range map[string]string{
		"--frobnicate": "syncer: unknown flag: --frobnicate (syncer --help lists the flags)",
		"status --auth-source=a/b --all-namespaces -o x": "", // -o is checked by the command: 2 too, before it talks to an API server
		"status --all-namespaces":                        "syncer status: --auth-source is required (NAMESPACE/NAME)",
		"stauts":                                         `syncer: unexpected argument "stauts" (the command "status"?)`,
		"rotate --output=json":                           "syncer rotate: unknown flag: --output (syncer rotate --help lists the flags)",
		"gateway --auth-source=a/b":                      "syncer gateway: --auth-source is a flag of the controller that syncer gateway does not take",
		"completion fish":                                `syncer completion: invalid argument "fish" for "syncer completion"`,
		"--workers=a\nb --auth-source=a/b --all-namespaces --leader-elect=false": `syncer: invalid argument "a\nb" for "--workers" flag`,
	} {
		var out, errOut bytes.Buffer
		code := Main(strings.Split(args, " "), &out, &errOut, func(string) string { return "" })
		if code != 2 || out.Len() > 0 || strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), want) {
			t.Errorf("syncer %s: exit %d, stdout %q, stderr %q; want 2 and one line with %q", args, code, out.String(), errOut.String(), want)
		}
	}
}

// `syncer completion bash|zsh` prints a script the shell reads, and the script asks the binary, which
// completes commands, flags and flag values.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "# bash completion V2 for syncer", "zsh": "#compdef syncer"} {
		var out bytes.Buffer
		if code := Main([]string{"completion", shell}, &out, &out, func(string) string { return "" }); code != 0 || !strings.Contains(out.String(), want) {
			t.Errorf("completion %s: exit %d, output starts %q", shell, code, firstLine(out.String()))
		}
	}
	for args, want := range map[string][]string{
		"__complete st":         {"status"},
		"__complete status -o ": {"table", "json"},
		"__complete status --rotation-policy-rayservice ": {"replace", "restart", "hold", "gateway"},
		"__complete rotate --al":                          {"--all", "--all-namespaces"},
		"__complete completion ":                          {"bash", "zsh"},
	} {
		var out bytes.Buffer
		Main(strings.Split(args, " "), &out, &bytes.Buffer{}, func(string) string { return "" })
		for _, w := range want {
			if !strings.Contains(out.String(), w+"\t") && !strings.Contains(out.String(), w+"\n") {
				t.Errorf("%q completes to\n%s\nwithout %q", args, out.String(), w)
			}
		}
	}
}
