package main

import (
	_ "embed"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// constant is a string constant of a package, with the doc comment that explains it.
type constant struct {
	pkg, name, value, doc string
}

// constants reads the string constants of the package in dir (tests excluded). A constant without a
// comment of its own takes the comment of the one before it in the same block, as Go readers do.
func constants(root, dir string) ([]constant, error) {
	fset := token.NewFileSet()
	files, err := goFiles(filepath.Join(root, dir))
	if err != nil {
		return nil, err
	}
	var out []constant
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			last := ""
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				doc := ""
				switch {
				case vs.Doc != nil:
					doc = vs.Doc.Text()
				case vs.Comment != nil:
					doc = vs.Comment.Text()
				case !gd.Lparen.IsValid() && gd.Doc != nil:
					doc = gd.Doc.Text()
				case strings.Contains(last, vs.Names[0].Name):
					doc = last // one comment for several ("A and B name …")
				}
				if doc != "" {
					last = doc
				}
				for i, n := range vs.Names {
					if i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					out = append(out, constant{pkg: f.Name.Name, name: n.Name, value: v, doc: doc})
				}
			}
		}
	}
	return out, nil
}

func goFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			out = append(out, filepath.Join(dir, n))
		}
	}
	return out, nil
}

// sentence turns a Go doc comment into one line, without the leading identifier Go style puts first,
// and with every other constant's identifier replaced by its value (what users see).
func sentence(doc, name string, all []constant) string {
	s := strings.Join(strings.Fields(doc), " ")
	for _, prefix := range []string{name + ": ", name + " is ", name + " "} {
		if strings.HasPrefix(s, prefix) && !strings.HasPrefix(s, name+" and ") {
			s = strings.TrimPrefix(s, prefix)
			break
		}
	}
	if s == "" {
		s = uncommented[name]
	}
	for _, c := range all {
		s = replaceWord(s, c.name, "`"+c.value+"`")
	}
	if s != "" && s[0] != '`' && !strings.HasPrefix(s, "raysync") {
		s = strings.ToUpper(s[:1]) + s[1:]
	}
	return s
}

// replaceWord replaces whole-word occurrences of old.
func replaceWord(s, old, repl string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, old)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		end := i + len(old)
		word := func(r byte) bool {
			return r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		}
		if (i > 0 && word(s[i-1])) || (end < len(s) && word(s[end])) {
			b.WriteString(s[:end])
		} else {
			b.WriteString(s[:i] + repl)
		}
		s = s[end:]
	}
}

// uncommented explains the constants the code leaves without a comment of their own (values whose
// meaning their group's comment gives as a whole).
var uncommented = map[string]string{
	"PolicyReplace":     "a RayService's cluster is replaced: KubeRay's zero-downtime blue-green upgrade starts a new cluster on the new token (RayService clusters only; default for them).",
	"PolicyRestart":     "the whole cluster is suspended, given the new token and started again: brief downtime.",
	"PolicyHold":        "the cluster keeps its token and is reported behind until `syncer rotate`, a restart or its deletion (default for standalone and RayJob clusters).",
	"KindAuthToken":     "the Ray auth token (a managed copy for `secretName`).",
	"KindPullSecret":    "a copy of a registry pull secret.",
	"KindAutoscalerTLS": "a copy of the autoscaler's client certificate.",
}

