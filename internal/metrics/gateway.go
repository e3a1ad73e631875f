package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Gateway holds the metrics `syncer gateway` exports (its own process and registry).
type Gateway struct {
	Registry *prometheus.Registry
	// Requests counts answers by protocol (http, grpc), result and the client credential presented.
	Requests *prometheus.CounterVec
	// Duration is the time to the answer's headers (a streamed body or a Ray Client session can
	// last for ever after them).
	Duration *prometheus.HistogramVec
	// UpstreamAuthFailures counts clusters refusing the token the gateway forwarded with: a bug or a
	// stale table, never a client's fault. Must stay 0.
	UpstreamAuthFailures *prometheus.CounterVec
	// PreviousLastUsed is when a client last presented the previous token (0: never since start),
	// now while a request or Ray Client session that presented it is still open.
	PreviousLastUsed prometheus.GaugeFunc
	// Connections counts open client connections by protocol; ConnectionsRefused those refused at
	// the cap.
	Connections        *prometheus.GaugeVec
	ConnectionsRefused *prometheus.CounterVec
	// TableValid is 1 while the published table parses; Routes the objects it routes.
	TableValid prometheus.Gauge
	Routes     prometheus.Gauge

	own []prometheus.Collector
	// Now is the clock of PreviousLastUsed (tests).
	Now func() time.Time

	mu           sync.Mutex
	previousOpen int       // requests open that presented the previous token
	previousLast time.Time // when the last of them ended, or began
}

// NewGateway registers the gateway's metrics with the Go and process collectors.
func NewGateway() *Gateway {
	g := &Gateway{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_gateway_requests_total",
			Help: "Requests the gateway answered, by protocol (http: Jobs API and dashboard; grpc: Ray Client), result and the client credential presented (current, previous, pending, none).",
		}, []string{"protocol", "result", "credential"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "raysync_gateway_request_duration_seconds",
			Help:    "Time from a request's arrival to its answer's headers, by protocol.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 18), // 0.1 ms … 13 s
		}, []string{"protocol"}),
		UpstreamAuthFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_gateway_upstream_auth_failures_total",
			Help: "Requests a cluster refused although the gateway forwarded them with the token the table says it runs on (must stay 0).",
		}, []string{"protocol"}),
		Connections: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "raysync_gateway_connections",
			Help: "Client connections open, by protocol (http: 8265, grpc: 10001).",
		}, []string{"protocol"}),
		ConnectionsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "raysync_gateway_connections_refused_total",
			Help: "Client connections refused because the port already served its maximum (--max-connections), by protocol.",
		}, []string{"protocol"}),
		TableValid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "raysync_gateway_table_valid",
			Help: "1 while the gateway's published table exists and parses (else it keeps the last good one, or refuses every request until it has one).",
		}),
		Routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "raysync_gateway_routes",
			Help: "RayServices and RayClusters the gateway routes to.",
		}),
	}
	g.Now = time.Now
	g.PreviousLastUsed = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "raysync_gateway_previous_token_last_used_timestamp_seconds",
		Help: "Unix time at which a client last presented the previous canonical token (0: not since this replica started); the current time while a request or Ray Client session that presented it is open. Revoking it is safe once this is old on every replica.",
	}, g.previousLastUsed)
	for _, p := range []string{"http", "grpc"} {
		g.UpstreamAuthFailures.WithLabelValues(p)
		g.Connections.WithLabelValues(p)
		g.ConnectionsRefused.WithLabelValues(p)
	}
	g.own = []prometheus.Collector{g.Requests, g.Duration, g.UpstreamAuthFailures, g.PreviousLastUsed, g.TableValid, g.Routes,
		g.Connections, g.ConnectionsRefused}
	g.Registry.MustRegister(g.own...)
	g.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return g
}

// Observe records one request as it is answered (seconds: to its answer's headers); Done, with
// the same credential, when it ends.
func (g *Gateway) Observe(protocol, result, credential string, seconds float64) {
	g.Requests.WithLabelValues(protocol, result, credential).Inc()
	g.Duration.WithLabelValues(protocol).Observe(seconds)
	if credential == "previous" {
		g.mu.Lock()
		g.previousOpen++
		g.previousLast = g.Now()
		g.mu.Unlock()
	}
}

// Done records the end of a request Observe recorded.
func (g *Gateway) Done(credential string) {
	if credential == "previous" {
		g.mu.Lock()
		g.previousOpen--
		g.previousLast = g.Now()
		g.mu.Unlock()
	}
}

func (g *Gateway) previousLastUsed() float64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.previousOpen > 0:
		return float64(g.Now().Unix())
	case g.previousLast.IsZero():
		return 0
	}
	return float64(g.previousLast.Unix())
}

// Names lists the gateway's raysync_* metric names.
func (g *Gateway) Names() []string { return describe(g.own) }
