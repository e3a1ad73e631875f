package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

const chartDir = "deploy/helm/raysync"

// schema is the part of a JSON schema the values table shows.
type schema struct {
	Description string             `json:"description"`
	Type        any                `json:"type"`
	Enum        []any              `json:"enum"`
	Ref         string             `json:"$ref"`
	AnyOf       []schema           `json:"anyOf"`
	Const       any                `json:"const"`
	Properties  map[string]*schema `json:"properties"`
	Required    []string           `json:"required"`
}

// valueRow is one line of the values table.
type valueRow struct {
	key, typ, def, desc string
}

// valueRows walks values.yaml in its order, with each key's type and description from the schema. Every
// key needs a schema property with a description, and every schema property a key: the table is complete.
func valueRows(root string) ([]valueRow, error) {
	raw, err := os.ReadFile(filepath.Join(root, chartDir, "values.yaml"))
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	sb, err := os.ReadFile(filepath.Join(root, chartDir, "values.schema.json"))
	if err != nil {
		return nil, err
	}
	var top schema
	if err := json.Unmarshal(sb, &top); err != nil {
		return nil, fmt.Errorf("values.schema.json: %w", err)
	}
	var rows []valueRow
	var walk func(n *yaml.Node, s *schema, prefix string) error
	walk = func(n *yaml.Node, s *schema, prefix string) error {
		seen := map[string]bool{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			key := prefix + k
			seen[k] = true
			ps, ok := s.Properties[k]
			if !ok {
				return fmt.Errorf("values.yaml has %s, which values.schema.json does not describe", key)
			}
			if ps.Description == "" {
				return fmt.Errorf("values.schema.json: %s has no description", key)
			}
			if v.Kind == yaml.MappingNode && len(ps.Properties) > 0 {
				if err := walk(v, ps, key+"."); err != nil {
					return err
				}
				continue
			}
			var val any
			if err := v.Decode(&val); err != nil {
				return err
			}
			def, _ := json.Marshal(val)
			rows = append(rows, valueRow{key: key, typ: typeOf(ps), def: string(def), desc: ps.Description})
		}
		var missing []string
		for k := range s.Properties {
			if !seen[k] {
				missing = append(missing, prefix+k)
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("values.schema.json describes %s, which values.yaml does not have", strings.Join(missing, ", "))
		}
		return nil
	}
	if err := walk(doc.Content[0], &top, ""); err != nil {
		return nil, err
	}
	return rows, nil
}

func typeOf(s *schema) string {
	switch {
	case len(s.Enum) > 0:
		var vs []string
		for _, e := range s.Enum {
			vs = append(vs, fmt.Sprintf("`%v`", e))
		}
		return "one of " + strings.Join(vs, ", ")
	case s.Ref != "":
		return map[string]string{
			"#/definitions/namespacedName": "NAMESPACE/NAME",
			"#/definitions/namespace":      "namespace",
			"#/definitions/duration":       "duration",
		}[s.Ref]
	case len(s.AnyOf) > 0:
		var vs []string
		for _, a := range s.AnyOf {
			t := typeOf(&a)
			switch c := a.Const.(type) {
			case nil:
			case string:
				t = fmt.Sprintf("`%q`", c)
			default:
				t = fmt.Sprintf("`%v`", c)
			}
			if t != "" && !contains(vs, t) {
				vs = append(vs, t)
			}
		}
		return strings.Join(vs, " or ")
	}
	switch t := s.Type.(type) {
	case string:
		return t
	case []any:
		var vs []string
		for _, x := range t {
			vs = append(vs, fmt.Sprint(x))
		}
		return strings.Join(vs, " or ")
	}
	return ""
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func valuesTable(rows []valueRow) string {
	var b strings.Builder
	b.WriteString("| key | type | default | description |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s |\n", r.key, cell(r.typ), cell(r.def), cell(r.desc))
	}
	return b.String()
}

const overrides = `**Where one value overrides others**

- ` + "`gateway.enabled: true`" + ` replaces ` + "`rotation.policies`" + `: ` + "`gateway.rotationPolicy`" + ` (default ` + "`gateway`" + `: a rotation moves no
  cluster) becomes the policy of every owner kind. The annotation ` + "`raysync.dev/rotation`" + ` on a cluster overrides both.
- ` + "`webhook.certManager.enabled: true`" + ` makes ` + "`webhook.certValidity`" + ` and ` + "`webhook.ips`" + ` unused (cert-manager issues the certificate).
- ` + "`dryRun: true`" + ` serves no webhook, whatever ` + "`webhook.enabled`" + ` says.
- ` + "`rbac.scope`" + ` empty follows the scope: namespaced Roles for ` + "`namespaces`" + `, a ClusterRole for ` + "`allNamespaces`" + `.
`

func valuesPage(root string) ([]byte, error) {
	rows, err := valueRows(root)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("# Chart values\n\nThe values of the `raysync` chart, in `values.yaml`'s order, with their types and descriptions from\n`values.schema.json` (which also rejects values raysync would refuse). Required: `authSource.namespace`,\n`authSource.name`, and a scope (`namespaces` or `allNamespaces`); everything optional is off or safe by default.\n\n")
	b.WriteString(overrides + "\n")
	b.WriteString(valuesTable(rows))
	return []byte(b.String()), nil
}

func chartReadme(root string) ([]byte, error) {
	if _, err := valueRows(root); err != nil { // the values page it links to must generate
		return nil, err
	}
	version, err := chartVersion(root)
	if err != nil {
		return nil, err
	}
	docs, err := docsURL(root)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(header)
	b.WriteString(`# raysync chart

One canonical Ray auth token, registry pull secrets and autoscaler client TLS for every RayCluster run by stock
KubeRay (v1.5.1, v1.6.1). Documentation: ` + docs + ` (the value ` + "`docsURL`" + `; every alert links its runbook there).

## Install

Follow the quick start, ` + docs + `getting-started/helm/#quick-start: it publishes this chart and raysync's image to
your own registry (there is no official one yet), creates the canonical token Secret, installs, then checks. Only
the source and a scope are required; pull secrets, autoscaler TLS, the ServiceMonitor, the PrometheusRule and the
gateway are off by default.

**Installing moves no running cluster**: clusters already running on KubeRay's own tokens are listed as not adopted
and left alone until you adopt them (` + docs + `guides/running-fleet/). The install command's shape:

` + "```sh" + `
helm install raysync oci://registry.example.com/platform/charts/raysync --version ` + version + ` -n raysync \
  --set authSource.namespace=raysync,authSource.name=ray-token \
  --set 'namespaces={ml-team}'
` + "```" + `

Upgrading: read CHANGELOG.md, and use ` + "`--reset-then-reuse-values`" + ` or ` + "`-f`" + ` your values, not ` + "`--reuse-values`" + `.

## Values

Every value, its type, default and description, and where one value overrides others: ` + docs + `reference/values/
(generated, like this README, from ` + "`values.yaml`" + ` and ` + "`values.schema.json`" + `, which also rejects bad values).
`)
	return []byte(b.String()), nil
}

// chartVersion is Chart.yaml's version, the one place of raysync's version.
func chartVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "deploy/helm/raysync/Chart.yaml"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "version:"); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("deploy/helm/raysync/Chart.yaml: no version")
}

// docsURL is values.yaml's docsURL: the docs site the chart links to.
func docsURL(root string) (string, error) {
	raw, err := os.ReadFile(filepath.Join(root, chartDir, "values.yaml"))
	if err != nil {
		return "", err
	}
	var v struct {
		DocsURL string `yaml:"docsURL"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil || v.DocsURL == "" {
		return "", fmt.Errorf("values.yaml: no docsURL (%v)", err)
	}
	return v.DocsURL, nil
}
