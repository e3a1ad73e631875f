package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// runningNamespace holds the running clusters of the rotation baseline (the KubeRay operator
// watches it and raceNamespace only).
const runningNamespace = "running"

var rayServiceGVR = rcGVR.GroupVersion().WithResource("rayservices")

// runningRotationResult is a rotation with running clusters: what a canonical-token rotation does
// to RayServices and RayClusters that are already running (see RELIABILITY.md).
type runningRotationResult struct {
	KubeRay string `json:"kuberay"`
	// RayClusterPolicy is the standalone clusters' rotation policy ("" for a raysync without one).
	RayClusterPolicy string  `json:"raycluster_policy,omitempty"`
	RayServices      int     `json:"rayservices"`
	RayClusters      int     `json:"rayclusters"`
	ObservedSeconds  float64 `json:"observed_s"`
	// OperatorRejected counts the operator's dashboard requests the running clusters refused
	// (401/403) after the rotation; OperatorAccepted the ones they took.
	OperatorRejected int `json:"operator_requests_rejected"`
	OperatorAccepted int `json:"operator_requests_accepted"`
	// JoinFailures counts GCS connections refused for their token (the scaled-up and the restarted
	// worker, their wait-gcs-ready); Restarts the container restarts.
	JoinFailures int `json:"worker_join_failures"`
	Restarts     int `json:"container_restarts"`
	// StatusChanges counts changes of a RayService's status (Ready condition, service status,
	// active or pending cluster, serve endpoints).
	StatusChanges int `json:"rayservice_status_changes"`
	// External clients presenting the new token to the clusters' head Services.
	ExternalRequests int `json:"external_requests_new_token"`
	ExternalRejected int `json:"external_requests_new_token_rejected"`
	// NewWorkersNotReady: of the scaled-up and restarted workers, how many never became Ready.
	NewWorkersNotReady int `json:"new_workers_not_ready"`
}

