package projection

import (
	"context"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"

	"github.com/raysync/raysync/internal/informer"
)

// unknownAction is an action no applier case handles.
type unknownAction struct{}

func (unknownAction) isAction() {}

// Like sample-controller's "uncaptured action": an action the applier does not know fails the
// reconcile instead of passing as done.
func TestApplierRefusesAnUnknownAction(t *testing.T) {
	a := &applier{log: zap.NewNop()}
	err := a.do(context.Background(), informer.Key{}, nil, unknownAction{}, a.log)
	if err == nil || err.Error() != "unhandled action projection.unknownAction" {
		t.Fatalf("do(unknownAction) = %v, want unhandled action projection.unknownAction", err)
	}
	err = a.cluster(context.Background(), informer.Key{}, &ClusterInput{Cluster: rayCluster("c1")}, ClusterPlan{Actions: []Action{unknownAction{}}})
	if err == nil || !strings.Contains(err.Error(), "unhandled action") {
		t.Fatalf("cluster(plan with unknownAction) = %v, want the unhandled action error", err)
	}
}

// Every action type is declared in plan.go, and applier.do has a case for each.
func TestEveryActionIsDeclaredInPlanAndApplied(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	var declared, handled []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			if fn.Name.Name == "isAction" {
				typ := identName(fn.Recv.List[0].Type)
				if name != "plan.go" {
					t.Errorf("action %s is declared in %s, want plan.go", typ, name)
				}
				declared = append(declared, typ)
			}
			if fn.Name.Name == "do" && name == "apply.go" {
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					if cc, ok := n.(*ast.CaseClause); ok {
						for _, e := range cc.List {
							handled = append(handled, identName(e))
						}
					}
					return true
				})
			}
		}
	}
	if len(declared) == 0 {
		t.Fatal("found no action types")
	}
	for _, d := range declared {
		if !slices.Contains(handled, d) {
			t.Errorf("applier.do has no case for %s", d)
		}
	}
}

func identName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
