package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// gatewayProc is one `syncer gateway` replica on loopback.
type gatewayProc struct {
	*Syncer
	DashboardAddr, ClientAddr string
}

// StartGateway runs a gateway replica reading table; it reaches the heads through the stand-in's
// proxy, as the operator does.
func (e *Env) StartGateway(table types.NamespacedName, args ...string) *gatewayProc {
	e.t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		e.t.Fatal(err)
	}
	client, err := framework.FreePort()
	if err != nil {
		e.t.Fatal(err)
	}
	proxy := e.StandIn().ClientProxyURL
	g := &gatewayProc{DashboardAddr: fmt.Sprintf("127.0.0.1:%d", port), ClientAddr: fmt.Sprintf("127.0.0.1:%d", client)}
	g.Syncer = e.startBinary(e.Kubeconfig, "/readyz", []string{"HTTP_PROXY=" + proxy, "http_proxy=" + proxy, "HTTPS_PROXY=", "https_proxy=", "NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"},
		[]string{"gateway"}, append([]string{"--table-secret=" + table.String(), "--dashboard-addr=" + g.DashboardAddr,
			"--client-addr=" + g.ClientAddr, "--drain-delay=0s"}, args...)...)
	return g
}

// callOutcome is what a client saw for one call.
type callOutcome int

const (
	callOK          callOutcome = iota
	callAuthRefused             // 401 or 403: the client's token refused
	callUnavailable             // the cluster (restarting) or a gateway replica (killed) did not answer
)

// waveClients call every object of the fleet, each round, through the gateway (or, for the baseline,
// straight at the heads), as three kinds of client: one that reads the canonical Secret before every
// round, one that keeps the token it started with, and one given the pending token before the rotation.
type waveClients struct {
	env     *Env
	ns      string
	objects func() map[string]string // address name -> head Service (for direct calls)
	via     []string                 // gateway replicas' dashboard addresses; empty: call heads directly
	tokens  map[string]func() string
	down    atomic.Int32 // index of a replica known dead, -1 none

	mu     sync.Mutex
	counts map[string]map[callOutcome]int // client kind -> outcome -> calls
	first  map[string]string              // client kind -> first auth refusal, for the failure message
	stop   chan struct{}
	done   sync.WaitGroup
}

func (w *waveClients) start() {
	w.counts, w.first, w.stop = map[string]map[callOutcome]int{}, map[string]string{}, make(chan struct{})
	w.down.Store(-1)
	proxy := w.env.StandIn().Client()
	direct := &http.Client{Timeout: 5 * time.Second, Transport: proxy.Transport}
	gw := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	for kind, token := range w.tokens {
		w.counts[kind] = map[callOutcome]int{}
		w.done.Add(1)
		go func() {
			defer w.done.Done()
			for round := 0; ; round++ {
				select {
				case <-w.stop:
					return
				case <-time.After(200 * time.Millisecond):
				}
				tok := token()
				for name, head := range w.objects() {
					var req *http.Request
					client := direct
					if len(w.via) == 0 {
						req, _ = http.NewRequest("GET", headURL(w.ns, head)+"/api/jobs/", nil)
					} else {
						i := round % len(w.via)
						if int(w.down.Load()) == i {
							i = (i + 1) % len(w.via)
						}
						client = gw
						req, _ = http.NewRequest("GET", "http://"+w.via[i]+"/api/jobs/", nil)
						req.Host = name + "-gw." + w.ns + ".svc.cluster.local:8265"
					}
					req.Header.Set("Authorization", "Bearer "+tok)
					w.record(kind, name, do(client, req))
				}
			}
		}()
	}
}

func do(c *http.Client, req *http.Request) callOutcome {
	resp, err := c.Do(req)
	if err != nil {
		return callUnavailable
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return callOK
	case http.StatusUnauthorized, http.StatusForbidden:
		return callAuthRefused
	}
	return callUnavailable
}

func (w *waveClients) record(kind, object string, o callOutcome) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.counts[kind][o]++
	if o == callAuthRefused && w.first[kind] == "" {
		w.first[kind] = object
	}
}

func (w *waveClients) finish() map[string]map[callOutcome]int {
	close(w.stop)
	w.done.Wait()
	return w.counts
}

