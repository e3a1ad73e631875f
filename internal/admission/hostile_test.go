package admission_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/raysync/raysync/internal/admission"
)

// hostilePod is a pod that passes every check on its metadata (the labels and the controller
// reference of ray/c1, UID uid-c1: all a caller needs to know) with a spec of n bytes of shape.
func hostilePod(n int, shape string) []byte {
	meta := `{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"c1-head-","namespace":"ray","labels":{"ray.io/cluster":"c1"},` +
		`"ownerReferences":[{"apiVersion":"ray.io/v1","kind":"RayCluster","name":"c1","uid":"uid-c1","controller":true}]},"spec":{"containers":[{"name":"ray-head","image":"r"}],"x":`
	var b strings.Builder
	b.WriteString(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","operation":"CREATE","namespace":"ray","object":`)
	b.WriteString(meta)
	switch shape {
	case "empty objects": // the black-box finding: ~50 bytes of maps per 3 bytes of JSON
		b.WriteString("[{}")
		for b.Len() < n {
			b.WriteString(",{}")
		}
		b.WriteString("]")
	case "nested":
		depth := (n - b.Len()) / 2
		b.WriteString(strings.Repeat("[", depth) + strings.Repeat("]", depth))
	case "wide object":
		b.WriteString("{")
		for i := 0; b.Len() < n; i++ {
			fmt.Fprintf(&b, `"k%d":{},`, i)
		}
		b.WriteString(`"z":0}`)
	}
	b.WriteString("}}}}")
	return []byte(b.String())
}

// Each hostile review costs at most what the webhook reserves for it (reviewCost: twice its length and
// 1 MiB), whatever its shape: it is refused on its length or its shape before anything is decoded.
// Before the bounds, the 3 MiB review of empty objects cost ~100 times its length (a map per {}).
func TestHostileReviewCostsNoMoreThanItsReservation(t *testing.T) {
	h, m := realHandler(t)
	for _, c := range []struct {
		size  int
		shape string
		code  int
	}{
		{7_500_000, "empty objects", http.StatusRequestEntityTooLarge},
		{3_400_000, "empty objects", http.StatusBadRequest},
		{3_400_000, "nested", http.StatusBadRequest},
		{3_400_000, "wide object", http.StatusBadRequest},
		{20_000, "empty objects", http.StatusOK}, // under the value bound: decoded, and answered
	} {
		body := hostilePod(c.size, c.shape)
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, admission.PodsPath, bytes.NewReader(body)))
		runtime.ReadMemStats(&after)
		if rec.Code != c.code {
			t.Errorf("%d bytes of %s: HTTP %d, want %d (%s)", len(body), c.shape, rec.Code, c.code, rec.Body.String())
		}
		allocated := after.TotalAlloc - before.TotalAlloc
		if limit := uint64(2*len(body) + 1<<20); allocated > limit {
			t.Errorf("%d bytes of %s: allocated %d bytes, more than the %d the webhook reserves for it", len(body), c.shape, allocated, limit)
		}
		t.Logf("%d bytes of %s: HTTP %d, %d bytes allocated", len(body), c.shape, rec.Code, allocated)
	}
	if got := testutil.ToFloat64(m.Admission.WithLabelValues("pods", "invalid")); got != 4 {
		t.Errorf("invalid reviews counted %v, want 4", got)
	}
}

// 100 hostile reviews at once, over real connections: the heap stays within the webhook's budget
// (plus the garbage the collector has not reclaimed yet: far below the chart's 256 MiB limit), every
// one is answered, and a KubeRay pod's review is answered with its patch afterwards.
func TestHundredConcurrentHostileReviewsStayWithinTheBudget(t *testing.T) {
	h, _ := realHandler(t)
	srv := httptest.NewServer(h)
	defer srv.Close()
	shapes := []string{"empty objects", "nested", "wide object"}
	bodies := map[string][]byte{}
	for _, s := range shapes {
		bodies[s] = hostilePod(3_400_000, s)
	}
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapAlloc > peak.Load() {
				peak.Store(ms.HeapAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	var wg sync.WaitGroup
	codes := make([]int, 100)
	for i := range 100 {
		wg.Go(func() {
			resp, err := http.Post(srv.URL+admission.PodsPath, "application/json", bytes.NewReader(bodies[shapes[i%len(shapes)]]))
			if err != nil {
				t.Errorf("review %d: %v", i, err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	close(stop)
	<-sampled
	for i, c := range codes {
		if c != http.StatusBadRequest && c != http.StatusServiceUnavailable {
			t.Errorf("review %d: HTTP %d, want 400 (refused on its shape) or 503 (no room)", i, c)
		}
	}
	grew := int64(peak.Load()) - int64(base.HeapAlloc)
	if limit := int64(2*admission.ReviewBudget + 16<<20); grew > limit {
		t.Errorf("heap grew by %d MiB at its peak, over %d MiB (twice the budget: what the collector may leave)", grew>>20, limit>>20)
	}
	t.Logf("heap peak %d MiB over a base of %d MiB", grew>>20, base.HeapAlloc>>20)
	resp, err := http.Post(srv.URL+admission.PodsPath, "application/json", bytes.NewReader(headPodReview("uid-c1")))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(out.Bytes(), []byte(`"patch"`)) {
		t.Errorf("a KubeRay head pod after the flood: HTTP %d %s", resp.StatusCode, out.String())
	}
}

// A review naming a RayCluster the caches hold, under another UID, waits as long as one naming no
// cluster at all: the answer's timing tells an unauthenticated caller nothing about which names exist.
func TestForgedOwnerWaitsAsLongAsAMissingCluster(t *testing.T) {
	h, _ := realHandler(t)
	timed := func(body []byte) time.Duration {
		start := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, admission.PodsPath, bytes.NewReader(body)))
		if rec.Code != http.StatusOK || bytes.Contains(rec.Body.Bytes(), []byte(`"patch"`)) {
			t.Errorf("forged review: HTTP %d %s", rec.Code, rec.Body.String())
		}
		return time.Since(start)
	}
	missing := headPod("uid-c9")
	missing.Labels["ray.io/cluster"], missing.OwnerReferences[0].Name = "c9", "c9"
	exists, absent := timed(headPodReview("not-the-uid")), timed(podReview(missing))
	if exists < 400*time.Millisecond || absent < 400*time.Millisecond {
		t.Errorf("forged owner answered in %s, missing cluster in %s: both must wait the full 0.5 s", exists, absent)
	}
}
