package standin

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// headWithServices runs a head for cluster c behind c-head-svc (dashboard, named targetPort) and
// c-serve-svc (serve), as KubeRay creates them.
func headWithServices(t *testing.T) (*testKubelet, string) {
	tk := startTestKubelet(t, tokenSecret("c", "s3cret-value"))
	head := rayPod("c-head", "head", "c", "c")
	head.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "dashboard", ContainerPort: 8265}, {Name: "serve", ContainerPort: 8000}}
	sel := map[string]string{labelCluster: "c", labelNodeType: "head"}
	tk.create(head,
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "c-head-svc", Namespace: testNS}, Spec: corev1.ServiceSpec{Selector: sel,
			Ports: []corev1.ServicePort{{Name: "dashboard", Port: 8265, TargetPort: intstr.FromString("dashboard")}}}},
		&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "c-serve-svc", Namespace: testNS}, Spec: corev1.ServiceSpec{Selector: sel,
			Ports: []corev1.ServicePort{{Name: "serve", Port: 8000}}}})
	tk.waitContainer("c-head", "ray-head", "head running", isRunning)
	// Running is not routable: the router's own Service and pod caches must hold them and the head
	// be ready (a loaded machine, make test, showed the gap: 502 "no ready endpoint").
	eventually(t, 5*time.Second, "the head behind c-head-svc", func() bool {
		_, err := tk.router.services.Services(testNS).Get("c-serve-svc")
		if err != nil {
			return false
		}
		_, err = tk.router.resolve("c-head-svc.ns.svc.cluster.local:8265", "", nil)
		return err == nil
	})
	return tk, tk.pod(testNS, "c-head").report().IP
}

// do sends a request through caller's proxy and returns the status and body.
func do(tk *testKubelet, caller Caller, method, url string, headers map[string]string, body string) (int, string) {
	req := httptest.NewRequest(method, url, strings.NewReader(body))
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	tk.Proxy(caller).ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Body)
	return rec.Code, string(b)
}

func TestProxyRoutesByHost(t *testing.T) {
	tk, ip := headWithServices(t)
	ok := map[string]string{"X-Ray-Authorization": "Bearer s3cret-value"}
	tests := map[string]struct {
		url  string
		want int
	}{
		"Service FQDN":                 {"http://c-head-svc.ns.svc.cluster.local:8265/api/jobs/", http.StatusOK},
		"Service.namespace.svc":        {"http://c-head-svc.ns.svc:8265/api/jobs/", http.StatusOK},
		"Service.namespace":            {"http://c-head-svc.ns:8265/api/jobs/", http.StatusOK},
		"pod IP":                       {"http://" + ip + ":8265/api/jobs/", http.StatusOK},
		"bare Service name (no ns)":    {"http://c-head-svc:8265/api/jobs/", http.StatusBadGateway},
		"unknown Service":              {"http://nope.ns.svc.cluster.local:8265/", http.StatusBadGateway},
		"a real address":               {"http://198.18.1.2:8265/", http.StatusBadGateway},
		"a port the Service lacks":     {"http://c-head-svc.ns.svc.cluster.local:6379/", http.StatusBadGateway},
		"Serve before any application": {"http://" + ip + ":8000/-/healthz", http.StatusBadGateway},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got, body := do(tk, CallerOperator, http.MethodGet, tc.url, ok, ""); got != tc.want {
				t.Errorf("GET %s: HTTP %d (%s), want %d", tc.url, got, strings.TrimSpace(body), tc.want)
			}
		})
	}
	p := tk.stats.proxySnapshot()[CallerOperator]
	if p.ToService != 3 || p.ToPodIP != 1 || p.UnknownHost != 3 || p.Refused != 2 {
		t.Errorf("proxy counts: %+v", p)
	}
	if got, body := do(tk, CallerClient, http.MethodConnect, "c-head-svc.ns:8265", nil, ""); got != http.StatusBadGateway || !strings.Contains(body, "tunnels reach real pods") {
		t.Errorf("CONNECT to an emulated pod: HTTP %d (%s)", got, body)
	}
	req := httptest.NewRequest(http.MethodGet, "/api/jobs/", nil)
	rec := httptest.NewRecorder()
	tk.Proxy(CallerClient).ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("a non-proxy request: HTTP %d", rec.Code)
	}
}

func TestDashboardAuthAndServe(t *testing.T) {
	tk, ip := headWithServices(t)
	dash := "http://c-head-svc.ns.svc.cluster.local:8265"
	for name, tc := range map[string]struct {
		headers map[string]string
		want    int
	}{
		"no token":                        {nil, http.StatusUnauthorized},
		"wrong token":                     {map[string]string{"Authorization": "Bearer nope"}, http.StatusForbidden},
		"Authorization":                   {map[string]string{"Authorization": "Bearer s3cret-value"}, http.StatusOK},
		"X-Ray-Authorization":             {map[string]string{"X-Ray-Authorization": "Bearer s3cret-value"}, http.StatusOK},
		"cookie":                          {map[string]string{"Cookie": "ray-authentication-token=s3cret-value"}, http.StatusOK},
		"wrong Authorization beats X-Ray": {map[string]string{"Authorization": "Bearer nope", "X-Ray-Authorization": "Bearer s3cret-value"}, http.StatusForbidden},
		"X-Ray beats the cookie":          {map[string]string{"X-Ray-Authorization": "Bearer nope", "Cookie": "ray-authentication-token=s3cret-value"}, http.StatusForbidden},
		"health needs no token":           {nil, http.StatusOK},
	} {
		t.Run(name, func(t *testing.T) {
			path := "/api/serve/applications/?api_type=declarative"
			if name == "health needs no token" {
				path = "/api/gcs_healthz"
			}
			if got, body := do(tk, CallerClient, http.MethodGet, dash+path, tc.headers, ""); got != tc.want {
				t.Errorf("HTTP %d (%s), want %d", got, strings.TrimSpace(body), tc.want)
			} else if got != http.StatusOK && strings.Contains(body, "s3cret") {
				t.Error("a refusal echoes the token")
			}
		})
	}

	ok := map[string]string{"X-Ray-Authorization": "Bearer s3cret-value"}
	cfg := `{"applications":[{"name":"app","route_prefix":"/","import_path":"m:app"}]}`
	if got, _ := do(tk, CallerOperator, http.MethodPut, dash+"/api/serve/applications/", ok, cfg); got != http.StatusOK {
		t.Fatalf("deploy: HTTP %d", got)
	}
	if got, _ := do(tk, CallerOperator, http.MethodGet, "http://"+ip+":8000/-/healthz", nil, ""); got != http.StatusOK {
		t.Errorf("Serve proxy health after a deploy: HTTP %d", got)
	}
	eventually(t, 5*time.Second, "application RUNNING", func() bool {
		_, body := do(tk, CallerOperator, http.MethodGet, dash+"/api/serve/applications/?api_type=declarative", ok, "")
		return strings.Contains(body, `"status":"RUNNING"`)
	})
	if got, body := do(tk, CallerClient, http.MethodGet, "http://c-serve-svc.ns.svc.cluster.local:8000/predict", nil, ""); got != http.StatusOK || !strings.Contains(body, "app") {
		t.Errorf("request to the application: HTTP %d %q", got, body)
	}
	st := tk.stats.clusterSnapshot(clusterKey{testNS, "c"})
	if c := st.Requests[CallerClient]; c.Unauthenticated != 1 || c.Forbidden != 3 || c.Accepted != 3 {
		t.Errorf("client verdicts: %+v", c)
	}
}
