package realnode

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeSeed000CanonicalTokenThroughUpgradeAndRotation is seed 000 on the real node: one
// canonical token through every blue-green upgrade and a rotation. raysync, installed from the
// registry, projects the canonical Secret into each RayService cluster's auth Secret; the RayService
// serves a real Serve application and takes jobs. `ray job submit` from outside the node (Ray's own
// CLI through `kubectl port-forward`, as a CI pipeline would) with the canonical Secret's value
// works on the first cluster, after a blue-green upgrade and after a rotation, which raysync carries
// out by having KubeRay replace the cluster. Every Ray container's environment, as the real kubelet
// resolved it (read from inside the container), holds the canonical token of its time. A client
// calling Serve every 250 ms throughout sees no error from the rotation on; one calling the Jobs API
// with the canonical token is refused only from the rotation until the new cluster serves (the README's
// window), and fails for no other reason from the rotation on. In KubeRay's own upgrade, before it, a
// failure of either is reported when the kubelet's probe failures explain it, and fails the test
// otherwise. Both open a connection per call; a keep-alive Serve client is measured beside them (its
// connection stays on the old cluster's head until KubeRay deletes it). Both KubeRay versions: how a
// RayService moves to a new cluster is the operator's code, and it changed between them.
func TestRealNodeSeed000CanonicalTokenThroughUpgradeAndRotation(t *testing.T) {
	for _, v := range []string{"v1.5.1", "v1.6.1"} {
		t.Run("kuberay-"+v, func(t *testing.T) { seed000(t, v) })
	}
}

