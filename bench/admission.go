package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
)

// admissionNamespace is watched by the KubeRay operator; admissionBurstNamespace is not, and its pods
// never start: there the bench creates Ray-shaped pods itself, a thousand at once.
const (
	admissionNamespace      = "admission"
	admissionBurstNamespace = "admission-burst"
)

// admissionResult is one round of new clusters with a pull secret and the autoscaler's client
// certificate configured: today (templates patched, pods recycled, raysync pre-creating the auth
// Secret) or with the webhook (and pre-creation switched off, so only the webhook gives the token).
type admissionResult struct {
	Mode         string `json:"mode"` // "today" or "webhook"
	StartDelayMs int    `json:"start_delay_ms"`
	Clusters     int    `json:"clusters"`
	// SpacingMs: the clusters were created this far apart (0: all at once).
	SpacingMs int `json:"spacing_ms"`
	// Pods created in all (recycled ones included), born without raysync's entries, recycled by
	// raysync, and started (a container ran) without them.
	Pods           int `json:"pods_created"`
	BornWithout    int `json:"pods_born_without_entries"`
	Recycled       int `json:"pods_recycled"`
	StartedWithout int `json:"pods_started_without_entries"`
	// Container starts with a RAY_AUTH_TOKEN, and how many had another token than the canonical one.
	ContainerStarts int `json:"container_starts"`
	NonCanonical    int `json:"non_canonical_starts"`
	// From a RayCluster's creation to every one of its current pods having started a container.
	ReadyP50Ms float64 `json:"all_started_p50_ms"`
	ReadyMaxMs float64 `json:"all_started_max_ms"`
}

// burstConcurrency is how many pod creates (or reviews) the burst has in flight (-burst-concurrency).
var burstConcurrency = 32

// burstResult is the webhook answering a burst of pod creations.
type burstResult struct {
	Pods        int `json:"pods"`
	Concurrency int `json:"concurrency"`
	// Server side, from raysync's histogram (upper bounds of the buckets the quantiles fall in).
	ServerP50Ms float64 `json:"server_p50_ms_at_most"`
	ServerP99Ms float64 `json:"server_p99_ms_at_most"`
	// Client side: pod create calls with the webhook, and the same burst without it.
	CreateP50Ms       float64 `json:"create_p50_ms"`
	CreateP99Ms       float64 `json:"create_p99_ms"`
	CreateNoHookP50Ms float64 `json:"create_without_webhook_p50_ms"`
	CreateNoHookP99Ms float64 `json:"create_without_webhook_p99_ms"`
	// The same pod sent straight to the webhook as an AdmissionReview n times, 32 at a time, with the
	// API server idle: the webhook's own round trip over loopback TLS, exact.
	DirectP50Ms float64 `json:"direct_review_p50_ms"`
	DirectP99Ms float64 `json:"direct_review_p99_ms"`
	CPUSeconds  float64 `json:"raysync_cpu_seconds"`
	PeakRSSMi   float64 `json:"raysync_peak_rss_mib"`
	Mutated     int     `json:"mutated"`
}

