// Command bench measures raysync on one fresh local control plane and prints Markdown tables; the
// numbers go to bench/results/latest.json. BENCHMARKS.md explains the method and the results.
//
//	go run ./bench           # race (50 clusters, KubeRay v1.6.1 running, pods starting 0 / 100 ms / 1 s
//	                         # after creation), fan-out N = 100, 1000, 5000 vs a minimal client, idle
//	                         # 5 min, memory M = 0 / 20,000, ESO side by side, today's rotation with
//	                         # 10 RayServices and 10 RayClusters running (5 min)
//	go run ./bench -smoke    # the same at tiny sizes, a few minutes with cached binaries (make test)
//	go run ./bench -scenarios running -kuberay v1.5.1 -out /tmp/running.json   # one scenario
//
// The KubeRay operator watches only the race and running namespaces: elsewhere the bench creates
// RayClusters and KubeRay-shaped auth Secrets itself, to reach scale. The kubelet and Ray stand-in
// starts the pods the operator creates.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

type result struct {
	Commit  string                  `json:"commit"`
	CPUs    int                     `json:"cpus"`
	Smoke   bool                    `json:"smoke"`
	Race    []raceResult            `json:"new_cluster_race"`
	Running []runningRotationResult `json:"running_rotation,omitempty"`
	Fleet   []fleetResult           `json:"fleet_rotation,omitempty"`
	// Admission: new clusters today and with the webhook; the webhook under a burst of pods.
	Admission []admissionResult `json:"admission,omitempty"`
	Burst     *burstResult      `json:"admission_burst,omitempty"`
	Rotation  []rotationResult  `json:"rotation"`
	Idle      *idleResult       `json:"idle,omitempty"`
	Memory    []memoryResult    `json:"memory"`
	ESO       *esoResult        `json:"external_secrets_operator,omitempty"`
	RealRay   *realRayResult    `json:"real_ray,omitempty"`
	Gateway   *gatewayResult    `json:"gateway,omitempty"`
	Growth    []growthResult    `json:"growth,omitempty"`
}

// esoResult is raysync and External Secrets Operator on the same N targets, run alternately.
type esoResult struct {
	Version  string         `json:"version"`
	N        int            `json:"n"`
	Rotation []sideRotation `json:"rotation"`
	Idle     []sideIdle     `json:"idle"`
	Memory   memoryResult   `json:"memory"`
	// Ratios raysync / ESO (below 1: raysync is faster, lighter).
	RotationRatio10s float64 `json:"rotation_ratio_vs_10s"`
	RotationRatio1h  float64 `json:"rotation_ratio_vs_1h_upper_bound"`
	IdleRatio10s     float64 `json:"idle_requests_ratio_vs_10s"`
	IdleRatio1h      float64 `json:"idle_requests_ratio_vs_1h"`
	MemoryRatio      float64 `json:"memory_ratio"`
}

type sideRotation struct {
	Client string `json:"client"` // raysync, eso refresh 10s, eso refresh 1h
	Round  int    `json:"round"`
	rotationResult
}

type sideIdle struct {
	Client string `json:"client"`
	idleResult
}

type rotationResult struct {
	N      int     `json:"n"`
	P50Ms  float64 `json:"p50_ms"`
	P99Ms  float64 `json:"p99_ms"`
	LastMs float64 `json:"last_ms"`
	Writes int     `json:"target_writes"`
	Done   int     `json:"targets_done"` // < N: the rotation did not finish within the limit
	// Events raysync recorded for the rotation (one TokenRotated per cluster is intended; client-go's
	// broadcaster drops what does not fit its 1,000-Event queue).
	RotationEvents int     `json:"rotation_events,omitempty"`
	MinimalLastMs  float64 `json:"minimal_client_last_ms"`
	Ratio          float64 `json:"ratio_to_minimal"`
	// Rounds alternate raysync's rotation with the two controls, on the same targets; Ratio and
	// EventsRatio are the medians of the rounds' ratios (one pair measures the machine as much as raysync).
	Rounds      []fanoutRound `json:"rounds,omitempty"`
	EventsRatio float64       `json:"ratio_to_minimal_with_events,omitempty"`
}

// fanoutRound is one raysync rotation of every target, then the minimal client writing every
// target, then the minimal client writing every target and one Event per target (raysync writes a
// TokenRotated Event per cluster too). raysync is stopped while the controls run.
type fanoutRound struct {
	RaysyncLastMs       float64 `json:"raysync_last_ms"`
	MinimalLastMs       float64 `json:"minimal_client_last_ms"`
	MinimalEventsLastMs float64 `json:"minimal_client_with_events_last_ms"`
	// TrailingMs: how long raysync kept making requests after its last target write (the RayClusters'
	// records and the Events follow the writes); the controls start only once it is quiet.
	TrailingMs float64 `json:"raysync_trailing_ms"`
}

