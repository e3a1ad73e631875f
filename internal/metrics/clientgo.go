package metrics

import (
	"context"
	"net/url"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
	"k8s.io/client-go/util/workqueue"
)

// client-go exposes its work-queue and REST-client instrumentation through process-global hooks,
// so the collectors are global too and every registry registers the same ones.
var (
	wqDepth = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "raysync_workqueue_depth",
		Help: "Current depth of the work queue."}, []string{"name"})
	wqAdds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "raysync_workqueue_adds_total",
		Help: "Keys added to the work queue."}, []string{"name"})
	wqLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "raysync_workqueue_queue_duration_seconds",
		Help: "Time a key waits in the work queue before a worker takes it.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 11)}, []string{"name"})
	wqWork = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "raysync_workqueue_work_duration_seconds",
		Help: "Time a worker spends on one key.", Buckets: prometheus.ExponentialBuckets(0.0001, 4, 11)}, []string{"name"})
	wqUnfinished = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "raysync_workqueue_unfinished_work_seconds",
		Help: "Seconds of work in progress that has not finished."}, []string{"name"})
	wqLongest = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "raysync_workqueue_longest_running_processor_seconds",
		Help: "Seconds the longest-running worker has been busy with one key."}, []string{"name"})
	wqRetries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "raysync_workqueue_retries_total",
		Help: "Keys re-added with backoff after a failed reconcile."}, []string{"name"})

	restRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "raysync_rest_client_requests_total",
		Help: "Requests raysync made to the Kubernetes API, by status code, method and host."}, []string{"code", "method", "host"})
	restLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "raysync_rest_client_request_duration_seconds",
		Help: "Kubernetes API request latency by verb.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)}, []string{"verb"})

	hookOnce sync.Once
)

func registerClientGo(r *prometheus.Registry) {
	hookOnce.Do(func() {
		workqueue.SetProvider(queueProvider{})
		clientmetrics.Register(clientmetrics.RegisterOpts{
			RequestResult:  requestResult{},
			RequestLatency: requestLatency{},
		})
	})
	r.MustRegister(clientGoCollectors...)
}

var clientGoCollectors = []prometheus.Collector{wqDepth, wqAdds, wqLatency, wqWork, wqUnfinished, wqLongest, wqRetries, restRequests, restLatency}

type queueProvider struct{}

func (queueProvider) NewDepthMetric(n string) workqueue.GaugeMetric {
	return wqDepth.WithLabelValues(n)
}
func (queueProvider) NewAddsMetric(n string) workqueue.CounterMetric {
	return wqAdds.WithLabelValues(n)
}
func (queueProvider) NewLatencyMetric(n string) workqueue.HistogramMetric {
	return wqLatency.WithLabelValues(n)
}
func (queueProvider) NewWorkDurationMetric(n string) workqueue.HistogramMetric {
	return wqWork.WithLabelValues(n)
}
func (queueProvider) NewUnfinishedWorkSecondsMetric(n string) workqueue.SettableGaugeMetric {
	return wqUnfinished.WithLabelValues(n)
}
func (queueProvider) NewLongestRunningProcessorSecondsMetric(n string) workqueue.SettableGaugeMetric {
	return wqLongest.WithLabelValues(n)
}
func (queueProvider) NewRetriesMetric(n string) workqueue.CounterMetric {
	return wqRetries.WithLabelValues(n)
}

type requestResult struct{}

func (requestResult) Increment(_ context.Context, code, method, host string) {
	restRequests.WithLabelValues(code, method, host).Inc()
}

type requestLatency struct{}

func (requestLatency) Observe(_ context.Context, verb string, _ url.URL, d time.Duration) {
	restLatency.WithLabelValues(verb).Observe(d.Seconds())
}
