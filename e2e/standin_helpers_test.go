package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// StandIn is the kubelet and Ray stand-in of the local control plane; tests that need it skip on
// an external cluster (which has real kubelets and real Ray, and no stand-in to ask).
func (e *Env) StandIn() *framework.RayStandIn {
	e.t.Helper()
	if e.ControlPlane.Ray == nil {
		e.t.Skip("needs the kubelet and Ray stand-in of the local control plane")
	}
	e.t.Cleanup(func() {
		// The stand-in sees every token the test's pods start with: none may reach its log.
		log, err := os.ReadFile(e.LogPath("standin"))
		if err != nil {
			e.t.Errorf("stand-in log: %v", err)
			return
		}
		for _, v := range e.secrets {
			for _, form := range []string{v, base64.StdEncoding.EncodeToString([]byte(v))} {
				if len(form) >= 8 && strings.Contains(string(log), form) {
					e.t.Errorf("the stand-in's log contains a secret value (or its base64 form)")
				}
			}
		}
	})
	return e.ControlPlane.Ray
}

// WaitPodsReady waits until at least n pods match selector, none is being deleted, and every
// one is Ready (its containers started and, for Ray, joined).
func (e *Env) WaitPodsReady(ns, selector string, n int, timeout time.Duration) []corev1.Pod {
	e.t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, nil
		}
		pods = l.Items
		if len(pods) < n {
			return false, nil
		}
		for _, p := range pods {
			if p.DeletionTimestamp != nil || !podReady(&p) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		e.t.Fatalf("pods %s in %s: want %d Ready, have %s after %s; Events:\n%s", selector, ns, n, describePods(pods), timeout,
			e.eventsAbout(ns, selector[strings.LastIndex(selector, "=")+1:]))
	}
	return pods
}

// eventsAbout lists, for a failure message, the Events in ns about objects whose name starts with prefix
// (a cluster's name: its pods, its Secret, itself), whoever wrote them (KubeRay, raysync, the kubelet).
func (e *Env) eventsAbout(ns, prefix string) string {
	l, err := e.Kube.CoreV1().Events(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, ev := range l.Items {
		if strings.HasPrefix(ev.InvolvedObject.Name, prefix) {
			fmt.Fprintf(&b, "  %s %s %s/%s %s: %s (x%d)\n", ev.LastTimestamp.Format(time.TimeOnly), ev.Source.Component,
				ev.InvolvedObject.Kind, ev.InvolvedObject.Name, ev.Reason, ev.Message, ev.Count)
		}
	}
	return b.String()
}

// WaitPod waits until the named pod satisfies cond and returns it.
func (e *Env) WaitPod(ns, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	e.t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := e.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return cond(p), nil
	})
	if err != nil {
		e.t.Fatalf("pod %s/%s never %s (last: %s)", ns, name, what, describePods([]corev1.Pod{derefPod(pod)}))
	}
	return pod
}

func derefPod(p *corev1.Pod) corev1.Pod {
	if p == nil {
		return corev1.Pod{}
	}
	return *p
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// containerWaiting is the waiting reason of a pod's container ("" if not waiting).
func containerWaiting(p *corev1.Pod, container string) string {
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if s.Name == container && s.State.Waiting != nil {
			return s.State.Waiting.Reason
		}
	}
	return ""
}

// pullFailing reports whether the kubelet cannot pull the image of the first container it tries
// (a worker's wait-gcs-ready, else the Ray container).
func pullFailing(p *corev1.Pod) bool { return anyWaiting(p, "ErrImagePull", "ImagePullBackOff") }

// anyWaiting reports whether a container of the pod (init or not) waits for one of reasons.
func anyWaiting(p *corev1.Pod, reasons ...string) bool {
	for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if s.State.Waiting != nil && slices.Contains(reasons, s.State.Waiting.Reason) {
			return true
		}
	}
	return false
}

// waitForNextSecond waits until the wall clock is in a later second than every container of pods
// started in. Pod start times have one-second resolution, and raysync counts a container that
// started in the same second as a token write as fresh.
func (e *Env) waitForNextSecond(pods []corev1.Pod) {
	e.t.Helper()
	var latest time.Time
	for _, p := range pods {
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running != nil && s.State.Running.StartedAt.After(latest) {
				latest = s.State.Running.StartedAt.Time
			}
		}
	}
	next := latest.Truncate(time.Second).Add(time.Second)
	if err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return time.Now().After(next), nil
	}); err != nil {
		e.t.Fatal(err)
	}
}

func restartCount(p *corev1.Pod, container string) int32 {
	for _, s := range p.Status.ContainerStatuses {
		if s.Name == container {
			return s.RestartCount
		}
	}
	return -1
}