type idleResult struct {
	N              int            `json:"n"`
	Seconds        float64        `json:"seconds"`
	Writes         int            `json:"target_writes"`
	RequestsPerSec float64        `json:"api_requests_per_s"`
	Requests       map[string]int `json:"api_requests"`
	// SettleSeconds is how long the client kept making requests after the last change (false: never quiet).
	SettleSeconds float64 `json:"settle_s"`
	Settled       bool    `json:"settled"`
}

type memoryResult struct {
	N, M      int
	PeakRSSMi float64 `json:"peak_rss_mib"`
}

func main() {
	smoke := flag.Bool("smoke", false, "tiny sizes, ~2 minutes with cached binaries")
	out := flag.String("out", "bench/results/latest.json", "where to write the numbers")
	idleOverride := flag.Duration("idle", 0, "how long each idle measurement lasts (default 5m; 12s, more than one ESO refresh, with -smoke)")
	sizes := flag.String("sizes", "", "comma-separated fan-out sizes (default 100,1000,5000; 20 with -smoke)")
	only := flag.String("scenarios", "race,memory,fanout,eso,running,fleet,admission,realray,gateway", "which scenarios to run (realray: Ray 2.60 itself; not in -smoke unless named; growth: how the costs grow with N, only when named)")
	growthSizes := flag.String("growth-sizes", "100,1000,5000,10000", "comma-separated cluster counts of the growth scenario")
	growthIdle := flag.Duration("growth-idle", time.Minute, "how long the growth scenario counts idle API requests at each size")
	runningPolicies := flag.String("running-policies", "hold,restart", "standalone clusters' rotation policies the running scenario measures, one run each")
	before := flag.String("before", "77f3cf1", "the raysync commit whose rotation behaviour the fleet scenario compares with (before safe rotation)")
	kuberayVersion := flag.String("kuberay", "v1.6.1", "KubeRay operator version (v1.5.1 or v1.6.1)")
	flag.IntVar(&burstConcurrency, "burst-concurrency", burstConcurrency, "pod creates (and reviews) the admission burst has in flight")
	flag.Parse()
	ns := []int{100, 1000, 5000}
	idleFor, memN, memM, raceN, esoN, esoRounds := 5*time.Minute, 1000, 20000, 50, 1000, 2
	esoLimit1h := 2 * time.Minute
	raceDelays := []time.Duration{0, 100 * time.Millisecond, time.Second}
	runningServices, runningClusters, runningFor, probeEvery := 10, 10, 5*time.Minute, 10*time.Second
	fleetN, fleetBounds, fleetLimit := 100, []int{5, 10, 20}, 20*time.Minute
	admissionN, burstN := 50, 1000
	if *smoke {
		ns, idleFor, memN, memM, raceN, esoN, esoRounds = []int{20}, 12*time.Second, 20, 200, 3, 20, 1
		esoLimit1h = 15 * time.Second
		runningServices, runningClusters, runningFor, probeEvery = 1, 2, 8*time.Second, 2*time.Second
		fleetN, fleetBounds, fleetLimit, *before = 3, []int{2}, 3*time.Minute, ""
		admissionN, burstN = 3, 50
	}
	if *sizes != "" {
		ns = nil
		for _, f := range strings.Split(*sizes, ",") {
			n, err := strconv.Atoi(f)
			check(err)
			ns = append(ns, n)
		}
	}
	// Real-world periods, so counts over time mean what they would on a cluster: the kubelet's 10 s
	// restart back-off base, KubeRay's wait-gcs-ready polling every 5 s. The smoke run only checks
	// that everything works, with the harness's fast defaults.
	standIn := framework.StandInOptions{Backoff: 10 * time.Second, GCSRetry: 5 * time.Second}
	if *smoke {
		standIn = framework.StandInOptions{}
	}
	run := map[string]bool{}
	for _, f := range strings.Split(*only, ",") {
		run[f] = true
	}
	if *smoke && !flagSet("scenarios") {
		delete(run, "realray") // make test runs the real-Ray e2e instead
	}
	if run["realray"] {
		venv, err := framework.EnsureRay(context.Background(), func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) })
		check(err)
		standIn.RayVenv = venv
	}
	if *idleOverride > 0 {
		idleFor = *idleOverride
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "raysync-bench-")
	check(err)
	defer os.RemoveAll(dir)
	audit, auditFlags := auditArgs(dir)
	// One control plane for everything; the operator acts only on the race namespace.
	cp, err := framework.Start(ctx, framework.Options{KubeRayVersion: *kuberayVersion, ExtraAPIServerArgs: auditFlags,
		OperatorArgs: []string{"--watch-namespace=" + strings.Join([]string{raceNamespace, runningNamespace, runningNamespace + "-restart", fleetNamespace, admissionNamespace, realRayNamespace}, ",")},
		StandIn:      standIn,
		Logf:         func(f string, a ...any) { fmt.Fprintf(os.Stderr, "bench: "+f+"\n", a...) }})
	check(err)
	defer cp.Stop()
	bin := buildSyncer()
	var esoBin string
	if run["eso"] {
		esoBin = installESO(ctx, cp)
	}
	res := result{Commit: gitCommit(), CPUs: runtime.NumCPU(), Smoke: *smoke}

	if run["race"] {
		b := &bench{cp: cp, bin: bin, ns: raceNamespace}
		b.setup(0)
		for _, d := range raceDelays {
			res.Race = append(res.Race, b.race(raceN, d))
		}
	}
	if run["running"] {
		policies := strings.Split(*runningPolicies, ",")
		if *smoke {
			policies = policies[:1]
		}
		for _, p := range policies {
			ns := runningNamespace // one namespace per run, each watched by the operator
			if p != "hold" {
				ns += "-" + p
			}
			res.Running = append(res.Running, (&bench{cp: cp, bin: bin, ns: ns}).runningRotation(runningServices, runningClusters, runningFor, probeEvery, p))
		}
	}
	if run["realray"] {
		r := (&bench{cp: cp, bin: bin, ns: realRayNamespace}).realRay(4)
		res.RealRay = &r
	}
	if run["gateway"] {
		rate, each := 1000, 20*time.Second
		if *smoke {
			rate, each = 100, 2*time.Second
		}
		r := (&bench{cp: cp, bin: bin, ns: "gateway"}).gatewayBench(rate, each)
		res.Gateway = &r
	}
	if run["growth"] {
		for _, f := range strings.Split(*growthSizes, ",") {
			n, err := strconv.Atoi(f)
			check(err)
			res.Growth = append(res.Growth, (&bench{cp: cp, bin: bin, ns: fmt.Sprintf("growth-%d", n)}).growth(n, audit, *growthIdle))
		}
	}
	if run["fleet"] {
		res.Fleet = (&bench{cp: cp, bin: bin, ns: fleetNamespace}).fleetRotation(fleetN, fleetBounds, *before, fleetLimit)
	}
	if run["admission"] || run["burst"] {
		b := &bench{cp: cp, bin: bin, ns: admissionNamespace}
		b.admissionSources()
		for _, spacing := range []time.Duration{0, 2 * time.Second} {
			n := admissionN
			if spacing > 0 {
				n = min(admissionN, 10) // one at a time, as blue-green upgrades and RayJobs come
			}
			for _, d := range raceDelays {
				if !run["admission"] {
					break // -scenarios burst: only the burst
				}
				for _, webhook := range []bool{false, true} {
					res.Admission = append(res.Admission, b.admissionRound(n, d, spacing, webhook))
				}
			}
		}
		burst := b.admissionBurst(burstN)
		res.Burst = &burst
	}

	// Memory: peak RSS with N clusters, before and after M unrelated 8 KiB Secrets exist; then ESO at M.
	if run["memory"] {
		b := &bench{cp: cp, bin: bin, ns: "memory"}
		b.setup(memN)
		for _, m := range []int{0, memM} {
			if m > 0 {
				b.unrelatedSecrets(m)
			}
			s := b.startSyncer("--all-namespaces")
			b.waitAll(memN, b.token)
			time.Sleep(2 * time.Second)
			res.Memory = append(res.Memory, memoryResult{N: memN, M: m, PeakRSSMi: s.peakRSSMiB()})
			s.stop()
		}
		if run["eso"] {
			res.ESO = &esoResult{Version: framework.ESOVersion, N: esoN}
			b.esoSetup("1h")
			b.setSource(b.token + "-eso") // a new token for ESO to deliver (raysync is stopped)
			e := startESO(cp, esoBin, dir)
			b.waitAll(memN, b.token)
			time.Sleep(2 * time.Second)
			res.ESO.Memory = memoryResult{N: memN, M: memM, PeakRSSMi: e.peakRSSMiB()}
			b.esoTeardown()
			e.stop()
		}
	}

	for i, n := range ns {
		if !run["fanout"] {
			break
		}
		b := &bench{cp: cp, bin: bin, ns: fmt.Sprintf("fanout-%d", n)}
		b.setup(n)
		s := b.startSyncer("--namespaces=" + b.ns)
		b.waitAll(n, b.token)
		var r rotationResult
		var ratios, eventRatios []float64
		for round := range fanoutRounds {
			one := b.rotate(n, 0)
			trail, _ := audit.quiet("raysync", 3*time.Second, 2*time.Minute)
			events := b.events(names.ReasonTokenRotated)
			if round == 0 {
				r = one // the first round's distribution, writes and Events
			}
			s.stop() // each side alone with the API server
			x := fanoutRound{RaysyncLastMs: one.LastMs, MinimalLastMs: b.minimalClient(n, false), MinimalEventsLastMs: b.minimalClient(n, true),
				TrailingMs: float64((time.Second + trail).Milliseconds())} // rotate waits 1 s after the last target
			r.Rounds = append(r.Rounds, x)
			ratios = append(ratios, x.RaysyncLastMs/x.MinimalLastMs)
			eventRatios = append(eventRatios, x.RaysyncLastMs/x.MinimalEventsLastMs)
			fmt.Fprintf(os.Stderr, "bench: fan-out N=%d round %d: raysync %.0f ms (busy %.0f ms after its last target), minimal client %.0f ms (%.2fx), with Events %.0f ms (%.2fx); %d TokenRotated Events so far\n",
				n, round+1, x.RaysyncLastMs, x.TrailingMs, x.MinimalLastMs, ratios[round], x.MinimalEventsLastMs, eventRatios[round], events)
			// The next process (start, cache sync, one rotation) writes a CPU profile beside the results:
			// where raysync's time goes.
			b.profile = filepath.Join(filepath.Dir(*out), fmt.Sprintf("raysync-fanout-%d-round%d.pprof", n, round+2))
			s = b.startSyncer("--namespaces=" + b.ns)
			b.profile = ""
		}
		r.MinimalLastMs = median(func() []float64 {
			var m []float64
			for _, x := range r.Rounds {
				m = append(m, x.MinimalLastMs)
			}
			return m
		}())
		r.Ratio, r.EventsRatio = median(ratios), median(eventRatios)
		res.Rotation = append(res.Rotation, r)
		if res.Idle == nil && (n == esoN || i == len(ns)-1) {
			res.Idle = b.idle(audit, "raysync", n, idleFor)
		} else {
			audit.quiet("raysync", 5*time.Second, 2*time.Minute)
		}
		res.Rotation[len(res.Rotation)-1].RotationEvents = b.events(names.ReasonTokenRotated) / fanoutRounds
		s.stop()
	}

	if run["eso"] {
		if res.ESO == nil {
			res.ESO = &esoResult{Version: framework.ESOVersion, N: esoN}
		}
		b := &bench{cp: cp, bin: bin, ns: "side-by-side"}
		b.sideBySide(res.ESO, audit, esoBin, dir, esoRounds, idleFor, esoLimit1h)
		res.ESO.ratios(res.Idle, res.Memory)
	}

	printTable(res)
	b2, _ := json.MarshalIndent(res, "", "  ")
	check(os.MkdirAll(filepath.Dir(*out), 0o755))
	check(os.WriteFile(*out, append(b2, '\n'), 0o644))
}