// runningRotation measures a rotation with running clusters: services RayServices and clusters
// RayClusters (each with a worker) run on the canonical token; the token rotates; one RayCluster
// scales up and one worker restarts; then, for observe, external clients send requests with the new
// token while the stand-in counts what the Ray processes refused. policy is the standalone clusters'
// rotation policy (RayServices are replaced).
func (b *bench) runningRotation(services, clusters int, observe, probeEvery time.Duration, policy string) runningRotationResult {
	ctx := context.Background()
	b.setup(0)
	s := b.startSyncer("--namespaces="+b.ns, "--rotation-policy-raycluster="+policy)
	defer s.stop()
	for i := range services {
		_, err := b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).Create(ctx, rayService(b.ns, fmt.Sprintf("rs-%02d", i)), metav1.CreateOptions{})
		check(err)
	}
	for i := range clusters {
		_, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, rayClusterWithWorkers(b.ns, fmt.Sprintf("rc-%02d", i), 1), metav1.CreateOptions{})
		check(err)
	}
	heads := map[string]string{} // cluster → head Service clients use
	for i := range clusters {
		heads[fmt.Sprintf("rc-%02d", i)] = fmt.Sprintf("rc-%02d-head-svc", i)
	}
	check(wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		ready := 0
		for i := range services {
			svc, err := b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).Get(ctx, fmt.Sprintf("rs-%02d", i), metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if active := activeCluster(svc); active != "" && strings.HasPrefix(readyCondition(svc), "True/") {
				heads[active] = svc.GetName() + "-head-svc"
				ready++
			}
		}
		pods, err := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/is-ray-node=yes"})
		if err != nil || ready < services || len(pods.Items) < 2*(services+clusters) {
			return false, nil
		}
		for _, p := range pods.Items {
			if !podIsReady(p.Status.Conditions) {
				return false, nil
			}
		}
		return true, nil
	}))
	fmt.Fprintf(os.Stderr, "bench: running rotation: %d RayServices and %d RayClusters running\n", services, clusters)
	before := b.namespaceStats() // every cluster of the namespace, those that replace the running ones too

	changes := b.countRayServiceChanges(ctx)
	defer changes.stop()
	rotated := b.token + "-rotated"
	b.setSource(rotated)
	start := time.Now()
	// One RayCluster scales up, one worker restarts (its pod deleted; KubeRay creates another).
	_, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Patch(ctx, "rc-00", types.JSONPatchType,
		[]byte(`[{"op":"replace","path":"/spec/workerGroupSpecs/0/replicas","value":2}]`), metav1.PatchOptions{})
	check(err)
	restartCluster := "rc-00"
	if clusters > 1 {
		restartCluster = "rc-01"
	}
	workers, err := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + restartCluster + "," + kuberay.NodeTypeLabel + "=worker"})
	check(err)
	oldWorkers := map[string]bool{}
	for _, p := range workers.Items {
		oldWorkers[p.Name] = true
	}
	check(b.cp.Kube.CoreV1().Pods(b.ns).Delete(ctx, workers.Items[0].Name, metav1.DeleteOptions{}))

	var requests, rejected atomic.Int64
	probeCtx, stopProbes := context.WithTimeout(ctx, observe)
	defer stopProbes()
	client := b.cp.Ray.Client()
	var wg sync.WaitGroup
	for _, svc := range heads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				req, _ := http.NewRequestWithContext(probeCtx, http.MethodGet, fmt.Sprintf("http://%s.%s.svc.cluster.local:8265/api/jobs/", svc, b.ns), nil)
				req.Header.Set("Authorization", "Bearer "+rotated)
				if resp, err := client.Do(req); err == nil {
					resp.Body.Close()
					requests.Add(1)
					if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
						rejected.Add(1)
					}
				}
				select {
				case <-probeCtx.Done():
					return
				case <-time.After(probeEvery):
				}
			}
		}()
	}
	wg.Wait()
	after := b.namespaceStats()

	r := runningRotationResult{KubeRay: b.cp.KubeRayVersion, RayClusterPolicy: policy, RayServices: services, RayClusters: clusters, ObservedSeconds: time.Since(start).Seconds(),
		StatusChanges: changes.count(), ExternalRequests: int(requests.Load()), ExternalRejected: int(rejected.Load())}
	for c, a := range after {
		p := before[c] // zero for a cluster created during the observation
		r.OperatorRejected += a.Requests[standin.CallerOperator].Rejected() - p.Requests[standin.CallerOperator].Rejected()
		r.OperatorAccepted += a.Requests[standin.CallerOperator].Accepted - p.Requests[standin.CallerOperator].Accepted
		r.JoinFailures += a.JoinFailures - p.JoinFailures
		r.Restarts += a.Restarts - p.Restarts
	}
	for _, c := range []string{"rc-00", restartCluster} {
		pods, err := b.cp.Kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + c + "," + kuberay.NodeTypeLabel + "=worker"})
		check(err)
		for _, p := range pods.Items {
			if !oldWorkers[p.Name] && !podIsReady(p.Status.Conditions) && (c == restartCluster || p.CreationTimestamp.Time.After(start.Add(-time.Second))) {
				r.NewWorkersNotReady++
			}
		}
	}
	fmt.Fprintf(os.Stderr, "bench: running rotation: %+v\n", r)
	check(b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	check(b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	return r
}

// statusWatch counts RayService status changes that matter to a user.
type statusWatch struct {
	w     watch.Interface
	mu    sync.Mutex
	n     int
	seen  map[string]string
	done  chan struct{}
	start time.Time
}

func (b *bench) countRayServiceChanges(ctx context.Context) *statusWatch {
	l, err := b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).List(ctx, metav1.ListOptions{})
	check(err)
	sw := &statusWatch{seen: map[string]string{}, done: make(chan struct{})}
	for i := range l.Items {
		sw.seen[l.Items[i].GetName()] = statusSummary(&l.Items[i])
	}
	sw.w, err = b.cp.Dynamic.Resource(rayServiceGVR).Namespace(b.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: l.GetResourceVersion()})
	check(err)
	go func() {
		defer close(sw.done)
		for ev := range sw.w.ResultChan() {
			u, ok := ev.Object.(*unstructured.Unstructured)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			sum := statusSummary(u)
			sw.mu.Lock()
			if sw.seen[u.GetName()] != sum {
				fmt.Fprintf(os.Stderr, "bench: running rotation: RayService %s: %s -> %s\n", u.GetName(), sw.seen[u.GetName()], sum)
				sw.n++
				sw.seen[u.GetName()] = sum
			}
			sw.mu.Unlock()
		}
	}()
	return sw
}

func (sw *statusWatch) count() int {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.n
}

func (sw *statusWatch) stop() { sw.w.Stop(); <-sw.done }

func statusSummary(u *unstructured.Unstructured) string {
	status, _, _ := unstructured.NestedString(u.Object, "status", "serviceStatus")
	pending, _, _ := unstructured.NestedString(u.Object, "status", "pendingServiceStatus", "rayClusterName")
	endpoints, _, _ := unstructured.NestedInt64(u.Object, "status", "numServeEndpoints")
	var appStatus []string
	apps, _, _ := unstructured.NestedMap(u.Object, "status", "activeServiceStatus", "applicationStatuses")
	for name, a := range apps {
		st, _, _ := unstructured.NestedString(a.(map[string]any), "status")
		appStatus = append(appStatus, name+"="+st)
	}
	return fmt.Sprintf("ready=%s status=%s active=%s pending=%s endpoints=%d apps=%v", readyCondition(u), status, activeCluster(u), pending, endpoints, appStatus)
}

func activeCluster(u *unstructured.Unstructured) string {
	s, _, _ := unstructured.NestedString(u.Object, "status", "activeServiceStatus", "rayClusterName")
	return s
}

func readyCondition(u *unstructured.Unstructured) string {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == "Ready" {
			return fmt.Sprintf("%v/%v", m["status"], m["reason"])
		}
	}
	return ""
}

// rayService is a token-auth RayService with one Serve application and one worker.
func rayService(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"serveConfigV2":    "applications:\n  - name: app\n    route_prefix: /\n    import_path: app.main\n",
			"rayClusterConfig": rayClusterWithWorkers(ns, name, 1).Object["spec"],
		}}}
}

func podIsReady(conds []corev1.PodCondition) bool {
	for _, c := range conds {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
