package projection

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Benchmarks of the hot pure functions (go test -bench . ./internal/projection).

func BenchmarkTokenTargetFor(b *testing.B) {
	rc := rayCluster("ml-inference-abcde")
	for b.Loop() {
		if _, ok, _ := TokenTargetFor(rc, tokenSrc); !ok {
			b.Fatal("not a target")
		}
	}
}

// BenchmarkStatus1000 is one scrape's worth of state over 1,000 in-sync clusters.
func BenchmarkStatus1000(b *testing.B) {
	var clusters []*unstructured.Unstructured
	objs := []runtime.Object{sourceSecret(token)}
	for i := range 1000 {
		name := fmt.Sprintf("c%04d", i)
		clusters = append(clusters, rayCluster(name))
		objs = append(objs, secret(ns, name, map[string]string{"auth_token": token}, ownedBy(name)))
	}
	h := newHarnessWith(b, Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{}}}, clusters, objs...)
	b.ResetTimer()
	for b.Loop() {
		if _, st := h.ctrl.reporter.Status(); len(st) != 1000 {
			b.Fatalf("%d clusters", len(st))
		}
	}
}

// scrapeFleet is 1,000 in-sync clusters shaped like a production fleet: a head and 4 worker groups,
// 40 env entries per container, autoscaling, a running head and two running workers each, with a pull
// secret and the autoscaler's client TLS configured and in place.
func scrapeFleet(b testing.TB) *harness { return fleetOf(b, 1000, nil) }

// fleetOf is n clusters of scrapeFleet's shape; vary, when not nil, changes cluster i's objects
// (the cluster, its token target, its pods) before they are stored.
func fleetOf(b testing.TB, n int, vary func(i int, rc *unstructured.Unstructured, target *corev1.Secret, pods []*corev1.Pod) []runtime.Object) *harness {
	b.Helper()
	crt, key := testCert(b)
	tlsSrc := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "autoscaler-tls"}
	tlsSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tlsSrc.Name, Namespace: tlsSrc.Namespace}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	pods := PodOptions{PullSecrets: []types.NamespacedName{pullSource}, AutoscalerTLS: &tlsSrc, MountPath: podtemplate.DefaultTLSMountPath}
	cfg := podtemplate.Config{PullSecrets: []string{pullSource.Name}, TLS: &podtemplate.TLS{SecretName: tlsSrc.Name, MountPath: podtemplate.DefaultTLSMountPath}}
	env := make([]any, 40)
	for i := range env {
		env[i] = map[string]any{"name": fmt.Sprintf("VAR_%d", i), "value": strings.Repeat("v", 20)}
	}
	container := func(name string) map[string]any {
		return map[string]any{"name": name, "image": "registry.example/ray:2.52.0", "env": runtime.DeepCopyJSONValue(env)}
	}
	copyOf := func(src *corev1.Secret, kind names.Kind) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: src.Name, Namespace: ns,
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.SourceAnnotation: src.Namespace + "/" + src.Name, names.KindAnnotation: string(kind)}},
			Type: src.Type, Data: copyData(src, kind)}
	}
	objs := []runtime.Object{sourceSecret(token), pullSecretSource(), tlsSecret, copyOf(pullSecretSource(), names.KindPullSecret), copyOf(tlsSecret, names.KindAutoscalerTLS)}
	var clusters []*unstructured.Unstructured
	for i := range n {
		name := fmt.Sprintf("c%04d", i)
		rc := rayCluster(name, autoscaling)
		spec := rc.Object["spec"].(map[string]any)
		spec["headGroupSpec"] = map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{container("ray-head")}}}}
		var groups []any
		for g := range 4 {
			groups = append(groups, map[string]any{"groupName": fmt.Sprintf("g%d", g), "replicas": int64(2),
				"template": map[string]any{"spec": map[string]any{"containers": []any{container("ray-worker")}}}})
		}
		spec["workerGroupSpecs"] = groups
		spec["autoscalerOptions"] = map[string]any{"env": runtime.DeepCopyJSONValue(env)}
		rc, _, err := podtemplate.Desired(rc, cfg)
		if err != nil {
			b.Fatal(err)
		}
		target := secret(ns, name, map[string]string{"auth_token": token}, ownedBy(name))
		var pods []*corev1.Pod
		for _, p := range []string{"head", "w1", "w2"} {
			pod := rayPod(name+"-"+p, name, running, withPullSecret)
			pod.UID = types.UID("uid-" + pod.Name)
			if p == "head" {
				pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: podtemplate.AutoscalerContainer,
					Env: []corev1.EnvVar{{Name: podtemplate.EnvClientCertPath, Value: podtemplate.DefaultTLSMountPath + "/tls.crt"}}})
				pod.Spec.Volumes = []corev1.Volume{{Name: names.TLSVolumeName, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: tlsSrc.Name}}}}
			}
			pods = append(pods, pod)
		}
		var extra []runtime.Object
		if vary != nil {
			extra = vary(i, rc, target, pods)
		}
		clusters = append(clusters, rc)
		objs = append(objs, extra...)
		if target.Name != "" {
			objs = append(objs, target)
		}
		for _, p := range pods {
			if p.Name != "" {
				objs = append(objs, p)
			}
		}
	}
	return newHarnessWith(b, Config{Source: tokenSrc, Pods: pods}, clusters, objs...)
}