type bench struct {
	cp    *framework.ControlPlane
	bin   string
	ns    string
	token string
	objs  []*corev1.Secret
	// profile, when set, is where raysync writes a CPU profile of its run ($RAYSYNC_CPUPROFILE).
	profile string
	// webhookURL and webhookCA: the webhook raysync serves (admission scenario).
	webhookURL string
	webhookCA  []byte
}

var rcGVR = kuberay.RayClusterGVR

// setup creates the namespace, the source and n RayClusters with KubeRay-shaped auth Secrets.
func (b *bench) setup(n int) {
	ctx := context.Background()
	_, _ = b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{})
	b.token = "bench-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err := b.cp.Kube.CoreV1().Secrets(b.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		Data: map[string][]byte{"auth_token": []byte(b.token)}}, metav1.CreateOptions{})
	check(err)
	b.clusters(n, func(name string) []byte { return []byte("kuberay-random-" + name) }, nil, nil)
}

// clusters creates n RayClusters (shaped by each, if not nil) with KubeRay-shaped auth Secrets
// holding token(name).
// after, if not nil, is called with each cluster as created.
func (b *bench) clusters(n int, token func(name string) []byte, each, after func(*unstructured.Unstructured)) {
	ctx := context.Background()
	b.objs = make([]*corev1.Secret, n)
	parallel(n, 16, func(i int) {
		name := fmt.Sprintf("c%05d", i)
		rc := rayCluster(b.ns, name)
		if each != nil {
			each(rc)
		}
		created, err := b.cp.Dynamic.Resource(rcGVR).Namespace(b.ns).Create(ctx, rc, metav1.CreateOptions{})
		check(err)
		if after != nil {
			after(created)
		}
		yes := true
		s, err := b.cp.Kube.CoreV1().Secrets(b.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels:          map[string]string{kuberay.ClusterLabel: name},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "ray.io/v1", Kind: "RayCluster", Name: name, UID: created.GetUID(), Controller: &yes}}},
			Data: map[string][]byte{"auth_token": token(name)}}, metav1.CreateOptions{})
		check(err)
		b.objs[i] = s
	})
}

