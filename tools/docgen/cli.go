package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/raysync/raysync/cmd/syncer/app"
)

// cliPage is the syncer command's reference, from its command tree: every command, what `--help` says
// of it, and every flag with its default. Defaults from the environment ($POD_NAMESPACE) are left out.
func cliPage(string) ([]byte, error) {
	root := app.Command(func(string) string { return "" })
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("# The syncer command\n\n")
	b.WriteString("`syncer --help` and `syncer <command> --help` print what this page says, for the binary you have.\n\n")
	b.WriteString("| command | |\n|---|---|\n")
	cmds := []*cobra.Command{root}
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			cmds = append(cmds, c)
		}
	}
	for _, c := range cmds {
		fmt.Fprintf(&b, "| [`%s`](#%s) | %s |\n", c.CommandPath(), strings.ReplaceAll(c.CommandPath(), " ", "-"), cell(c.Short))
	}
	for _, c := range cmds {
		commandSection(&b, root, c)
	}
	return []byte(regexp.MustCompile("\n{3,}").ReplaceAllString(b.String(), "\n\n")), nil
}

func commandSection(b *strings.Builder, root, c *cobra.Command) {
	fmt.Fprintf(b, "\n## %s\n\n", c.CommandPath())
	b.WriteString(prose(c.Long))
	b.WriteString("```text\n")
	for _, l := range strings.Split(strings.TrimSpace(c.UsageString()), "\n")[1:] { // "Usage:" and its lines
		if strings.TrimSpace(l) == "" {
			break
		}
		b.WriteString(strings.TrimSpace(l) + "\n")
	}
	b.WriteString("```\n\n")
	if c.Example != "" {
		b.WriteString("Examples:\n\n```sh\n")
		for _, l := range strings.Split(c.Example, "\n") {
			b.WriteString(strings.TrimPrefix(l, "  ") + "\n")
		}
		b.WriteString("```\n\n")
	}
	// A command's flag that is the controller's (same name, meaning and default) is named, not repeated.
	var own, shared []*pflag.Flag
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		if r := root.Flags().Lookup(f.Name); c != root && r != nil && r.Usage == f.Usage && r.DefValue == f.DefValue {
			shared = append(shared, f)
			return
		}
		own = append(own, f)
	})
	if len(own) > 0 {
		b.WriteString("| flag | default | |\n|---|---|---|\n")
		for _, f := range own {
			name := "`--" + f.Name + "`"
			if f.Shorthand != "" {
				name = "`-" + f.Shorthand + "`, " + name
			}
			if t, _ := pflag.UnquoteUsage(f); t != "" {
				name += " " + t
			}
			def := ""
			if f.DefValue != "" && f.DefValue != "[]" {
				def = "`" + f.DefValue + "`"
			}
			fmt.Fprintf(b, "| %s | %s | %s |\n", name, def, cell(f.Usage))
		}
		b.WriteString("\n")
	}
	if len(shared) > 0 {
		var names []string
		for _, f := range shared {
			names = append(names, "`--"+f.Name+"`")
		}
		fmt.Fprintf(b, "It also takes these [flags of the controller](#syncer): %s.\n", strings.Join(names, ", "))
	}
}

// prose is a command's long description as Markdown: paragraphs as they are (no HTML), lines indented
// by two spaces as shell blocks.
func prose(long string) string {
	var b strings.Builder
	code := false
	for _, l := range strings.Split(strings.TrimSpace(long), "\n") {
		isCode := strings.HasPrefix(l, "  ")
		if isCode != code {
			if isCode {
				b.WriteString("\n```sh\n")
			} else {
				b.WriteString("```\n\n")
			}
			code = isCode
		}
		if code {
			b.WriteString(strings.TrimPrefix(l, "  ") + "\n")
			continue
		}
		r := strings.NewReplacer("<", "&lt;", ">", "&gt;", "*", `\*`, "_", `\_`)
		b.WriteString(r.Replace(l) + "\n")
	}
	if code {
		b.WriteString("```\n")
	}
	return b.String() + "\n"
}