func annotationsPage(root string) ([]byte, error) {
	names, err := constants(root, "internal/names")
	if err != nil {
		return nil, err
	}
	kr, err := constants(root, "internal/kuberay")
	if err != nil {
		return nil, err
	}
	all := append(slices.Clone(names), kr...)
	byName := map[string]constant{}
	for _, c := range names {
		byName[c.name] = c
	}
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("# Annotations and labels\n\nEvery name raysync writes or matches on, from the constants in `internal/names` (raysync's) and\n`internal/kuberay` (KubeRay's, which raysync reads and writes as KubeRay does). Dashboards, alerts, kubectl\nselectors and GitOps rules may depend on them.\n")
	// The annotations people set (by hand, in their manifests, or with a syncer command), as Reloader's
	// docs keep them apart from those the tool writes.
	usersSet := map[string]bool{"SkipAnnotation": true, "RotationAnnotation": true, "AdoptAnnotation": true, "RotateAnnotation": true}
	table := func(title, suffix string, cs []constant, owner string, keep func(constant) bool) {
		fmt.Fprintf(&b, "\n## %s\n\n| key | whose | meaning |\n|---|---|---|\n", title)
		for _, c := range cs {
			if !strings.HasSuffix(c.name, suffix) || !strings.Contains(c.value, "/") || !keep(c) {
				continue
			}
			meaning := sentence(c.doc, c.name, all)
			if v, ok := byName[strings.TrimSuffix(c.name, suffix)+"Value"]; ok && c.pkg == "names" {
				meaning += fmt.Sprintf(" Value: `%s`.", v.value)
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", c.value, owner, cell(meaning))
		}
	}
	all2 := func(constant) bool { return true }
	table("Annotations you set", "Annotation", names, "you", func(c constant) bool { return usersSet[c.name] })
	table("Labels raysync writes", "Label", names, "raysync", all2)
	table("Annotations raysync writes", "Annotation", names, "raysync", func(c constant) bool { return !usersSet[c.name] })
	table("KubeRay's labels raysync reads or writes", "Label", kr, "KubeRay", all2)
	values := func(title, intro, prefix string, skip ...string) {
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n| value | meaning |\n|---|---|\n", title, intro)
		for _, c := range names {
			if !strings.HasPrefix(c.name, prefix) || slices.Contains(skip, c.name) {
				continue
			}
			fmt.Fprintf(&b, "| `%s` | %s |\n", c.value, cell(sentence(c.doc, c.name, all)))
		}
	}
	values("Rotation policies", "Values of `raysync.dev/rotation` (and of `--rotation-policy-*`; `gateway` only with the gateway on).", "Policy")
	values("What a raysync Secret or Service holds", "Values of `raysync.dev/kind` on the Secrets and Services raysync manages (also the `kind` label of the\nmetrics for the first three).", "Kind", "KindAnnotation")
	fmt.Fprintf(&b, "\n## Other names\n\n| name | meaning |\n|---|---|\n")
	for _, n := range []string{"FieldManager", "TLSVolumeName"} {
		c := byName[n]
		fmt.Fprintf(&b, "| `%s` | %s |\n", c.value, cell(sentence(c.doc, c.name, all)))
	}
	fmt.Fprintf(&b, "\n`syncer rotate` writes with the field manager `raysync-rotate`. KubeRay's generated auth Secret is named\n`CheckName(<cluster>)` (the last 50 characters of the cluster's name) and holds the token under `%s`.\n", constOf(kr, "AuthTokenKey"))
	return []byte(b.String()), nil
}

func constOf(cs []constant, name string) string {
	for _, c := range cs {
		if c.name == name {
			return c.value
		}
	}
	panic("no constant " + name)
}

//go:embed events.yaml
var eventsYAML []byte

// eventDoc is what events.yaml says about one Event reason: where it appears, its type, what it means
// and what to do. The code names the reasons and records them; this file explains them.
type eventDoc struct {
	Reason string `yaml:"reason"`
	Type   string `yaml:"type"`
	On     string `yaml:"on"`
	Means  string `yaml:"means"`
	Do     string `yaml:"do"`
}

// recorded finds, in the non-test Go files under dirs, every use of names.ReasonX and the Event type
// (corev1.EventTypeNormal/Warning, or a call to warnOnce) in the same call or literal.
func recorded(root string, dirs ...string) (files map[string][]string, types map[string][]string, err error) {
	files, types = map[string][]string{}, map[string][]string{}
	fset := token.NewFileSet()
	for _, dir := range dirs {
		err = filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(root, path)
			ast.Inspect(f, func(n ast.Node) bool {
				var parts []ast.Expr
				typ := ""
				switch x := n.(type) {
				case *ast.CallExpr:
					parts = x.Args
					if sel, ok := x.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "warnOnce" {
						typ = "Warning"
					}
				case *ast.CompositeLit:
					for _, e := range x.Elts {
						if kv, ok := e.(*ast.KeyValueExpr); ok {
							e = kv.Value
						}
						parts = append(parts, e)
					}
				case *ast.SelectorExpr:
					if id, ok := x.X.(*ast.Ident); ok && id.Name == "names" && strings.HasPrefix(x.Sel.Name, "Reason") {
						r := strings.TrimPrefix(x.Sel.Name, "Reason")
						if !slices.Contains(files[r], rel) {
							files[r] = append(files[r], rel)
						}
					}
					return true
				default:
					return true
				}
				reason := ""
				for _, p := range parts {
					sel, ok := p.(*ast.SelectorExpr)
					if !ok {
						continue
					}
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "names" && strings.HasPrefix(sel.Sel.Name, "Reason") {
						reason = strings.TrimPrefix(sel.Sel.Name, "Reason")
					}
					if strings.HasPrefix(sel.Sel.Name, "EventType") {
						typ = strings.TrimPrefix(sel.Sel.Name, "EventType")
					}
				}
				if reason != "" && typ != "" && !slices.Contains(types[reason], typ) {
					types[reason] = append(types[reason], typ)
				}
				return true
			})
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	return files, types, nil
}

func eventsPage(root string) ([]byte, error) {
	cs, err := constants(root, "internal/names")
	if err != nil {
		return nil, err
	}
	var reasons []string
	for _, c := range cs {
		if strings.HasPrefix(c.name, "Reason") {
			if c.value != strings.TrimPrefix(c.name, "Reason") {
				return nil, fmt.Errorf("%s is %q: a reason constant is named after its value", c.name, c.value)
			}
			reasons = append(reasons, c.value)
		}
	}
	var docs []eventDoc
	if err := yaml.Unmarshal(eventsYAML, &docs); err != nil {
		return nil, fmt.Errorf("events.yaml: %w", err)
	}
	doc := map[string]eventDoc{}
	for _, d := range docs {
		if !slices.Contains(reasons, d.Reason) {
			return nil, fmt.Errorf("tools/docgen/events.yaml explains %s, which internal/names does not define", d.Reason)
		}
		doc[d.Reason] = d
	}
	files, types, err := recorded(root, "internal", "cmd")
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("# Events\n\nThe reasons of the Events raysync records, from the `Reason*` constants in `internal/names`; the type and\nthe code that records each are read from the code, the explanation from `tools/docgen/events.yaml`. Like all\nKubernetes Events they are best effort: they are written a few seconds behind a fleet-wide rotation (8\nwriters; a 5,000-cluster rotation recorded all 5,000), and the [metrics](metric-list.md) are the full record.\nNone ever carries a token or a digest of one.\n\n")
	b.WriteString("| reason | type | on | means | do | recorded in |\n|---|---|---|---|---|---|\n")
	sort.Strings(reasons)
	for _, r := range reasons {
		d, ok := doc[r]
		if !ok {
			return nil, fmt.Errorf("internal/names defines Reason%s: explain it in tools/docgen/events.yaml", r)
		}
		if len(files[r]) == 0 {
			return nil, fmt.Errorf("Reason%s is recorded nowhere in internal/ or cmd/: remove it or record it", r)
		}
		t := types[r]
		sort.Strings(t)
		if len(t) > 0 && strings.Join(t, ", ") != d.Type {
			return nil, fmt.Errorf("events.yaml says %s is %q; the code records it as %q", r, d.Type, strings.Join(t, ", "))
		}
		var where []string
		for _, f := range files[r] {
			where = append(where, "`"+strings.TrimPrefix(f, "internal/")+"`")
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", r, d.Type, cell(d.On), cell(d.Means), cell(d.Do), strings.Join(where, ", "))
	}
	return []byte(b.String()), nil
}