// events counts the Events with reason in the namespace (count > 1 when the correlator merged some).
func (b *bench) events(reason string) int {
	l, err := b.cp.Kube.CoreV1().Events(b.ns).List(context.Background(), metav1.ListOptions{FieldSelector: "reason=" + reason})
	check(err)
	n := 0
	for _, e := range l.Items {
		n += int(max(e.Count, 1))
	}
	return n
}

// watchSecrets watches the namespace's Secrets matching selector from now on.
func (b *bench) watchSecrets(selector string) watch.Interface {
	ctx := context.Background()
	l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{Limit: 1})
	check(err)
	w, err := b.cp.Kube.CoreV1().Secrets(b.ns).Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: l.ResourceVersion})
	check(err)
	return w
}

// setSource writes token into the source Secret.
func (b *bench) setSource(token string) {
	ctx := context.Background()
	src, err := b.cp.Kube.CoreV1().Secrets(b.ns).Get(ctx, "ray-token", metav1.GetOptions{})
	check(err)
	src.Data["auth_token"] = []byte(token)
	_, err = b.cp.Kube.CoreV1().Secrets(b.ns).Update(ctx, src, metav1.UpdateOptions{})
	check(err)
	b.token = token
}

// rayCluster is a minimal token-auth RayCluster that KubeRay v1.5.1 and v1.6.1 accept.
func rayCluster(ns, name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"rayVersion": "2.52.0", "authOptions": map[string]any{"mode": "token"},
			"headGroupSpec": map[string]any{"rayStartParams": map[string]any{}, "template": map[string]any{"spec": map[string]any{
				"containers": []any{map[string]any{"name": "ray-head", "image": "rayproject/ray:2.52.0"}}}}}}}}
}

