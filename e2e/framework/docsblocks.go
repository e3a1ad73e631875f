package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DocsBlocks returns the fenced blocks of docs/<page> marked `<!-- docs-run: name -->`, in order: the
// commands the docs tests run as written.
func DocsBlocks(page, name string) ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(root, "docs", page))
	if err != nil {
		return nil, err
	}
	var blocks []string
	marker := "<!-- docs-run: " + name + " -->"
	armed, in := false, false
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.TrimSpace(line) == marker:
			armed = true
		case armed && !in && strings.HasPrefix(line, "```"):
			in, cur = true, strings.Builder{}
		case in && strings.HasPrefix(line, "```"):
			blocks = append(blocks, cur.String())
			in, armed = false, false
		case in:
			cur.WriteString(line + "\n")
		}
	}
	if len(blocks) == 0 {
		return nil, fmt.Errorf("docs/%s has no block marked %s", page, marker)
	}
	return blocks, nil
}