// TestGatewayWaveRefusesNoToken: a fleet (RayServices replace, standalone clusters hold and restart, a
// RayJob running) rotates while clients call every object through two gateway replicas, one of which
// is killed mid-wave. Clients that re-read the canonical Secret, that keep the old token, and that
// were given the pending token before the rotation: none is refused, through the wave and after it.
// The same fleet without the gateway is the baseline (kuberay v1.6.1 only): clients are refused. Named for
// what it enforces: no call refused for its token, by the gateway or by a cluster behind it (the gateway's
// upstream auth failures, HTTP and gRPC); calls that meet the killed replica or a restarting cluster are
// counted, and must stay under a tenth of the calls served (measured: 11 of ~410 per client).
func TestGatewayWaveRefusesNoToken(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if testing.Short() {
			t.Skip("long")
		}
		runGatewayWave(t, env, true)
		if env.KubeRayVersion == "v1.6.1" {
			t.Run("baseline without the gateway", func(t *testing.T) { runGatewayWave(t, newEnv(t, env.ControlPlane), false) })
		}
	})
}

func runGatewayWave(t *testing.T, env *Env, through bool) {
	env.StandIn()
	ns := env.Namespace()
	t1, t2, t3 := env.NewToken(), env.NewToken(), env.NewToken()
	env.PutSource(ns, "ray-token", map[string][]byte{"auth_token": []byte(t1), "pending": []byte(t2)})
	table := types.NamespacedName{Namespace: ns, Name: "raysync-gateway"}
	args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, "--max-concurrent-rotations=5", "--rotation-timeout=5m",
		"--rotation-policy-rayservice=replace", "--rotation-policy-raycluster=hold", "--rotation-policy-rayjob=hold"}
	if through {
		args = append(args, "--gateway-table="+table.String(), "--gateway-service=raysync-gateway.raysync.svc.cluster.local",
			"--gateway-grace=1h", "--gateway-pending-key=pending")
	}
	s := env.StartSyncer(args...)

	const services = 3
	for i := range services {
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, fmt.Sprintf("svc-%d", i), "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"held-0", "held-1"} {
		env.CreateRayCluster(rayCluster(ns, name))
	}
	env.CreateRayCluster(rayCluster(ns, "restart-0", withAnnotations(map[string]string{"raysync.dev/rotation": "restart"})))
	job := rayJob(ns, "job", "HTTPMode")
	_ = unstructured.SetNestedField(job.Object, "sleep 60", "spec", "entrypoint")
	if _, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Create(env.ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range services {
		env.WaitRayServiceReady(ns, fmt.Sprintf("svc-%d", i), 3*time.Minute, nil)
	}
	for _, name := range []string{"held-0", "held-1", "restart-0"} {
		env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+name, 1, 2*time.Minute)
	}
	f := &fleet{env: env, ns: ns, t1: t1}
	jobCluster := f.waitJobRunning("job")

	// What clients address: RayServices by name (the gateway follows the active cluster; directly,
	// the RayService's own head Service does), standalone clusters and the job's cluster by name.
	objects := func() map[string]string {
		out := map[string]string{"held-0": "held-0-head-svc", "held-1": "held-1-head-svc", "restart-0": "restart-0-head-svc", jobCluster: jobCluster + "-head-svc"}
		for i := range services {
			out[fmt.Sprintf("svc-%d", i)] = fmt.Sprintf("svc-%d-head-svc", i)
		}
		return out
	}
	var gws []*gatewayProc
	w := &waveClients{env: env, ns: ns, objects: objects, tokens: map[string]func() string{
		"rereads": func() string { return env.secretToken(ns, "ray-token") },
		"keeps":   func() string { return t1 },
		"pending": func() string { return t2 },
	}}
	if through {
		gws = []*gatewayProc{env.StartGateway(table), env.StartGateway(table)}
		for _, g := range gws {
			w.via = append(w.via, g.DashboardAddr)
		}
		// The addresses raysync keeps, and a table that routes every object.
		for name := range objects() {
			if _, err := env.Kube.CoreV1().Services(ns).Get(env.ctx, name+"-gw", metav1.GetOptions{}); err != nil {
				t.Errorf("no gateway address for %s: %v", name, err)
			}
		}
		waitRoutes(t, gws[0], len(objects()))
	}
	w.start()
	time.Sleep(3 * time.Second) // calls before the rotation: (c) already holds the pending token

	start := time.Now()
	env.PutSource(ns, "ray-token", map[string][]byte{"auth_token": []byte(t2), "pending": []byte(t3)})
	if through {
		f.waitRotationsStarted(s, 1)
		w.down.Store(1)
		gws[1].Kill() // kill -9 of one replica mid-wave
	}
	for i := range services {
		f.waitServingOn(fmt.Sprintf("svc-%d", i), t2, 6*time.Minute)
	}
	env.WaitEvent(ns, "restart-0", "RotationCompleted", 3*time.Minute)
	wave := time.Since(start)
	time.Sleep(5 * time.Second) // and after the wave
	counts := w.finish()

	refused := 0
	for kind, c := range counts {
		refused += c[callAuthRefused]
		t.Logf("MEASURE gateway-wave kuberay=%s through_gateway=%v client=%s ok=%d auth_refused=%d unavailable=%d wave_s=%.1f",
			env.KubeRayVersion, through, kind, c[callOK], c[callAuthRefused], c[callUnavailable], wave.Seconds())
		if c[callOK] == 0 {
			t.Errorf("client %s: no call succeeded", kind)
		}
		if through && c[callUnavailable]*10 > c[callOK] {
			t.Errorf("client %s through the gateway: %d calls unavailable against %d served: more than a tenth", kind, c[callUnavailable], c[callOK])
		}
		if through && c[callAuthRefused] > 0 {
			t.Errorf("client %s through the gateway: %d calls refused for their token (first: %s)", kind, c[callAuthRefused], w.first[kind])
		}
	}
	if !through && refused == 0 {
		t.Error("without the gateway no client was refused: the baseline shows nothing")
	}
	if through {
		for _, proto := range []string{"http", "grpc"} {
			if v, _ := gws[0].Metric("raysync_gateway_upstream_auth_failures_total", map[string]string{"protocol": proto}); v != 0 {
				t.Errorf("%v %s requests a cluster refused although the gateway forwarded them with its token (the gateway answers 502 / UNAVAILABLE)", v, proto)
			}
		}
		if v, _ := gws[0].Metric("raysync_gateway_requests_total", map[string]string{"protocol": "http", "result": "forwarded", "credential": "previous"}); v == 0 {
			t.Error("no request with the previous token was forwarded after the rotation")
		}
	}
	f.waitJobDone("job")
	env.AssertStartedWith(ns, t1, jobCluster)
}