func seed000(t *testing.T, kuberay string) {
	cp := startNodeWith(t, kuberay)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	image, err := cp.PushRayImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	venv, err := framework.EnsureRay(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	const platform, ns, name = "raysync", "seed000", "svc"
	createNamespaces(ctx, t, cp, platform, ns)
	token := func(r int) string { return fmt.Sprintf("seed000-canonical-%d-%d", r, time.Now().UnixNano()) }
	t1 := token(1)
	if _, err := cp.Kube.CoreV1().Secrets(platform).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		StringData: map[string]string{"auth_token": t1}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installRaysync(ctx, t, cp, platform, "0.2.0-seed000", "namespaces[0]="+ns, "replicas=1")
	if _, err := cp.Kube.CoreV1().ConfigMaps(ns).Create(ctx, serveAppConfigMap(t, ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	services := cp.Dynamic.Resource(rayServiceGVR).Namespace(ns)
	t0 := time.Now()
	rs := rayService(ns, name, image, "blue")
	// KubeRay deletes the old cluster this long after the switch (its default is 60 s): long enough
	// for the serve Service's endpoints and kube-proxy to leave the old head before its pods go.
	rs.Object["spec"].(map[string]any)["rayClusterDeletionDelaySeconds"] = int64(30)
	if _, err := services.Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	blue := waitRayServiceServing(ctx, t, cp, ns, name, "")
	ready := time.Since(t0)

	kubectl, err := framework.Kubectl(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	// startedWith checks every Ray container of cluster from inside: its RAY_AUTH_TOKEN is want.
	startedWith := func(cluster, want, when string) {
		t.Helper()
		pods, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + cluster})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range pods.Items {
			for _, c := range p.Spec.Containers {
				out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "-n", ns, "exec", p.Name, "-c", c.Name, "--",
					"printenv", "RAY_AUTH_TOKEN").Output()
				if err != nil || strings.TrimSpace(string(out)) != want {
					t.Errorf("%s: %s/%s does not hold the canonical token in its environment (%v)", when, p.Name, c.Name, err)
				}
				n++
			}
		}
		if n < 2 {
			t.Errorf("%s: %d Ray containers in cluster %s", when, n, cluster)
		}
	}
	// submit runs `ray job submit` from the host through `kubectl port-forward` to the head Service
	// with tok as the canonical Secret's value, and says whether the job ran.
	submit := func(tok, when string) {
		t.Helper()
		pf := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "-n", ns, "port-forward", "svc/"+name+"-head-svc", ":8265")
		stdout, err := pf.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := pf.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = pf.Process.Kill(); _ = pf.Wait() }()
		port := make(chan string, 1)
		go func() {
			re := regexp.MustCompile(`Forwarding from 127\.0\.0\.1:(\d+)`)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if m := re.FindStringSubmatch(sc.Text()); m != nil {
					port <- m[1]
				}
			}
			_, _ = io.Copy(io.Discard, stdout)
		}()
		var p string
		select {
		case p = <-port:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: kubectl port-forward never said where it listens", when)
		}
		cctx, ccancel := context.WithTimeout(ctx, 3*time.Minute)
		defer ccancel()
		cmd := exec.CommandContext(cctx, filepath.Join(venv, "bin", "ray"), "job", "submit", "--address", "http://127.0.0.1:"+p, "--",
			"python", "-c", "print('seed000 job ran')")
		cmd.Env = []string{"PATH=" + filepath.Join(venv, "bin") + ":/usr/bin:/bin", "HOME=" + t.TempDir(), "LANG=C.UTF-8",
			"RAY_USAGE_STATS_ENABLED=0", "RAY_AUTH_MODE=token", "RAY_AUTH_TOKEN=" + tok}
		t.Helper()
		began := time.Now()
		out, err := cmd.CombinedOutput()
		text := strings.ReplaceAll(string(out), tok, "<token>")
		if err != nil || !strings.Contains(text, "seed000 job ran") || !strings.Contains(text, "succeeded") {
			t.Errorf("%s: ray job submit through kubectl port-forward with the canonical token: %v\n%s", when, err, lastLinesOf(text, 20))
			return
		}
		t.Logf("%s: ray job submit through kubectl port-forward with the canonical token: succeeded in %s", when, time.Since(began).Round(100*time.Millisecond))
	}
	startedWith(blue, t1, "first cluster")
	submit(t1, "first cluster")

	// Clients from outside the node, by Service name through the harness's proxy.
	var canonical atomic.Value
	canonical.Store(t1)
	// Each asserted client opens a connection per call (a cron job, a CI step); a keep-alive client's
	// connection stays on the pod it reached until that pod goes, which is reported, not asserted.
	proxy, err := url.Parse(cp.ServiceProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	serve, jobs, keepAlive := &framework.CallLog{}, &framework.CallLog{}, &framework.CallLog{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	loop := func(log *framework.CallLog, url string, tok func() string, reuse bool) {
		defer wg.Done()
		tr := &http.Transport{Proxy: http.ProxyURL(proxy), DisableKeepAlives: true}
		if reuse {
			tr = &http.Transport{DialContext: tunnel(proxy.Host), MaxIdleConnsPerHost: 1} // one connection to the pod, end to end
		}
		client := &http.Client{Timeout: 30 * time.Second, Transport: tr}
		for {
			select {
			case <-stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if v := tok(); v != "" {
				req.Header.Set("Authorization", "Bearer "+v)
			}
			at := time.Now()
			resp, err := client.Do(req)
			if err != nil {
				log.Add(0, err.Error(), at)
				continue
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			log.Took(time.Since(at), at)
			log.Add(resp.StatusCode, strings.TrimSpace(string(b)), at)
		}
	}
	serveURL := "http://" + name + "-serve-svc." + ns + ".svc.cluster.local:8000/"
	wg.Add(3)
	go loop(serve, serveURL, func() string { return "" }, false)
	go loop(keepAlive, serveURL, func() string { return "" }, true)
	go loop(jobs, "http://"+name+"-head-svc."+ns+".svc.cluster.local:8265/api/jobs/", func() string { return canonical.Load().(string) }, false)

	// Blue-green upgrade, KubeRay's own: the new cluster is born on the canonical token.
	upgradeAt := time.Now()
	u, err := services.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"].(map[string]any)["rayClusterConfig"] = rayService(ns, name, image, "green").Object["spec"].(map[string]any)["rayClusterConfig"]
	if _, err := services.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	green := waitRayServiceServing(ctx, t, cp, ns, name, blue)
	blueGreen := time.Since(upgradeAt)
	upgraded := time.Now()
	startedWith(green, t1, "after the blue-green upgrade")
	// The rotation starts once the first cluster's pods are gone (KubeRay deleted the RayCluster; its
	// head takes the 30 s grace period to stop), so the replacement runs beside one cluster, as the
	// upgrade did. A keep-alive connection on that terminating head waits until the kubelet kills it
	// (its Serve proxy has stopped answering; ~20 s measured), in KubeRay's own upgrade as after a
	// rotation: the keep-alive client is reported, not asserted.
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + blue})
		return err == nil && len(l.Items) == 0, nil
	}); err != nil {
		t.Fatalf("the first cluster %s still has pods 3 minutes after the upgrade", blue)
	}
	t.Logf("the first cluster's pods were gone %.1f s after the upgrade's switch", time.Since(upgraded).Seconds())

	// Rotation: raysync has KubeRay replace the cluster; the new one is born on the new token.
	t2 := token(2)
	src, err := cp.Kube.CoreV1().Secrets(platform).Get(ctx, "ray-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src.Data = map[string][]byte{"auth_token": []byte(t2)}
	rotatedAt := time.Now()
	if _, err := cp.Kube.CoreV1().Secrets(platform).Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	canonical.Store(t2)
	third := waitRayServiceServing(ctx, t, cp, ns, name, green)
	switchedAt := time.Now()
	replaced := switchedAt.Sub(rotatedAt)
	time.Sleep(3 * time.Second) // the clients' last calls against the new cluster
	close(stop)
	wg.Wait()

	startedWith(third, t2, "after the rotation")
	submit(t2, "after the rotation")
	if code := func() int {
		h := &headAPI{client: cp.ServiceClient(10 * time.Second), base: "http://" + name + "-head-svc." + ns + ".svc.cluster.local:8265", token: t1}
		c, _, _ := h.call(ctx, http.MethodGet, "/api/jobs/", nil)
		return c
	}(); code != http.StatusForbidden {
		t.Errorf("the rotated cluster answered the previous token with HTTP %d, want 403", code)
	}

	// Failures other than for the token: none from the rotation on (raysync's replacement). In KubeRay's
	// own upgrade, before it, a failure is reported when the kubelet found a pod of the RayService failing
	// a probe around it (a head starved of CPU on 2 cores answers 503, its Service loses the endpoint:
	// KubeRay's switch, not raysync's), and fails the test otherwise.
	evs, err := cp.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=Unhealthy"})
	if err != nil {
		t.Fatal(err)
	}
	unexplained := func(client string, log *framework.CallLog) []string {
		var out []string
		for _, at := range log.FailedAt {
			when := fmt.Sprintf("%+.1fs from the upgrade's switch, %+.1fs from the rotation's start", at.Sub(upgraded).Seconds(), at.Sub(rotatedAt).Seconds())
			if probes := probeFailuresAround(evs.Items, at); at.Before(rotatedAt) && len(probes) > 0 {
				t.Logf("%s: a call failed in KubeRay's upgrade while a Ray pod failed its probes: %s (the kubelet: %s)", client, when, strings.Join(probes, "; "))
				continue
			}
			out = append(out, when)
		}
		return out
	}
	if u := unexplained("Serve", serve); len(u) != 0 || serve.OK == 0 {
		t.Errorf("Serve requests throughout: %d failed (%v; unexplained at %v), %d answered", serve.Fail, serve.Errors, u, serve.OK)
	}
	if len(serve.Bodies) < 2 || serve.Bodies[0] != "hello from blue" || serve.Bodies[len(serve.Bodies)-1] != "hello from green" {
		t.Errorf("Serve answers in order: %q", serve.Bodies)
	}
	for _, at := range jobs.Refused {
		if at.Before(rotatedAt) || at.After(switchedAt.Add(2*time.Second)) {
			t.Errorf("the Jobs API refused the canonical token at %s, outside the switch (rotation %s, switch %s)",
				at.Format(time.RFC3339Nano), rotatedAt.Format(time.RFC3339Nano), switchedAt.Format(time.RFC3339Nano))
		}
	}
	if u := unexplained("Jobs API", jobs); len(u) != 0 {
		t.Errorf("Jobs API: %d calls failed other than for their token (%v; unexplained at %v)", jobs.Fail-len(jobs.Refused), jobs.Errors, u)
	}
	var window time.Duration
	if n := len(jobs.Refused); n > 0 {
		window = jobs.Refused[n-1].Sub(jobs.Refused[0]) + 250*time.Millisecond
	}
	t.Logf("MEASURE seed 000 on the real node, KubeRay %s: RayService Ready %.1f s, blue-green %.1f s, rotation by replacement %.1f s; Serve %d answered, %d failed; Jobs API with the canonical token %d answered, %d refused (window %.1f s)",
		kuberay, ready.Seconds(), blueGreen.Seconds(), replaced.Seconds(), serve.OK, serve.Fail, jobs.OK, len(jobs.Refused), window.Seconds())
	// The keep-alive client, by phase: KubeRay's own blue-green upgrade (no raysync in it), up to the
	// first cluster's deletion, and the replacement raysync started.
	inUpgrade, inRotation := 0, 0
	for _, at := range keepAlive.FailedAt {
		if at.Before(rotatedAt) {
			inUpgrade++
		} else {
			inRotation++
		}
	}
	t.Logf("MEASURE the slowest Serve answer: %s, %+.1fs from the rotation's start (a connection per call); %s, %+.1fs (keep-alive)",
		serve.Slowest.Round(100*time.Millisecond), serve.SlowestAt.Sub(rotatedAt).Seconds(), keepAlive.Slowest.Round(100*time.Millisecond), keepAlive.SlowestAt.Sub(rotatedAt).Seconds())
	t.Logf("MEASURE a keep-alive Serve client: %d answered, %d failed during KubeRay's blue-green upgrade, %d during raysync's replacement (%v)",
		keepAlive.OK, inUpgrade, inRotation, keepAlive.Errors)
	if max(serve.Slowest, keepAlive.Slowest) > 5*time.Second {
		explainSlowAnswers(ctx, t, cp, ns, upgradeAt, rotatedAt)
	}
}