func (b *bench) waitAll(n int, token string) {
	ctx := context.Background()
	check(wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel})
		if err != nil {
			return false, nil
		}
		ok := 0
		for _, s := range l.Items {
			if string(s.Data["auth_token"]) == token {
				ok++
			}
		}
		return ok == n, nil
	}))
}

// rotate changes the source and times each target reaching the new token (from the source write).
// With limit > 0 an incomplete rotation is reported (Done < N) instead of failing the bench.
func (b *bench) rotate(n int, limit time.Duration) rotationResult {
	ctx := context.Background()
	w := b.watchSecrets(kuberay.ClusterLabel)
	defer w.Stop()
	newToken := b.token + "-rotated"
	src, err := b.cp.Kube.CoreV1().Secrets(b.ns).Get(ctx, "ray-token", metav1.GetOptions{})
	check(err)
	src.Data["auth_token"] = []byte(newToken)
	start := time.Now()
	_, err = b.cp.Kube.CoreV1().Secrets(b.ns).Update(ctx, src, metav1.UpdateOptions{})
	check(err)
	done := map[string]time.Duration{}
	writes := 0
	capped := limit > 0
	if !capped {
		limit = 10 * time.Minute
	}
	timeout := time.After(limit)
wait:
	for len(done) < n {
		select {
		case ev := <-w.ResultChan():
			s, ok := ev.Object.(*corev1.Secret)
			if !ok || ev.Type != watch.Modified {
				continue
			}
			writes++
			if string(s.Data["auth_token"]) == newToken {
				if _, seen := done[s.Name]; !seen {
					done[s.Name] = time.Since(start)
				}
			}
		case <-timeout:
			if !capped {
				check(fmt.Errorf("rotation of %d targets incomplete after %s (%d done)", n, limit, len(done)))
			}
			break wait
		}
	}
	time.Sleep(time.Second) // count any extra write
	for len(w.ResultChan()) > 0 {
		if ev := <-w.ResultChan(); ev.Type == watch.Modified {
			writes++
		}
	}
	b.token = newToken
	var d []float64
	for _, v := range done {
		d = append(d, float64(v.Microseconds())/1000)
	}
	sort.Float64s(d)
	r := rotationResult{N: n, Done: len(d), Writes: writes}
	for len(d) < n { // targets not done within the limit count as the limit
		d = append(d, float64(limit.Milliseconds()))
	}
	r.P50Ms, r.P99Ms, r.LastMs = pct(d, 50), pct(d, 99), d[len(d)-1]
	return r
}

// fanoutRounds is how many times the fan-out alternates raysync and the controls.
const fanoutRounds = 5