// BenchmarkScrape1000WithPodSources is one metrics scrape over the fleet above.
func BenchmarkScrape1000WithPodSources(b *testing.B) {
	h := scrapeFleet(b)
	snap := h.ctrl.Snapshot()
	inSync := 0
	for _, t := range snap.Targets {
		if t.State == "in_sync" {
			inSync++
		}
	}
	if inSync != 3000 {
		b.Fatalf("%d of 3,000 targets in sync: the fixture is wrong", inSync)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	for b.Loop() {
		h.ctrl.Snapshot()
	}
	// CPU time, unlike wall time, does not grow when other processes share the machine.
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N)/1e6, "cpu-ms/op")
}

// BenchmarkScrape1000ColdTemplates is the same scrape when every cluster changed since the last one
// (no template check can be reused): the first scrape, or one right after a fleet-wide change.
func BenchmarkScrape1000ColdTemplates(b *testing.B) {
	h := scrapeFleet(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		h.ctrl.reporter.drifts = nil
		h.ctrl.Snapshot()
	}
}

// processCPU is the CPU time this process has used (user and system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAdmitPod is one webhook decision for an autoscaling head with a pull secret and the
// autoscaler's client certificate configured: its CPU time and allocations per request.
func BenchmarkAdmitPod(b *testing.B) {
	crt, key := testCert(b)
	tlsSrc := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "client-tls"}
	tlsSecret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: tlsSrc.Name, Namespace: tlsSrc.Namespace}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	cfg := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}, AutoscalerTLS: &tlsSrc, MountPath: podtemplate.DefaultTLSMountPath}}
	h := newDryRunHarness(b, false, cfg, []*unstructured.Unstructured{rayCluster("c1", autoscaling)}, sourceSecret(token), pullSecretSource(), tlsSecret)
	a := h.ctrl.Admitter()
	b.ReportAllocs()
	for b.Loop() {
		if ops, result, _ := a.Pod(context.Background(), ns, admitPodRequest); result != names.AdmitMutated || len(ops) != 4 {
			b.Fatalf("%s %v", result, ops)
		}
	}
}

// admitPodRequest is an autoscaling head of c1 as KubeRay creates it.
var admitPodRequest = []byte(`{"metadata":{"generateName":"c1-head-","labels":{"ray.io/cluster":"c1"},"ownerReferences":[{"apiVersion":"ray.io/v1","kind":"RayCluster","name":"c1","uid":"uid-c1","controller":true}]},
	"spec":{"containers":[{"name":"ray-head","image":"rayproject/ray:2.52.0"},{"name":"autoscaler","image":"rayproject/ray:2.52.0"}]}}`)

// BenchmarkExposition1000 is the whole /metrics answer over scrapeFleet, as Prometheus reads it:
// the snapshot, the state collector's series, the Go and process collectors, the text encoding.
func BenchmarkExposition1000(b *testing.B) {
	h := scrapeFleet(b)
	handler := promhttp.HandlerFor(h.metrics.Registry, promhttp.HandlerOpts{})
	req := httptest.NewRequest("GET", "/metrics", nil)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := processCPU()
	for b.Loop() {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatal(w.Code)
		}
	}
	b.ReportMetric(float64(processCPU()-cpu)/float64(b.N)/1e6, "cpu-ms/op")
}
