package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// growthResult is what one fleet size costs raysync (the growth scenario).
type growthResult struct {
	N int `json:"n"`
	// ReadyS: from starting the process to /readyz answering (every cache synced) and the webhook serving.
	ReadyS    float64 `json:"ready_s"`
	PeakRSSMi float64 `json:"peak_rss_mib"`
	// Scrape: one /metrics answer (wall time, and the process's allocations between two scrapes), medians of 5.
	ScrapeMs     float64 `json:"scrape_ms"`
	ScrapeAllocs float64 `json:"scrape_allocs"`
	ScrapeBytes  float64 `json:"scrape_bytes"`
	// FanOutLastMs: the source written, every target holds the new token.
	FanOutLastMs float64 `json:"fanout_last_ms"`
	// WebhookP99Ms: a burst of 1,000 admission reviews sent straight to the webhook, 32 at a time.
	WebhookP50Ms float64     `json:"webhook_p50_ms"`
	WebhookP99Ms float64     `json:"webhook_p99_ms"`
	Idle         *idleResult `json:"idle"`
}

// growth measures raysync over n RayClusters in one namespace not watched by KubeRay: each cluster
// with its KubeRay-shaped auth Secret already holding the canonical token, a template listing the
// pull secret, and one head pod as KubeRay creates it, which the stand-in leaves Pending (no Ray runs:
// 10,000 emulated Ray heads do not fit a 2-core machine). raysync runs with a pull secret, the
// autoscaler's client certificate and the webhook, as in production.
func (b *bench) growth(n int, audit *auditLog, idleFor time.Duration) growthResult {
	ctx := context.Background()
	b.admissionSources()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"never"}}}`, framework.StandInStart)
	_, err := b.cp.Kube.CoreV1().Namespaces().Patch(ctx, b.ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	check(err)
	created := time.Now()
	withPullSecret := func(rc *unstructured.Unstructured) {
		spec := rc.Object["spec"].(map[string]any)["headGroupSpec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		spec["imagePullSecrets"] = []any{map[string]any{"name": "regcred"}}
	}
	headPod := func(rc *unstructured.Unstructured) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: rc.GetName() + "-head", Namespace: b.ns,
			Labels:          map[string]string{kuberay.ClusterLabel: rc.GetName(), kuberay.NodeTypeLabel: "head", "app.kubernetes.io/created-by": "kuberay-operator"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rc, rcGVR.GroupVersion().WithKind("RayCluster"))}},
			Spec: corev1.PodSpec{ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
				Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.52.0"}}}}
		_, err := b.cp.Kube.CoreV1().Pods(b.ns).Create(ctx, p, metav1.CreateOptions{})
		check(err)
	}
	b.clusters(n, func(string) []byte { return []byte(b.token) }, withPullSecret, headPod)
	fmt.Fprintf(os.Stderr, "bench: growth N=%d: %d clusters, Secrets and pods created in %s\n", n, n, time.Since(created).Round(time.Second))

	r := growthResult{N: n}
	start := time.Now()
	s, metricsURL, stop := b.startWithWebhook(true, []string{b.ns})
	r.ReadyS = time.Since(start).Seconds()
	r.Idle = b.idle(audit, "raysync", n, idleFor)

	var ms, allocs, bytes []float64
	prevAllocs, prevBytes := scrapeCost(metricsURL)
	for range 5 {
		t0 := time.Now()
		a, by := scrapeCost(metricsURL)
		ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
		allocs, bytes = append(allocs, a-prevAllocs), append(bytes, by-prevBytes)
		prevAllocs, prevBytes = a, by
	}
	r.ScrapeMs, r.ScrapeAllocs, r.ScrapeBytes = median(ms), median(allocs), median(bytes)

	r.FanOutLastMs = b.rotate(n, 0).LastMs
	rc, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Get(ctx, "c00000", metav1.GetOptions{})
	check(err)
	lat := b.reviewBurst(1000, rc)
	r.WebhookP50Ms, r.WebhookP99Ms = pct(lat, 50), pct(lat, 99)
	r.PeakRSSMi = s.peakRSSMiB()
	stop()
	fmt.Fprintf(os.Stderr, "bench: growth N=%d: ready %.1f s, peak RSS %.1f MiB, scrape %.1f ms / %.0f allocations / %.0f KiB, fan-out %.0f ms, webhook p99 %.2f ms, idle %.3f requests/s\n",
		n, r.ReadyS, r.PeakRSSMi, r.ScrapeMs, r.ScrapeAllocs, r.ScrapeBytes/1024, r.FanOutLastMs, r.WebhookP99Ms, r.Idle.RequestsPerSec)
	_ = b.cp.Kube.CoreV1().Namespaces().Delete(ctx, b.ns, metav1.DeleteOptions{}) // the next size starts on its own namespace
	return r
}

// scrapeCost reads /metrics whole and returns the process's allocation count and bytes allocated
// so far (go_memstats_mallocs_total, go_memstats_alloc_bytes_total), as of this scrape.
func scrapeCost(url string) (allocs, bytes float64) {
	resp, err := http.Get(url)
	check(err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	check(err)
	_, _ = fmt.Sscanf(metricLine(body, "go_memstats_mallocs_total "), "%g", &allocs)
	_, _ = fmt.Sscanf(metricLine(body, "go_memstats_alloc_bytes_total "), "%g", &bytes)
	return allocs, bytes
}

func metricLine(body []byte, prefix string) string {
	for len(body) > 0 {
		i := 0
		for i < len(body) && body[i] != '\n' {
			i++
		}
		if line := string(body[:i]); len(line) > len(prefix) && line[:len(prefix)] == prefix {
			return line[len(prefix):]
		}
		if i == len(body) {
			break
		}
		body = body[i+1:]
	}
	return ""
}

func printGrowth(g []growthResult) {
	if len(g) == 0 {
		return
	}
	sort.Slice(g, func(i, j int) bool { return g[i].N < g[j].N })
	fmt.Println("\n| growth: clusters N | start → ready (caches synced) | peak RSS | scrape (median of 5) | scrape allocations / bytes | fan-out: last target | webhook burst p50 / p99 | idle API requests/s |\n|---|---|---|---|---|---|---|---|")
	for _, x := range g {
		fmt.Printf("| %d | %.1f s | %.1f MiB | %.1f ms | %.0f / %.1f MiB | %.0f ms | %.2f / %.2f ms | %.3f (%s) |\n", x.N, x.ReadyS, x.PeakRSSMi, x.ScrapeMs,
			x.ScrapeAllocs, x.ScrapeBytes/(1<<20), x.FanOutLastMs, x.WebhookP50Ms, x.WebhookP99Ms, x.Idle.RequestsPerSec, breakdown(x.Idle.Requests))
	}
}