// describePods is a one-line summary of pods for failure messages (phases, waiting reasons).
func describePods(pods []corev1.Pod) string {
	var parts []string
	for _, p := range pods {
		var states []string
		for _, s := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
			switch {
			case s.State.Waiting != nil:
				states = append(states, s.Name+"="+s.State.Waiting.Reason)
			case s.State.Running != nil:
				states = append(states, fmt.Sprintf("%s=Running(ready=%v)", s.Name, s.Ready))
			case s.State.Terminated != nil:
				states = append(states, s.Name+"=Terminated:"+s.State.Terminated.Reason)
			}
		}
		parts = append(parts, fmt.Sprintf("%s %s node=%q [%s]", p.Name, p.Status.Phase, p.Spec.NodeName, strings.Join(states, " ")))
	}
	return fmt.Sprintf("%d pods: %s", len(pods), strings.Join(parts, "; "))
}

// tokenStarts counts, per cluster, the container starts that had a RAY_AUTH_TOKEN, and how many
// of them started with token. Fingerprints never leave this function.
func (e *Env) tokenStarts(ns, token string, include func(standin.ContainerStart) bool) map[string][2]int {
	e.t.Helper()
	ray := e.StandIn()
	starts, err := ray.Starts(e.ctx, ns)
	if err != nil {
		e.t.Fatal(err)
	}
	want := ray.Fingerprint(token)
	out := map[string][2]int{}
	for _, s := range starts {
		if s.TokenFingerprint == "" || (include != nil && !include(s)) {
			continue
		}
		key := s.Cluster
		if key == "" {
			key = s.NodeType + " " + s.Pod
		}
		c := out[key]
		c[0]++
		if s.TokenFingerprint == want {
			c[1]++
		}
		out[key] = c
	}
	return out
}

// AssertStartedWith fails unless each cluster had container starts and every one of them (head,
// workers, wait-gcs-ready, autoscaler) started with token.
func (e *Env) AssertStartedWith(ns, token string, clusters ...string) {
	e.t.Helper()
	counts := e.tokenStarts(ns, token, nil)
	for _, c := range clusters {
		n := counts[c]
		switch {
		case n[0] == 0:
			e.t.Errorf("cluster %s/%s: no container started with a token", ns, c)
		case n[1] != n[0]:
			e.t.Errorf("cluster %s/%s: %d of %d container starts used a token other than the expected one", ns, c, n[0]-n[1], n[0])
		}
	}
}

// rayGet sends GET url through the stand-in's client proxy (as a client outside the cluster)
// with the given headers, and returns the HTTP status.
func (e *Env) rayGet(url string, headers map[string]string) int {
	e.t.Helper()
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, url, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := e.StandIn().Client().Do(req)
	if err != nil {
		e.t.Fatalf("GET %s: %v", url, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// headURL is a RayCluster's dashboard through its head Service, as clients in the cluster use it.
func headURL(ns, headService string) string {
	return fmt.Sprintf("http://%s.%s.svc.cluster.local:8265", headService, ns)
}

// secretToken reads a token Secret's value.
func (e *Env) secretToken(ns, name string) string {
	e.t.Helper()
	return string(e.WaitSecret(ns, name, 30*time.Second, nil).Data[kuberay.AuthTokenKey])
}

// WaitRayServiceReady waits until the RayService's Ready condition is True with cluster active,
// and returns the RayService.
func (e *Env) WaitRayServiceReady(ns, name string, timeout time.Duration, active func(string) bool) *unstructured.Unstructured {
	e.t.Helper()
	var svc *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := e.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		svc = s
		cur, _, _ := unstructured.NestedString(s.Object, "status", "activeServiceStatus", "rayClusterName")
		pending, _, _ := unstructured.NestedString(s.Object, "status", "pendingServiceStatus", "rayClusterName")
		return conditionTrue(s, "Ready") && cur != "" && pending == "" && (active == nil || active(cur)), nil
	})
	if err != nil {
		e.t.Fatalf("RayService %s/%s never Ready (status: %v)", ns, name, statusSummary(svc))
	}
	return svc
}

func conditionTrue(u *unstructured.Unstructured, typ string) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return m["status"] == "True"
		}
	}
	return false
}

func statusSummary(u *unstructured.Unstructured) string {
	if u == nil {
		return "<none>"
	}
	st, _, _ := unstructured.NestedMap(u.Object, "status")
	delete(st, "activeServiceStatus")
	delete(st, "pendingServiceStatus")
	var keys []string
	for k := range st {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%v ", k, st[k])
	}
	active, _, _ := unstructured.NestedString(u.Object, "status", "activeServiceStatus", "rayClusterName")
	pending, _, _ := unstructured.NestedString(u.Object, "status", "pendingServiceStatus", "rayClusterName")
	return fmt.Sprintf("active=%q pending=%q %s", active, pending, b.String())
}

// assertLoopbackOnly fails if a control-plane process holds a TCP connection to anything but
// loopback (a sample of this moment; on an external cluster there is nothing to sample).
func (e *Env) assertLoopbackOnly(process string) {
	e.t.Helper()
	if e.External {
		return
	}
	addrs, err := e.RemoteAddrs(process)
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range addrs {
		if !a.Addr().IsLoopback() {
			e.t.Errorf("%s has a connection to %s, outside loopback", process, a)
		}
	}
}