// explainSlowAnswers prints where a slow Serve answer's time went, as the service proxy saw it, and
// the namespace's Events, both against the rotation's start.
func explainSlowAnswers(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns string, since, rotatedAt time.Time) {
	t.Helper()
	if b, err := os.ReadFile(cp.LogPath("service-proxy")); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "slow:") {
				t.Logf("service proxy: %s", line)
			}
		}
	}
	evs, err := cp.Kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Logf("events: %v", err)
		return
	}
	sort.Slice(evs.Items, func(i, j int) bool { return eventTime(evs.Items[i]).Before(eventTime(evs.Items[j])) })
	for _, e := range evs.Items {
		if at := eventTime(e); !at.Before(since) {
			t.Logf("event %+6.1fs %s %s/%s %s: %s", at.Sub(rotatedAt).Seconds(), e.Source.Component+e.ReportingController, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
		}
	}
}

// probeFailuresAround names the kubelet's probe failures (Unhealthy events) that were reported from
// 10 s before at (a Service drops an endpoint after failureThreshold probes) to 2 s after it (Events
// carry whole seconds).
func probeFailuresAround(evs []corev1.Event, at time.Time) []string {
	var out []string
	for _, e := range evs {
		first, last := e.FirstTimestamp.Time, eventTime(e)
		if first.IsZero() {
			first = last
		}
		if e.Reason == "Unhealthy" && !first.After(at.Add(2*time.Second)) && !last.Before(at.Add(-10*time.Second)) {
			msg := e.Message
			if len(msg) > 80 {
				msg = msg[:80]
			}
			out = append(out, e.InvolvedObject.Name+": "+msg)
		}
	}
	return out
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	}
	return e.CreationTimestamp.Time
}

