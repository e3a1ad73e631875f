package realnode

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeDNS: CoreDNS runs as a pod on the node and a pod resolves a head Service by its
// cluster names (as KubeRay's workers and clients do) and the kubernetes Service, through the
// kube-dns Service the kubelet writes into the pod's resolv.conf.
func TestRealNodeDNS(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ns := "realnode-dns"
	if _, err := cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitServiceAccount(ctx, t, cp.Kube, ns)
	svc, err := cp.Kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "c-head-svc"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"ray.io/cluster": "c", "ray.io/node-type": "head"},
			Ports: []corev1.ServicePort{{Name: "dashboard", Port: 8265, TargetPort: intstr.FromInt32(8265)}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	names := []string{"c-head-svc", "c-head-svc." + ns, "c-head-svc." + ns + ".svc.cluster.local", "kubernetes.default"}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "resolve", Namespace: ns}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "resolve", Image: framework.TinyImage, ImagePullPolicy: corev1.PullNever, Args: append([]string{"resolve"}, names...)}}}}
	if _, err := cp.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cp.Kube.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	}); err != nil {
		t.Fatalf("resolver pod never finished (%s): %v\n%s", phase, err, events(ctx, cp.Kube, ns))
	}
	logs, err := cp.Kube.CoreV1().Pods(ns).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("resolver pod (%s):\n%s", phase, logs)
	for _, n := range names[:3] {
		if want := n + "=" + svc.Spec.ClusterIP; !strings.Contains(string(logs), want+"\n") {
			t.Errorf("want %q", want)
		}
	}
	if want := "kubernetes.default=" + framework.KubernetesServiceIP; !strings.Contains(string(logs), want+"\n") {
		t.Errorf("want %q", want)
	}

	// The host's programs reach the cluster by name through the harness's proxy (the KubeRay
	// operator's HTTP_PROXY): a Service selecting CoreDNS's pods, by its full name, answers CoreDNS's
	// readiness endpoint, plainly and through CONNECT; an address outside the harness's range is refused.
	if _, err := cp.Kube.CoreV1().Services("kube-system").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "dns-ready"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"k8s-app": "kube-dns"},
			Ports: []corev1.ServicePort{{Name: "ready", Port: 8181, TargetPort: intstr.FromInt32(8181)}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proxy, err := url.Parse(cp.ServiceProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	target := "http://dns-ready.kube-system.svc.cluster.local:8181/ready"
	for _, tr := range []*http.Transport{{Proxy: http.ProxyURL(proxy)}, {Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}} {
		var body string
		if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			body = get(ctx, &http.Client{Transport: tr, Timeout: 5 * time.Second}, target)
			return body == "200 OK", nil
		}); err != nil {
			t.Errorf("GET %s through the cluster proxy: %q", target, body)
		}
	}
	// CONNECT (what a gRPC client such as Ray Client sends through a proxy).
	conn, err := net.DialTimeout("tcp", proxy.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(conn, "CONNECT dns-ready.kube-system.svc.cluster.local:8181 HTTP/1.1\r\nHost: dns-ready.kube-system.svc.cluster.local:8181\r\n\r\n"+
		"GET /ready HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if b, _ := io.ReadAll(conn); !strings.HasPrefix(string(b), "HTTP/1.1 200 Connection established") || !strings.Contains(string(b), "\r\n\r\nOK") {
		t.Errorf("CONNECT through the cluster proxy: %q", b)
	}
	// The API server listens on loopback: dialed, it would answer a plain request (400, "an HTTPS server").
	api, err := url.Parse(cp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	if got := get(ctx, &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy)}, Timeout: 5 * time.Second}, "http://"+api.Host+"/"); !strings.HasPrefix(got, "502") {
		t.Errorf("the service proxy dialed the API server on loopback, outside the node's addresses: %q", got)
	}
}

// get returns "<status code> <body>" (or the error) for a GET of target.
func get(ctx context.Context, c *http.Client, target string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	resp, err := c.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
}