// waitRoutes waits until the replica's table routes n objects.
func waitRoutes(t *testing.T, g *gatewayProc, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		v, _ := g.Metric("raysync_gateway_routes", nil)
		return int(v) >= n, nil
	})
	if err != nil {
		v, _ := g.Metric("raysync_gateway_routes", nil)
		t.Fatalf("the gateway routes %v objects, want at least %d", v, n)
	}
}

// TestGatewayServesNothingWithoutATable: before raysync has published a table a gateway replica is not
// ready: it never forwards without knowing the cluster's token.
func TestGatewayServesNothingWithoutATable(t *testing.T) {
	if len(controlPlanes) == 0 || controlPlanes[0].External {
		t.Skip("needs the harness's control plane")
	}
	env := newEnv(t, controlPlanes[0])
	ns := env.Namespace()
	g := env.startBinary(env.Kubeconfig, "/healthz", nil, []string{"gateway"}, "--table-secret="+ns+"/raysync-gateway",
		"--dashboard-addr=127.0.0.1:0", "--client-addr=127.0.0.1:0")
	time.Sleep(2 * time.Second) // its informer has listed the (absent) Secret by now
	resp, err := http.Get(g.ProbeURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz without a table: %d, want 503", resp.StatusCode)
	}
	if v, _ := g.Metric("raysync_gateway_table_valid", nil); v != 0 {
		t.Errorf("raysync_gateway_table_valid %v without a table", v)
	}
}
