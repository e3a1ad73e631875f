// Command promql checks PromQL for raysync's tests: it reads one expression per line on standard
// input, parses each with Prometheus' own parser, and prints the metric names each one selects
// ("name1 name2"), or "ERROR: <reason>" for an expression that does not parse. It exits 1 if any failed.
package main

import (
	"bufio"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	failed := false
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	p := parser.NewParser(parser.Options{})
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		expr, err := p.ParseExpr(line)
		if err != nil {
			failed = true
			fmt.Println("ERROR:", strings.ReplaceAll(err.Error(), "\n", " "))
			continue
		}
		names := map[string]bool{}
		parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				for _, m := range vs.LabelMatchers {
					if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
						names[m.Value] = true
					}
				}
			}
			return nil
		})
		var out []string
		for n := range names {
			out = append(out, n)
		}
		sort.Strings(out)
		fmt.Println(strings.Join(out, " "))
	}
	if failed {
		os.Exit(1)
	}
}