// tunnel dials through the harness's service proxy with CONNECT, so a keep-alive client holds one TCP
// connection to the pod kube-proxy chose, as a client inside the cluster would.
func tunnel(proxy string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, proxy)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("CONNECT %s: %s", addr, resp.Status)
		}
		if err != nil {
			c.Close()
			return nil, err
		}
		if br.Buffered() > 0 {
			c.Close()
			return nil, fmt.Errorf("CONNECT %s: data after the proxy's answer", addr)
		}
		return c, nil
	}
}

func TestProbeFailuresAroundAServeFailure(t *testing.T) {
	at := time.Date(2026, 12, 3, 0, 16, 0, 500e6, time.UTC)
	ev := func(reason, pod string, first, last time.Duration) corev1.Event {
		e := corev1.Event{Reason: reason, Message: "Liveness probe failed: HTTP probe failed with statuscode: 503",
			InvolvedObject: corev1.ObjectReference{Name: pod}, LastTimestamp: metav1.NewTime(at.Add(last).Truncate(time.Second))}
		if first != last {
			e.FirstTimestamp = metav1.NewTime(at.Add(first).Truncate(time.Second))
		}
		return e
	}
	for _, c := range []struct {
		name string
		ev   corev1.Event
		want int
	}{
		{"just before", ev("Unhealthy", "head", -2*time.Second, -2*time.Second), 1},
		{"same second", ev("Unhealthy", "head", 0, 0), 1},
		{"a series spanning it", ev("Unhealthy", "head", -60*time.Second, 30*time.Second), 1},
		{"too early", ev("Unhealthy", "head", -12*time.Second, -12*time.Second), 0},
		{"too late", ev("Unhealthy", "head", 3*time.Second, 3*time.Second), 0},
		{"another reason", ev("Killing", "head", 0, 0), 0},
	} {
		if got := probeFailuresAround([]corev1.Event{c.ev}, at); len(got) != c.want {
			t.Errorf("%s: %q, want %d", c.name, got, c.want)
		}
	}
}