// minimalClient is the physical limit: a 16-goroutine pool updating targets it already knows (with
// events, also creating one Event per target on its RayCluster, as raysync does). It keeps raysync's
// annotations, so raysync finds every target in sync when it starts again.
func (b *bench) minimalClient(n int, events bool) float64 {
	ctx := context.Background()
	// Fresh copies with current resourceVersions (raysync wrote them).
	l, err := b.cp.Kube.CoreV1().Secrets(b.ns).List(ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel})
	check(err)
	if len(l.Items) != n {
		check(fmt.Errorf("minimal client: %d targets, want %d", len(l.Items), n))
	}
	round := strconv.FormatInt(time.Now().UnixNano(), 36)
	start := time.Now()
	parallel(len(l.Items), 16, func(i int) {
		s := l.Items[i].DeepCopy()
		s.Data["auth_token"] = []byte(b.token)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations["bench/minimal"] = round
		_, err := b.cp.Kube.CoreV1().Secrets(b.ns).Update(ctx, s, metav1.UpdateOptions{})
		check(err)
		if !events {
			return
		}
		owner := s.Labels[kuberay.ClusterLabel]
		_, err = b.cp.Kube.CoreV1().Events(b.ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: owner + ".", Namespace: b.ns},
			InvolvedObject: corev1.ObjectReference{APIVersion: "ray.io/v1", Kind: "RayCluster", Namespace: b.ns, Name: owner},
			Reason:         "BenchMinimal", Message: "minimal client wrote the token", Type: corev1.EventTypeNormal,
			Source: corev1.EventSource{Component: "bench-minimal"}, Count: 1,
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now()}, metav1.CreateOptions{})
		check(err)
	})
	return float64(time.Since(start).Microseconds()) / 1000
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// idle waits until the client (by user agent) has made no request for 5 s (at most 2 minutes: the
// work a change causes, including Events that trail the writes, is not idle cost), then counts the
// target writes and the client's API requests over d with nothing changing.
func (b *bench) idle(audit *auditLog, agent string, n int, d time.Duration) *idleResult {
	settle, quiet := audit.quiet(agent, 5*time.Second, 2*time.Minute)
	w := b.watchSecrets(kuberay.ClusterLabel)
	defer w.Stop()
	from := time.Now()
	deadline := time.After(d)
	writes := 0
loop:
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Modified || ev.Type == watch.Added {
				writes++
			}
		case <-deadline:
			break loop
		}
	}
	reqs := audit.requests(agent, from, time.Now())
	fmt.Fprintf(os.Stderr, "bench: idle %s N=%d: quiet after %s (%v), then %d requests in %s: %s\n", agent, n, settle.Round(time.Millisecond), quiet, total(reqs), d, breakdown(reqs))
	return &idleResult{N: n, Seconds: d.Seconds(), Writes: writes, RequestsPerSec: float64(total(reqs)) / d.Seconds(), Requests: reqs,
		SettleSeconds: settle.Seconds(), Settled: quiet}
}

func (b *bench) unrelatedSecrets(m int) {
	ctx := context.Background()
	payload := bytes.Repeat([]byte("x"), 8192)
	const perNS = 1000
	for i := 0; i*perNS < m; i++ {
		_, _ = b.cp.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("unrelated-%d", i)}}, metav1.CreateOptions{})
	}
	parallel(m, 16, func(i int) {
		_, err := b.cp.Kube.CoreV1().Secrets(fmt.Sprintf("unrelated-%d", i/perNS)).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("s%05d", i)}, Data: map[string][]byte{"blob": payload}}, metav1.CreateOptions{})
		check(err)
	})
}

// proc is a controller the bench runs: raysync or External Secrets Operator.
type proc struct{ cmd *exec.Cmd }

// startProc starts cmd (killed if the bench dies) and waits until readyURL answers 200; on failure
// the error carries the tail of logPath, if any.
func startProc(cmd *exec.Cmd, readyURL, logPath string) *proc {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	check(cmd.Start())
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		resp, err := http.Get(readyURL)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == 200, nil
	})
	if err != nil {
		out, _ := os.ReadFile(logPath)
		check(fmt.Errorf("%s did not become ready: %w\n%s", filepath.Base(cmd.Path), err, out[max(0, len(out)-4000):]))
	}
	return &proc{cmd: cmd}
}

func (b *bench) startSyncer(args ...string) *proc { return b.startSyncerBinary(b.bin, args...) }

