package main

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"

	"github.com/raysync/raysync/internal/metrics"
)

// metricDoc is one metric as its registry describes it.
type metricDoc struct {
	name, help, typ string
	labels          []string
}

var (
	descName   = regexp.MustCompile(`fqName: "([^"]+)"`)
	descHelp   = regexp.MustCompile(`help: "((?:[^"\\]|\\.)*)"`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// describeRegistry reads every raysync_* metric a registry can export from its collectors' descriptors,
// and each one's type from a gather after exercise gave every metric a series.
func describeRegistry(r *prometheus.Registry, exercise func()) ([]metricDoc, error) {
	ch := make(chan *prometheus.Desc, 128)
	go func() { r.Describe(ch); close(ch) }()
	var docs []metricDoc
	for d := range ch {
		s := d.String()
		m := descName.FindStringSubmatch(s)
		if m == nil || !strings.HasPrefix(m[1], "raysync_") {
			continue
		}
		doc := metricDoc{name: m[1]}
		if h := descHelp.FindStringSubmatch(s); h != nil {
			doc.help = strings.ReplaceAll(h[1], `\"`, `"`)
		}
		if l := descLabels.FindStringSubmatch(s); l != nil && strings.TrimSpace(l[1]) != "" {
			for _, v := range strings.Split(l[1], ",") {
				doc.labels = append(doc.labels, strings.TrimSpace(v))
			}
		}
		docs = append(docs, doc)
	}
	exercise()
	families, err := r.Gather()
	if err != nil {
		return nil, err
	}
	types := map[string]string{}
	for _, f := range families {
		types[f.GetName()] = strings.ToLower(dto.MetricType_name[int32(f.GetType())])
	}
	for i := range docs {
		t, ok := types[docs[i].name]
		if !ok {
			return nil, fmt.Errorf("%s has no series to read its type from: give it one in tools/docgen/metrics.go's exercise", docs[i].name)
		}
		docs[i].typ = t
	}
	sort.Slice(docs, func(i, j int) bool { return docs[i].name < docs[j].name })
	return docs, nil
}

// fullSnapshot has one object of every kind, so the scrape-time collector reports every metric.
func fullSnapshot() metrics.Snapshot {
	now := time.Unix(1_800_000_000, 0)
	return metrics.Snapshot{
		Now:       now,
		Sources:   []metrics.SourceState{{Source: "ns/src", Valid: true, NotAfter: now.Add(time.Hour)}},
		Targets:   []metrics.TargetState{{Namespace: "ns", RayCluster: "rc", Kind: "auth_token", State: "in_sync"}},
		StalePods: []metrics.StalePods{{Namespace: "ns", RayCluster: "rc", Reason: "pull_secret", Count: 1}},
		Deferred:  []metrics.ClusterRef{{Namespace: "ns", RayCluster: "rc"}},
		Rotations: []metrics.RotationState{{Namespace: "ns", RayCluster: "rc", Kind: "RayCluster", State: "behind", Since: now.Add(-time.Hour)}},
	}
}

func metricsPage(string) ([]byte, error) {
	m := metrics.New(fullSnapshot)
	controller, err := describeRegistry(m.Registry, func() {
		m.SourcesConfigured("ns/src")
		m.LastRotation.WithLabelValues("ns/src").Set(1)
		m.Propagation.Observe(1)
		m.RotationDuration.Observe(1)
		m.AdmissionDuration.WithLabelValues("pods").Observe(1)
		q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "docgen"})
		q.AddRateLimited("x")
		q.ShutDown()
		clientmetrics.RequestResult.Increment(context.Background(), "200", "GET", "host")
		clientmetrics.RequestLatency.Observe(context.Background(), "GET", url.URL{}, time.Second)
	})
	if err != nil {
		return nil, err
	}
	g := metrics.NewGateway()
	gateway, err := describeRegistry(g.Registry, func() { g.Observe("http", "forwarded", "current", 0.1) })
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("# Every metric\n\nEvery `raysync_*` metric, read from the descriptors of the collectors registered in `internal/metrics`\n(name, type, labels, help). What they mean together, which replica exports what, and the PromQL for the SLIs:\n[Metrics and SLIs](../metrics.md). Both processes also export the Go runtime's `go_*` and `process_*`.\n")
	table := func(title string, docs []metricDoc) {
		fmt.Fprintf(&b, "\n## %s\n\n| metric | type | labels | help |\n|---|---|---|---|\n", title)
		for _, d := range docs {
			labels := "—"
			if len(d.labels) > 0 {
				labels = "`" + strings.Join(d.labels, "`, `") + "`"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", d.name, d.typ, labels, cell(d.help))
		}
	}
	table("The controller (`syncer`)", controller)
	table("The gateway (`syncer gateway`)", gateway)
	return []byte(b.String()), nil
}