// admissionSources puts the canonical token, a registry Secret and an autoscaler client certificate
// into b.ns.
func (b *bench) admissionSources() {
	ctx := context.Background()
	_, _ = b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{})
	b.token = "bench-token-" + fmt.Sprint(time.Now().UnixNano())
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ray-autoscaler"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(30 * 24 * time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(err)
	kb, _ := x509.MarshalECPrivateKey(key)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"}, Data: map[string][]byte{"auth_token": []byte(b.token)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "regcred"}, Type: corev1.SecretTypeDockerConfigJson,
			Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"` + framework.PrivateRegistry + `":{"auth":"YmVuY2g6YmVuY2g="}}}`)}},
		{ObjectMeta: metav1.ObjectMeta{Name: "autoscaler-tls"}, Type: corev1.SecretTypeTLS, Data: map[string][]byte{
			"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			"tls.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})}},
	} {
		_, err := b.cp.Kube.CoreV1().Secrets(b.ns).Create(ctx, s, metav1.CreateOptions{})
		check(err)
	}
}

// startWithWebhook runs raysync on b.ns with pod sources, serving the webhook of a URL-form
// configuration limited to namespaces (and removes both when stopped).
func (b *bench) startWithWebhook(webhook bool, namespaces []string, extra ...string) (*proc, string, func()) {
	mp, err := framework.FreePort()
	check(err)
	args := append([]string{"--namespaces=" + strings.Join(namespaces, ","), "--pull-secret=" + b.ns + "/regcred",
		"--autoscaler-tls-secret=" + b.ns + "/autoscaler-tls", fmt.Sprintf("--metrics-bind-address=127.0.0.1:%d", mp)}, extra...)
	cleanup := func() {}
	if webhook {
		port, err := framework.FreePort()
		check(err)
		name := "raysync-bench-" + b.ns
		api := b.cp.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
		_, err = api.Create(context.Background(), framework.WebhookConfiguration(name, port, namespaces), metav1.CreateOptions{})
		check(err)
		cleanup = func() {
			_ = api.Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = b.cp.Kube.CoreV1().Secrets(b.ns).Delete(context.Background(), "webhook-tls", metav1.DeleteOptions{})
		}
		args = append(args, "--precreate-auth-secrets=false", fmt.Sprintf("--webhook-addr=127.0.0.1:%d", port), "--webhook-ips=127.0.0.1",
			"--webhook-configuration="+name, "--webhook-cert-secret="+b.ns+"/webhook-tls")
	}
	s := b.startSyncer(args...)
	if webhook {
		check(wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			c, err := b.cp.Kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "raysync-bench-"+b.ns, metav1.GetOptions{})
			if err == nil && len(c.Webhooks[1].ClientConfig.CABundle) > 0 {
				b.webhookURL, b.webhookCA = *c.Webhooks[0].ClientConfig.URL, c.Webhooks[0].ClientConfig.CABundle
				return true, nil
			}
			return false, nil
		}))
	}
	return s, fmt.Sprintf("http://127.0.0.1:%d/metrics", mp), func() { s.stop(); cleanup() }
}

// admissionRound creates n autoscaling RayClusters with a private image at once, pods starting
// startDelay after creation, and follows every pod from birth to its first container start.
func (b *bench) admissionRound(n int, startDelay, spacing time.Duration, webhook bool) admissionResult {
	ctx := context.Background()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, framework.StandInStartDelay, startDelay.String())
	_, err := b.cp.Kube.CoreV1().Namespaces().Patch(ctx, b.ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	check(err)
	_, _, stop := b.startWithWebhook(webhook, []string{b.ns})
	defer stop()
	mode := map[bool]string{true: "webhook", false: "today"}[webhook]

	w, err := b.cp.Kube.CoreV1().Pods(b.ns).Watch(ctx, metav1.ListOptions{})
	check(err)
	defer w.Stop()
	var mu sync.Mutex
	born := map[types.UID]*corev1.Pod{}
	deleted := map[types.UID]bool{}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			mu.Lock()
			switch {
			case ev.Type == watch.Added:
				born[p.UID] = p
			case ev.Type == watch.Deleted || p.DeletionTimestamp != nil:
				deleted[p.UID] = true // only raysync deletes pods here
			}
			mu.Unlock()
		}
	}()

	prefix := fmt.Sprintf("adm-%s-%dms-%ds-", mode, startDelay.Milliseconds(), int(spacing.Seconds()))
	names := make([]string, n)
	created := make([]time.Time, n)
	workers := 16
	if spacing > 0 {
		workers = 1
	}
	parallel(n, workers, func(i int) {
		if spacing > 0 && i > 0 {
			time.Sleep(spacing)
		}
		names[i] = fmt.Sprintf("%s%02d", prefix, i)
		rc := rayClusterWithWorkers(b.ns, names[i], 1)
		spec := rc.Object["spec"].(map[string]any)
		spec["enableInTreeAutoscaling"] = true
		privateImages(spec)
		out, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, rc, metav1.CreateOptions{})
		check(err)
		_ = out
		created[i] = time.Now() // creationTimestamp has whole seconds: the client's clock is finer
	})

	// Every cluster's current pods (head and worker) have started a container.
	allStarted := map[string]time.Duration{}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		starts, err := b.cp.Ray.Starts(ctx, b.ns)
		if err != nil {
			return false, nil
		}
		first := map[string]time.Time{}
		for _, s := range starts {
			if t, ok := first[s.PodUID]; !ok || s.StartedAt.Before(t) {
				first[s.PodUID] = s.StartedAt
			}
		}
		for i, c := range names {
			if _, done := allStarted[c]; done {
				continue
			}
			pods, err := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + c})
			if err != nil {
				return false, nil
			}
			var last time.Time
			live := 0
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil {
					continue
				}
				live++
				t, ok := first[string(p.UID)]
				if !ok {
					last = time.Time{}
					break
				}
				if t.After(last) {
					last = t
				}
			}
			if live >= 2 && !last.IsZero() {
				allStarted[c] = last.Sub(created[i])
			}
		}
		return len(allStarted) == n, nil
	})
	if err != nil {
		for _, c := range names {
			if _, done := allStarted[c]; !done {
				pods, _ := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + c})
				for _, p := range pods.Items {
					fmt.Fprintf(os.Stderr, "bench: not started: %s %s phase %s node %q deleting %v lacks entries %v statuses %+v\n", c, p.Name, p.Status.Phase,
						p.Spec.NodeName, p.DeletionTimestamp != nil, lacksEntries(&p), p.Status.ContainerStatuses)
				}
			}
		}
	}
	check(err)
	time.Sleep(time.Second) // the watch delivers the last births

	r := admissionResult{Mode: mode, StartDelayMs: int(startDelay.Milliseconds()), Clusters: n, SpacingMs: int(spacing.Milliseconds())}
	starts, err := b.cp.Ray.Starts(ctx, b.ns)
	check(err)
	started := map[string]bool{}
	canonical := b.cp.Ray.Fingerprint(b.token)
	for _, s := range starts {
		if !strings.HasPrefix(s.Cluster, prefix) {
			continue
		}
		started[s.PodUID] = true
		if s.TokenFingerprint != "" {
			r.ContainerStarts++
			if s.TokenFingerprint != canonical {
				r.NonCanonical++
			}
		}
	}
	mu.Lock()
	for _, p := range born {
		if !strings.HasPrefix(p.Labels["ray.io/cluster"], prefix) {
			continue
		}
		r.Pods++
		if lacksEntries(p) {
			r.BornWithout++
			if deleted[p.UID] {
				r.Recycled++
			}
			if started[string(p.UID)] {
				r.StartedWithout++
			}
		}
	}
	mu.Unlock()
	var ms []float64
	for _, d := range allStarted {
		ms = append(ms, float64(d.Milliseconds()))
	}
	sort.Float64s(ms)
	r.ReadyP50Ms, r.ReadyMaxMs = pct(ms, 50), ms[len(ms)-1]
	fmt.Fprintf(os.Stderr, "bench: admission %s, %d clusters %s apart, at start delay %s: %d pods, %d born without entries, %d recycled, %d started without, %d of %d starts non-canonical, all started p50 %.0f ms\n",
		mode, n, spacing, startDelay, r.Pods, r.BornWithout, r.Recycled, r.StartedWithout, r.NonCanonical, r.ContainerStarts, r.ReadyP50Ms)
	check(b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	return r
}

func privateImages(spec map[string]any) {
	templates := []any{spec["headGroupSpec"]}
	templates = append(templates, spec["workerGroupSpecs"].([]any)...)
	for _, t := range templates {
		for _, c := range t.(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any) {
			c.(map[string]any)["image"] = framework.PrivateRegistry + "/ml/ray:2.52.0"
		}
	}
}

// lacksEntries: the pod lacks the pull secret, or is a head without the autoscaler's certificate.
func lacksEntries(p *corev1.Pod) bool {
	if !slices.ContainsFunc(p.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == "regcred" }) {
		return true
	}
	i := slices.IndexFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == "autoscaler" })
	return i >= 0 && !slices.ContainsFunc(p.Spec.Containers[i].Env, func(e corev1.EnvVar) bool { return e.Name == "RAY_KUBERAY_CLIENT_CERT_PATH" })
}

// admissionBurst creates n Ray-shaped pods of one cluster at once (32 at a time), with the webhook and
// then without, in a namespace whose pods never start.
func (b *bench) admissionBurst(n int) burstResult {
	ctx := context.Background()
	_, _ = b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: admissionBurstNamespace,
		Annotations: map[string]string{framework.StandInStart: "never"}}}, metav1.CreateOptions{})
	s, metricsURL, stop := b.startWithWebhook(true, []string{admissionBurstNamespace})
	rc := rayCluster(admissionBurstNamespace, "burst")
	rc.Object["spec"].(map[string]any)["enableInTreeAutoscaling"] = true
	out, err := b.cp.Dynamic.Resource(rcGVR).Namespace(admissionBurstNamespace).Create(ctx, rc, metav1.CreateOptions{})
	check(err)
	time.Sleep(2 * time.Second) // raysync has seen the cluster and made its copies
	before := scrape(metricsURL)
	with := b.createPods(n, "with", out)
	after := scrape(metricsURL)
	r := burstResult{Pods: n, Concurrency: burstConcurrency, CPUSeconds: after.sum("process_cpu_seconds_total") - before.sum("process_cpu_seconds_total"),
		PeakRSSMi: s.peakRSSMiB(), Mutated: int(after.value("raysync_admission_requests_total", "resource", "pods", "result", "mutated"))}
	r.ServerP50Ms, r.ServerP99Ms = after.histogramQuantile("raysync_admission_duration_seconds", 0.5)*1000, after.histogramQuantile("raysync_admission_duration_seconds", 0.99)*1000
	direct := b.reviewBurst(n, out)
	r.DirectP50Ms, r.DirectP99Ms = pct(direct, 50), pct(direct, 99)
	stop()
	without := b.createPods(n, "without", out)
	r.CreateP50Ms, r.CreateP99Ms = pct(with, 50), pct(with, 99)
	r.CreateNoHookP50Ms, r.CreateNoHookP99Ms = pct(without, 50), pct(without, 99)
	fmt.Fprintf(os.Stderr, "bench: admission burst of %d pods: direct reviews p50 %.2f ms, p99 %.2f ms; server p50 <= %.2f ms, p99 <= %.2f ms; create p50/p99 %.1f/%.1f ms with, %.1f/%.1f ms without; %.2f CPU s, peak RSS %.1f MiB, %d mutated\n",
		n, r.DirectP50Ms, r.DirectP99Ms, r.ServerP50Ms, r.ServerP99Ms, r.CreateP50Ms, r.CreateP99Ms, r.CreateNoHookP50Ms, r.CreateNoHookP99Ms, r.CPUSeconds, r.PeakRSSMi, r.Mutated)
	check(b.cp.Kube.CoreV1().Pods(admissionBurstNamespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	return r
}

// reviewBurst sends n AdmissionReviews for a KubeRay-shaped head pod of rc straight to the webhook, 32
// at a time over kept-alive TLS connections as the API server does, and returns each round trip in ms, sorted.
func (b *bench) reviewBurst(n int, rc *unstructured.Unstructured) []float64 {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(b.webhookCA)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32, TLSClientConfig: &tls.Config{RootCAs: pool}}}
	pod := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{GenerateName: "burst-head-", Namespace: rc.GetNamespace(),
		Labels:          map[string]string{"ray.io/cluster": rc.GetName(), "ray.io/node-type": "head", "app.kubernetes.io/created-by": "kuberay-operator"},
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rc, rcGVR.GroupVersion().WithKind("RayCluster"))}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.52.0"}, {Name: "autoscaler", Image: "rayproject/ray:2.52.0"}}}}
	raw, err := json.Marshal(pod)
	check(err)
	lat := make([]float64, n+burstConcurrency)
	parallel(n+burstConcurrency, burstConcurrency, func(i int) {
		review := admissionv1.AdmissionReview{TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{UID: types.UID(fmt.Sprint(i)), Operation: admissionv1.Create, Namespace: rc.GetNamespace(),
				Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Object: runtime.RawExtension{Raw: raw}}}
		body, err := json.Marshal(review)
		check(err)
		start := time.Now()
		resp, err := client.Post(b.webhookURL, "application/json", bytes.NewReader(body))
		check(err)
		var out admissionv1.AdmissionReview
		check(json.NewDecoder(resp.Body).Decode(&out))
		resp.Body.Close()
		lat[i] = float64(time.Since(start).Microseconds()) / 1000
		if out.Response == nil || !out.Response.Allowed || len(out.Response.Patch) == 0 {
			check(fmt.Errorf("direct review %d: not mutated: %+v", i, out.Response))
		}
	})
	lat = lat[burstConcurrency:] // the first ones open the connections (TLS handshakes), as the API server does once
	sort.Float64s(lat)
	return lat
}

// createPods creates n pods shaped as KubeRay makes a head (labels, controller owner, autoscaler)
// and returns each create call's latency in ms, sorted.
func (b *bench) createPods(n int, prefix string, rc *unstructured.Unstructured) []float64 {
	ctx := context.Background()
	lat := make([]float64, n)
	parallel(n, burstConcurrency, func(i int) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%04d", prefix, i), Namespace: admissionBurstNamespace,
			Labels:          map[string]string{"ray.io/cluster": rc.GetName(), "ray.io/node-type": "head", "app.kubernetes.io/created-by": "kuberay-operator"},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rc, rcGVR.GroupVersion().WithKind("RayCluster"))}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-head", Image: "rayproject/ray:2.52.0"},
				{Name: "autoscaler", Image: "rayproject/ray:2.52.0"}}}}
		start := time.Now()
		_, err := b.cp.Kube.CoreV1().Pods(admissionBurstNamespace).Create(ctx, p, metav1.CreateOptions{})
		check(err)
		lat[i] = float64(time.Since(start).Microseconds()) / 1000
	})
	sort.Float64s(lat)
	return lat
}

// metricSet is one scrape of a Prometheus text endpoint.
type metricSet map[string]*dto.MetricFamily

func scrape(url string) metricSet {
	resp, err := http.Get(url)
	check(err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	check(err)
	return metricSet(fams)
}

// sum adds every series of a counter or gauge.
func (m metricSet) sum(name string) float64 {
	f, ok := m[name]
	if !ok {
		return 0
	}
	total := 0.0
	for _, s := range f.GetMetric() {
		switch {
		case s.Counter != nil:
			total += s.GetCounter().GetValue()
		case s.Gauge != nil:
			total += s.GetGauge().GetValue()
		}
	}
	return total
}

// value is one series' value (labels as name, value pairs).
func (m metricSet) value(name string, labels ...string) float64 {
	f, ok := m[name]
	if !ok {
		return 0
	}
next:
	for _, s := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range s.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for i := 0; i+1 < len(labels); i += 2 {
			if got[labels[i]] != labels[i+1] {
				continue next
			}
		}
		return s.GetCounter().GetValue() + s.GetGauge().GetValue()
	}
	return 0
}

// histogramQuantile is the upper bound of the bucket the q-quantile of a histogram (all series
// added) falls in.
func (m metricSet) histogramQuantile(name string, q float64) float64 {
	f, ok := m[name]
	if !ok {
		return math.NaN()
	}
	cum := map[float64]uint64{}
	var total uint64
	for _, s := range f.GetMetric() {
		h := s.GetHistogram()
		total += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			cum[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	var bounds []float64
	for ub := range cum {
		bounds = append(bounds, ub)
	}
	sort.Float64s(bounds)
	for _, ub := range bounds {
		if float64(cum[ub]) >= q*float64(total) {
			return ub
		}
	}
	return math.Inf(1)
}