// startSyncerBinary runs a raysync binary on b's namespace's source with args (the scope at least).
func (b *bench) startSyncerBinary(bin string, args ...string) *proc {
	pp, err := framework.FreePort()
	check(err)
	cmd := exec.Command(bin, append([]string{"--kubeconfig=" + b.cp.Kubeconfig, "--auth-source=" + b.ns + "/ray-token",
		"--leader-elect=false", "--log-level=warn", "--metrics-bind-address=0", fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", pp)}, args...)...)
	cmd.Stderr = os.Stderr
	if b.profile != "" {
		cmd.Env = append(os.Environ(), "RAYSYNC_CPUPROFILE="+b.profile)
	}
	return startProc(cmd, fmt.Sprintf("http://127.0.0.1:%d/readyz", pp), "")
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	_ = p.cmd.Wait()
}

// peakRSSMiB reads VmHWM (the peak resident set) from /proc.
func (p *proc) peakRSSMiB() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	check(err)
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.ParseFloat(strings.Fields(l)[1], 64)
			return kb / 1024
		}
	}
	return 0
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func printRealRay(r *realRayResult) {
	if r == nil {
		return
	}
	fmt.Printf("\n| real Ray %s: cluster start (head + 1 worker), from creation | runs | head's Ray started p50 / max | worker's Ray started p50 / max | head Ready p50 / max | worker joined (Ready) p50 / max |\n|---|---|---|---|---|---|\n", r.Ray)
	for _, with := range []bool{false, true} {
		var cols [4][]float64
		for _, run := range r.Runs {
			if run.Raysync == with {
				for i, v := range []float64{run.HeadStartedS, run.WorkerStartedS, run.HeadReadyS, run.WorkerJoinS} {
					cols[i] = append(cols[i], v)
				}
			}
		}
		if len(cols[0]) == 0 {
			continue
		}
		fmt.Printf("| %s | %d |", map[bool]string{true: "with raysync (webhook)", false: "without raysync"}[with], len(cols[0]))
		for _, c := range cols {
			sort.Float64s(c)
			fmt.Printf(" %.1f / %.1f s |", c[len(c)/2], c[len(c)-1])
		}
		fmt.Println()
	}
	fmt.Printf("\n| real Ray | |\n|---|---|\n| autoscaler scale-up 0 → 2 workers through raysync's client certificate (job submitted → both joined) | %.1f s |\n"+
		"| RayService blue-green upgrade (spec changed → new cluster serving, old one gone) | %.1f s |\n| one idle head pod (head + autoscaler off), PSS | %.0f MiB in %d processes |\n",
		r.ScaleUpS, r.BlueGreenS, r.HeadPSSMiB, r.HeadProcs)
}

func printTable(r result) {
	defer printGrowth(r.Growth)
	defer printGateway(r.Gateway)
	defer printRealRay(r.RealRay)
	fmt.Printf("\n### raysync bench (commit %s, %d CPUs%s)\n", r.Commit, r.CPUs, map[bool]string{true: ", smoke", false: ""}[r.Smoke])
	if len(r.Race) > 0 {
		x := r.Race[0]
		fmt.Printf("\n| new-cluster race (%s, %d clusters at once), pod start delay | Secret: first watch event to canonical token p50 / p99 / max | created by raysync / KubeRay | container starts with a token | started with a non-canonical token | clusters affected | GCS joins refused |\n|---|---|---|---|---|---|---|\n", x.OperatorImage, x.Clusters)
	}
	for _, x := range r.Race {
		fmt.Printf("| %d ms | %.1f / %.1f / %.1f ms | %d / %d | %d | %d | %d | %d |\n", x.StartDelayMs, x.P50Ms, x.P99Ms, x.MaxMs, x.RaysyncFirst, x.KubeRayFirst, x.ContainerStarts, x.NonCanonical, x.ClustersAffected, x.JoinFailures)
	}
	for _, x := range r.Running {
		fmt.Printf("\n| rotation with running clusters (KubeRay %s, %d RayServices replaced + %d RayClusters %s, %.0f s) | count |\n|---|---|\n",
			x.KubeRay, x.RayServices, x.RayClusters, x.RayClusterPolicy, x.ObservedSeconds)
		fmt.Printf("| operator requests rejected by a cluster (accepted) | %d (%d) |\n", x.OperatorRejected, x.OperatorAccepted)
		fmt.Printf("| worker GCS join failures (container restarts) | %d (%d) |\n", x.JoinFailures, x.Restarts)
		fmt.Printf("| RayService status changes | %d |\n", x.StatusChanges)
		fmt.Printf("| external requests with the new token rejected | %d of %d |\n", x.ExternalRejected, x.ExternalRequests)
		fmt.Printf("| new workers (scaled up, restarted) never Ready | %d |\n", x.NewWorkersNotReady)
	}
	if len(r.Rotation) > 0 {
		fmt.Println("\n| rotation fan-out N | p50 | p99 | last | target writes | minimal client (N writes) | raysync / minimal | TokenRotated Events |")
		fmt.Println("|---|---|---|---|---|---|---|---|")
	}
	for _, x := range r.Rotation {
		fmt.Printf("| %d | %.0f ms | %.0f ms | %.0f ms | %d | %.0f ms | %.2fx | %d |\n", x.N, x.P50Ms, x.P99Ms, x.LastMs, x.Writes, x.MinimalLastMs, x.Ratio, x.RotationEvents)
	}
	for _, x := range r.Rotation {
		if len(x.Rounds) == 0 {
			continue
		}
		fmt.Printf("\n| fan-out N = %d, round | raysync (last target after the source write) | then busy for | minimal client (N writes) | ratio | minimal client + one Event per target | ratio |\n|---|---|---|---|---|---|---|\n", x.N)
		for i, p := range x.Rounds {
			fmt.Printf("| %d | %.0f ms | %.0f ms | %.0f ms | %.2fx | %.0f ms | %.2fx |\n", i+1, p.RaysyncLastMs, p.TrailingMs, p.MinimalLastMs, p.RaysyncLastMs/p.MinimalLastMs, p.MinimalEventsLastMs, p.RaysyncLastMs/p.MinimalEventsLastMs)
		}
		fmt.Printf("| median of %d | | | | %.2fx | | %.2fx |\n", len(x.Rounds), x.Ratio, x.EventsRatio)
	}
	if len(r.Fleet) > 0 {
		fmt.Println("\n| fleet rotation: RayServices | bound | done | wall time | peak in flight | operator requests rejected | worker join failures |\n|---|---|---|---|---|---|---|")
	}
	for _, x := range r.Fleet {
		bound := fmt.Sprint(x.Bound)
		if x.Bound == 0 {
			bound = "before (Secrets written under running clusters)"
		}
		fmt.Printf("| %d | %s | %v | %.0f s | %d | %d | %d |\n", x.RayServices, bound, x.Done, x.WallSeconds, x.PeakInFlight, x.OperatorRejected, x.JoinFailures)
	}
	if len(r.Admission) > 0 {
		fmt.Printf("\n| new clusters with a pull secret and autoscaler TLS | pod start delay | mode | pods created | born without raysync's entries | recycled | started without them | starts on a non-canonical token | creation → all pods started p50 / max |\n|---|---|---|---|---|---|---|---|---|\n")
	}
	for _, x := range r.Admission {
		how := fmt.Sprintf("%d at once", x.Clusters)
		if x.SpacingMs > 0 {
			how = fmt.Sprintf("%d, %d s apart", x.Clusters, x.SpacingMs/1000)
		}
		fmt.Printf("| %s | %d ms | %s | %d | %d | %d | %d | %d of %d | %.0f / %.0f ms |\n", how, x.StartDelayMs, x.Mode, x.Pods, x.BornWithout, x.Recycled, x.StartedWithout, x.NonCanonical, x.ContainerStarts, x.ReadyP50Ms, x.ReadyMaxMs)
	}
	if x := r.Burst; x != nil {
		fmt.Printf("\n| webhook, burst of %d pods (%d at a time) | reviews sent straight to the webhook p50 / p99 | answer p50 / p99 in the API-server burst (bucket bound) | pod create p50 / p99 with webhook | without | raysync CPU | peak RSS |\n|---|---|---|---|---|---|---|\n", x.Pods, x.Concurrency)
		fmt.Printf("| %d mutated | %.2f / %.2f ms | ≤ %.2f / ≤ %.2f ms | %.1f / %.1f ms | %.1f / %.1f ms | %.2f s | %.1f MiB |\n", x.Mutated, x.DirectP50Ms, x.DirectP99Ms, x.ServerP50Ms, x.ServerP99Ms, x.CreateP50Ms, x.CreateP99Ms, x.CreateNoHookP50Ms, x.CreateNoHookP99Ms, x.CPUSeconds, x.PeakRSSMi)
	}
	if x := r.Idle; x != nil {
		fmt.Printf("\n| idle, raysync (N = %d, %.0f s) | target writes | API requests/s | requests | quiet after the last change |\n|---|---|---|---|---|\n", x.N, x.Seconds)
		fmt.Printf("| | %d | %.3f | %s | %.1f s |\n", x.Writes, x.RequestsPerSec, breakdown(x.Requests), x.SettleSeconds)
	}
	if len(r.Memory) > 0 {
		fmt.Println("\n| memory: clusters N | unrelated 8 KiB Secrets M | peak RSS |\n|---|---|---|")
	}
	for _, m := range r.Memory {
		fmt.Printf("| %d | %d | %.1f MiB |\n", m.N, m.M, m.PeakRSSMi)
	}
	if e := r.ESO; e != nil {
		fmt.Printf("\n| side by side, N = %d: rotation | round | p50 | p99 | last | targets done | target writes |\n|---|---|---|---|---|---|---|\n", e.N)
		for _, x := range e.Rotation {
			fmt.Printf("| %s | %d | %.0f ms | %.0f ms | %.0f ms | %d / %d | %d |\n", x.Client, x.Round, x.P50Ms, x.P99Ms, x.LastMs, x.Done, x.N, x.Writes)
		}
		fmt.Println("\n| side by side: idle | target writes | API requests/s | requests | quiet after the last change |\n|---|---|---|---|---|")
		if x := r.Idle; x != nil {
			fmt.Printf("| raysync (N = %d) | %d | %.3f | %s | %.1f s |\n", x.N, x.Writes, x.RequestsPerSec, breakdown(x.Requests), x.SettleSeconds)
		}
		for _, x := range e.Idle {
			quiet := fmt.Sprintf("%.1f s", x.SettleSeconds)
			if !x.Settled {
				quiet = "never (gave up after 2 min)"
			}
			fmt.Printf("| %s %s | %d | %.3f | %s | %s |\n", e.Version, x.Client, x.Writes, x.RequestsPerSec, breakdown(x.Requests), quiet)
		}
		fmt.Printf("\n| raysync / ESO | rotation vs 10s | rotation vs 1h | idle requests vs 10s | idle requests vs 1h | peak RSS at M = %d |\n|---|---|---|---|---|---|\n", e.Memory.M)
		fmt.Printf("| | %.3f | < %.4f | %.4f | %.4f | %.2f (%.1f MiB ESO) |\n", e.RotationRatio10s, e.RotationRatio1h, e.IdleRatio10s, e.IdleRatio1h, e.MemoryRatio, e.Memory.PeakRSSMi)
	}
}

func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func buildSyncer() string {
	bin, err := framework.BuildSyncer("syncer-bench")
	check(err)
	return bin
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
