package projection

import (
	"go/ast"
	"go/parser"
	gotoken "go/token" // the tests have a constant named token
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestPlannersArePure keeps plan.go and plan_*.go functions of their input alone, so that every
// replica and every restart plans the same: no client, cache, metric, log, lock or context, and no
// clock but ClusterInput.Now.
func TestPlannersArePure(t *testing.T) {
	imports := []string{"k8s.io/client-go", "github.com/raysync/raysync/internal/informer",
		"github.com/raysync/raysync/internal/metrics", "go.uber.org/zap", "sync", "context"}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
		"Tick": true, "NewTimer": true, "NewTicker": true}
	files, err := filepath.Glob("plan*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") || (name != "plan.go" && !strings.HasPrefix(name, "plan_")) {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		timeName := ""
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range imports {
				if path == bad || strings.HasPrefix(path, bad+"/") {
					t.Errorf("%s imports %s", name, path)
				}
			}
			if path == "time" {
				timeName = "time"
				if imp.Name != nil {
					timeName = imp.Name.Name // a dot import hides the calls: refused below
				}
			}
		}
		if timeName == "." {
			t.Errorf("%s dot-imports time", name)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == timeName && clock[sel.Sel.Name] {
				t.Errorf("%s: time.%s (the planners' clock is ClusterInput.Now)", fset.Position(sel.Pos()), sel.Sel.Name)
			}
			return true
		})
	}
	if checked < 7 {
		t.Fatalf("checked %d planner files, want plan.go and at least 6 plan_*.go", checked)
	}
}
