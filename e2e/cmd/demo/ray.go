package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// waitReady waits until the RayService is Ready with cluster active (traffic on it).
func waitReady(ctx context.Context, cp *framework.ControlPlane, cluster string) {
	check(wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns).Get(ctx, svcName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		active, _, _ := unstructured.NestedString(s.Object, "status", "activeServiceStatus", "rayClusterName")
		pending, _, _ := unstructured.NestedString(s.Object, "status", "pendingServiceStatus", "rayClusterName")
		conds, _, _ := unstructured.NestedSlice(s.Object, "status", "conditions")
		for _, c := range conds {
			if m, _ := c.(map[string]any); m["type"] == "Ready" && m["status"] == "True" {
				return active == cluster && pending == "", nil
			}
		}
		return false, nil
	}))
}

func waitGone(ctx context.Context, cp *framework.ControlPlane, cluster string) {
	check(wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cp.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(ctx, cluster, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	}))
}

// serving sends a request to the Serve application through the RayService's serve Service.
func serving(ctx context.Context, cp *framework.ControlPlane) {
	url := fmt.Sprintf("http://%s-serve-svc.%s.svc.cluster.local:8000%s", svcName, ns, servePath())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := cp.Ray.Client().Do(req)
	check(err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("   GET %s -> %s: %s\n", url, resp.Status, strings.TrimSpace(string(body)))
}

// showProcessTokens prints, per pod and container, whether its Ray process started with the
// canonical token (compared by fingerprint; neither is printed).
func showProcessTokens(ctx context.Context, cp *framework.ControlPlane, cluster, token string) {
	pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster})
	check(err)
	fmt.Printf("   Ray processes (%s) and the token each started with:\n", map[bool]string{true: "real Ray " + framework.RayVersion, false: "emulated"}[realRay])
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		tokens, err := cp.Ray.ContainerTokens(ctx, ns, p.Name)
		if err != nil {
			continue
		}
		var parts []string
		for c, fp := range tokens {
			state := "canonical"
			switch {
			case fp == "":
				state = "no token"
			case fp != cp.Ray.Fingerprint(token):
				state = "OTHER"
			}
			parts = append(parts, c+"="+state)
		}
		fmt.Printf("     %-34s %s %s\n", p.Name, p.Status.PodIP, strings.Join(parts, " "))
	}
}

// submitJob submits a Ray job to the RayService's head Service with token, as an external client
// does, and follows it to the end if Ray accepted it.
func submitJob(ctx context.Context, cp *framework.ControlPlane, what, token string) {
	base := fmt.Sprintf("http://%s-head-svc.%s.svc.cluster.local:8265/api/jobs/", svcName, ns)
	call := func(method, url string, body []byte) (int, []byte) {
		req, _ := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := cp.Ray.Client().Do(req)
		check(err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	entrypoint := `python -c \"print(42)\"`
	if realRay && what == "canonical token" {
		entrypoint = `python -c \"import ray; ray.init(); print(ray.get(ray.remote(num_cpus=1)(lambda: 42).remote()))\"`
	}
	code, body := call(http.MethodPost, base, []byte(`{"entrypoint":"`+entrypoint+`"}`))
	if code != http.StatusOK {
		fmt.Printf("   job with the %s: refused, HTTP %d %s\n", what, code, http.StatusText(code))
		return
	}
	var sub struct {
		JobID string `json:"job_id"`
	}
	check(json.Unmarshal(body, &sub))
	var status string
	check(wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 4*time.Minute, true, func(context.Context) (bool, error) {
		code, body := call(http.MethodGet, base+sub.JobID, nil)
		var info struct{ Status string }
		if code != http.StatusOK || json.Unmarshal(body, &info) != nil {
			return false, nil
		}
		status = info.Status
		return status == "SUCCEEDED" || status == "FAILED" || status == "STOPPED", nil
	}))
	fmt.Printf("   job with the %s: accepted, %s %s\n", what, sub.JobID, status)
}

// showWorkers prints the worker pods Ray's autoscaler added.
func showWorkers(ctx context.Context, cp *framework.ControlPlane, cluster string) {
	l, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel + "=" + cluster + "," + kuberay.NodeTypeLabel + "=worker"})
	check(err)
	for _, p := range l.Items {
		fmt.Printf("   worker %s added by Ray's autoscaler (phase %s)\n", p.Name, p.Status.Phase)
	}
}
