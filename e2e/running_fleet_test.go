package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// runningFleet is a namespace whose RayServices, RayClusters and RayJob were created and ran before
// raysync, on KubeRay's own random tokens.
type runningFleet struct {
	env      *Env
	ns       string
	token    string
	services []string
	clusters []string // standalone
	job      string
	args     []string // raysync's flags, as installed with the chart's defaults
}

// newRunningFleet creates the fleet with raysync not running and waits until all of it runs.
func newRunningFleet(t *testing.T, env *Env, services, clusters int, withJob bool) *runningFleet {
	env.StandIn()
	f := &runningFleet{env: env, ns: env.Namespace(), token: env.NewToken()}
	for i := range services {
		name := fmt.Sprintf("svc-%d", i)
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(f.ns).Create(env.ctx, rayService(f.ns, name, "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.services = append(f.services, name)
	}
	for i := range clusters {
		name := fmt.Sprintf("rc-%d", i)
		env.CreateRayCluster(rayCluster(f.ns, name))
		f.clusters = append(f.clusters, name)
	}
	if withJob {
		job := rayJob(f.ns, "job", "HTTPMode")
		_ = unstructured.SetNestedField(job.Object, "sleep 900", "spec", "entrypoint") // runs through the whole test
		if _, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(f.ns).Create(env.ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.job = (&fleet{env: env, ns: f.ns}).waitJobRunning("job")
	}
	for _, s := range f.services {
		env.WaitRayServiceReady(f.ns, s, 3*time.Minute, nil)
	}
	for _, c := range f.clusters {
		env.WaitPodsReady(f.ns, kuberay.ClusterLabel+"="+c, 2, 2*time.Minute)
	}
	// Then raysync is installed: the canonical token, the control ConfigMap the chart renders (empty),
	// and raysync with the chart's defaults (webhook on, RayServices replace, the rest hold, 5 at a time).
	env.PutSource(f.ns, "ray-token", tokenData(f.token))
	if _, err := env.Kube.CoreV1().ConfigMaps(f.ns).Create(env.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "raysync-control"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.args = []string{"--auth-source=" + f.ns + "/ray-token", "--namespaces=" + f.ns, "--control=" + f.ns + "/raysync-control"}
	return f
}

// cli runs a syncer command with raysync's flags.
func (f *runningFleet) cli(command string, args ...string) (string, int) {
	return f.env.syncerCLI(command, append(append([]string{}, f.args...), args...)...)
}

// activeCluster is the RayService's serving cluster.
func (f *runningFleet) activeCluster(svc string) string {
	rs, err := f.env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(f.ns).Get(f.env.ctx, svc, metav1.GetOptions{})
	if err != nil {
		f.env.t.Fatal(err)
	}
	c, _, _ := unstructured.NestedString(rs.Object, "status", "activeServiceStatus", "rayClusterName")
	return c
}

// watchChanges counts, from now until stop, the RayClusters created and the pods deleted in the fleet's
// namespace, and calls every RayService's Serve application every 500 ms, counting each answer that is
// not 200.
func (f *runningFleet) watchChanges(t *testing.T) (stop func() (created, deleted, serveErrors, serveCalls int64)) {
	ctx, cancel := context.WithCancel(f.env.ctx)
	var created, deleted, errs, calls atomic.Int64
	rcw, err := f.env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(f.ns).Watch(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	pw, err := f.env.Kube.CoreV1().Pods(f.ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		for ev := range rcw.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && ev.Type == watch.Added && u.GetCreationTimestamp().After(since.Add(-time.Second)) {
				created.Add(1)
				t.Logf("RayCluster %s created", u.GetName())
			}
		}
	})
	wg.Go(func() {
		for ev := range pw.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok && (ev.Type == watch.Deleted || ev.Type == watch.Modified && p.DeletionTimestamp != nil) {
				deleted.Add(1)
			}
		}
	})
	for _, svc := range f.services {
		wg.Go(func() {
			url := fmt.Sprintf("http://%s-serve-svc.%s.svc.cluster.local:8000/fruit/mango", svc, f.ns)
			for ctx.Err() == nil {
				calls.Add(1)
				if code := f.env.rayGet(url, nil); code != http.StatusOK && ctx.Err() == nil {
					errs.Add(1)
					t.Logf("Serve of %s answered %d", svc, code)
				}
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
			}
		})
	}
	return func() (int64, int64, int64, int64) {
		cancel()
		rcw.Stop()
		pw.Stop()
		wg.Wait()
		return created.Load(), deleted.Load(), errs.Load(), calls.Load()
	}
}

// Issue 34: three RayServices, two RayClusters and a RayJob created and running before raysync is
// installed with the chart's defaults. For 5 minutes raysync creates no RayCluster, deletes no pod,
// and no Serve call fails; syncer status lists all six as not adopted (exit 1). A dry run of adoption
// changes nothing; adopting two RayServices moves exactly those, one at a time, with 0 Serve errors; a
// cluster created after the install is born on the canonical token. That installing moves nothing is
// raysync's decision, not the operator's (how an adopted RayService then moves is, and TestFleetRotation
// runs it on both versions): one KubeRay version, the newest.
func TestInstallIntoARunningFleetMovesNothing(t *testing.T) {
	cp := newestKubeRay()
	if cp == nil || testing.Short() {
		t.Skip("needs a control plane; long")
	}
	t.Parallel()
	env := newEnv(t, cp)
	env.longer(15 * time.Minute)
	f := newRunningFleet(t, env, 3, 2, true)
	before := map[string]string{}
	for _, svc := range f.services {
		before[svc] = f.activeCluster(svc)
	}
	watching := f.watchChanges(t)
	f.args = append(f.args, "--max-concurrent-rotations=1") // the syncer commands take these too
	ctrl := append(append([]string{}, f.args...), env.webhookFor(f.ns, f.ns)...)
	env.StartSyncer(ctrl...)
	env.waitCABundle(ctrl)

	out, code := f.cli("status")
	if code != 1 || len(regexp.MustCompile(`frozen\s+not adopted`).FindAllString(out, -1)) != 6 || !strings.Contains(out, "adopting all would move 6 cluster(s): 3 replaced") {
		t.Errorf("syncer status: exit %d, want 1, listing 6 clusters not adopted and what adopting them would do:\n%s", code, out)
	}
	for _, c := range append(append([]string{}, f.clusters...), before[f.services[0]], f.job) {
		env.WaitEvent(f.ns, c, names.ReasonNotAdopted, time.Minute)
	}
	time.Sleep(5 * time.Minute)
	created, deleted, serveErrors, calls := watching()
	if created != 0 || deleted != 0 || serveErrors != 0 {
		t.Errorf("in 5 minutes after the install: %d RayClusters created, %d pods deleted, %d of %d Serve calls failed; want 0, 0, 0",
			created, deleted, serveErrors, calls)
	}
	t.Logf("MEASURE install-into-fleet kuberay=%s window_s=300 clusters_created=%d pods_deleted=%d serve_errors=%d serve_calls=%d",
		env.KubeRayVersion, created, deleted, serveErrors, calls)

	// The preview changes nothing.
	watching = f.watchChanges(t)
	out, code = f.cli("adopt", "--all", "--dry-run")
	if code != 0 || !strings.Contains(out, "would be replaced") || !strings.Contains(out, "(dry run: nothing changed)") {
		t.Errorf("syncer adopt --all --dry-run: exit %d\n%s", code, out)
	}
	cm, err := env.Kube.CoreV1().ConfigMaps(f.ns).Get(env.ctx, "raysync-control", metav1.GetOptions{})
	if err != nil || len(cm.Data) != 0 {
		t.Errorf("the dry run wrote the control ConfigMap: %v %v", cm.Data, err)
	}
	time.Sleep(15 * time.Second)
	if created, deleted, _, _ := watching(); created != 0 || deleted != 0 {
		t.Errorf("after the dry run: %d RayClusters created, %d pods deleted", created, deleted)
	}

	// Adopting two RayServices moves exactly those, one at a time.
	watching = f.watchChanges(t)
	out, code = f.cli("adopt", "rayservice/"+f.ns+"/svc-0", "rayservice/"+f.ns+"/svc-1")
	if code != 0 || strings.Count(out, "will be replaced") != 2 {
		t.Fatalf("syncer adopt: exit %d\n%s", code, out)
	}
	inFlight := (&fleet{env: env, ns: f.ns}).watchInFlight()
	for _, svc := range f.services[:2] {
		env.WaitEvent(f.ns, svc, names.ReasonRotationCompleted, 5*time.Minute)
		env.AssertStartedWith(f.ns, f.token, f.activeCluster(svc))
	}
	created, _, serveErrors, calls = watching()
	if created != 2 || serveErrors != 0 {
		t.Errorf("adopting two RayServices: %d RayClusters created, %d of %d Serve calls failed; want 2 and 0", created, serveErrors, calls)
	}
	if m := inFlight(); m != 1 {
		t.Errorf("%d replacements in flight at once, want 1 (--max-concurrent-rotations=1)", m)
	}
	if got := f.activeCluster(f.services[2]); got != before[f.services[2]] {
		t.Errorf("svc-2, not adopted, moved from %s to %s", before[f.services[2]], got)
	}
	for _, c := range f.clusters {
		if tok := env.secretToken(f.ns, c); tok == f.token {
			t.Errorf("RayCluster %s, not adopted, took the canonical token", c)
		}
	}
	// A cluster created now is born on the canonical token.
	env.CreateRayCluster(rayCluster(f.ns, "after"))
	env.WaitPodsReady(f.ns, kuberay.ClusterLabel+"=after", 2, 2*time.Minute)
	env.AssertStartedWith(f.ns, f.token, "after")
}

// Issue 34: the emergency stop mid-wave. Four RayServices adopted by construction (born while raysync
// ran) rotate one at a time; syncer pause while the first is in flight: for 2 minutes no further
// replacement starts, a raysync restart inside the window keeps it stopped, and the one in flight ends
// cleanly; syncer resume continues, and every RayService ends on the new token. The stop is raysync's
// code: one KubeRay version.
func TestPausedWaveStartsNothingUntilResumed(t *testing.T) {
	cp := newestKubeRay()
	if cp == nil || testing.Short() {
		t.Skip("needs a control plane; long")
	}
	t.Parallel()
	env := newEnv(t, cp)
	env.StandIn()
	ns, t1 := env.NamespaceWithToken()
	if _, err := env.Kube.CoreV1().ConfigMaps(ns).Create(env.ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "raysync-control"}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f := &runningFleet{env: env, ns: ns, token: t1, args: []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns,
		"--control=" + ns + "/raysync-control", "--max-concurrent-rotations=1"}}
	s := env.StartSyncer(f.args...)
	for i := range 4 {
		name := fmt.Sprintf("svc-%d", i)
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, name, "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.services = append(f.services, name)
	}
	for _, svc := range f.services {
		env.WaitRayServiceReady(ns, svc, 3*time.Minute, nil)
	}
	t2 := env.NewToken()
	env.PutSource(ns, "ray-token", tokenData(t2))
	(&fleet{env: env, ns: ns}).waitRotationsStarted(s, 1)
	if out, code := f.cli("pause", "--reason=e2e: capacity"); code != 0 || !strings.Contains(out, "paused:") {
		t.Fatalf("syncer pause: exit %d\n%s", code, out)
	}
	started := func() int {
		n := 0
		for _, e := range env.Events(ns, "raysync", names.ReasonRotationStarted) {
			if e.InvolvedObject.Kind == string(names.OwnerRayService) {
				n++
			}
		}
		return n
	}
	window := time.Now()
	atPause := started()
	s.WaitMetric("raysync_rotation_paused", nil, 1, 30*time.Second)
	time.Sleep(45 * time.Second)
	s.Kill() // a restart while stopped: the stop is in the ConfigMap, not in the process
	s = env.StartSyncer(f.args...)
	s.WaitMetric("raysync_rotation_paused", nil, 1, 30*time.Second)
	for time.Since(window) < 2*time.Minute {
		if n := started(); n != atPause {
			t.Fatalf("%d replacements started while paused (%d when paused)", n, atPause)
		}
		time.Sleep(time.Second)
	}
	out, code := f.cli("status")
	if !strings.Contains(out, "PAUSED") || !strings.Contains(out, "e2e: capacity") || code != 1 {
		t.Errorf("syncer status while paused: exit %d\n%s", code, out)
	}
	// The one in flight ended cleanly, on the new token.
	completed := env.Events(ns, "raysync", names.ReasonRotationCompleted)
	if len(completed) == 0 {
		t.Errorf("the replacement in flight when paused did not complete in 2 minutes")
	}
	if out, code := f.cli("resume"); code != 0 || !strings.Contains(out, "resumed") {
		t.Fatalf("syncer resume: exit %d\n%s", code, out)
	}
	for _, svc := range f.services {
		(&fleet{env: env, ns: ns}).waitServingOn(svc, t2, 6*time.Minute)
	}
	s.WaitMetric("raysync_rotation_paused", nil, 0, 30*time.Second)
	t.Logf("MEASURE pause window_s=120 started_while_paused=0 in_flight_completed=%d", len(completed))
}

// Issue 34 item 3: a valid but wrong token rolled out mid-wave and put back. Three RayServices on the
// good token A rotate to the wrong B one at a time; once one has moved onto B, A is put back. The
// ledger numbers A anew (after the live read of the source, never a lagging cache's A again), the
// RayServices not moved stay on A and are current, the one moved onto B is behind and replaced back
// onto A by its policy, and each ends serving on A.
func TestWrongTokenPutBackMidWave(t *testing.T) {
	cp := newestKubeRay()
	if cp == nil || testing.Short() {
		t.Skip("needs a control plane; long")
	}
	t.Parallel()
	env := newEnv(t, cp)
	env.StandIn()
	ns, good := env.NamespaceWithToken()
	args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns, "--max-concurrent-rotations=1"}
	env.StartSyncer(args...)
	var services []string
	for i := range 3 {
		name := fmt.Sprintf("svc-%d", i)
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, name, "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		services = append(services, name)
	}
	f := &fleet{env: env, ns: ns}
	for _, svc := range services {
		env.WaitRayServiceReady(ns, svc, 3*time.Minute, nil)
	}
	wrong := env.NewToken()
	env.PutSource(ns, "ray-token", tokenData(wrong))
	// The first RayService to complete moved onto the wrong token; then the good one goes back.
	var moved string
	deadline := time.Now().Add(5 * time.Minute)
	for moved == "" && time.Now().Before(deadline) {
		for _, e := range env.Events(ns, "raysync", names.ReasonRotationCompleted) {
			if e.InvolvedObject.Kind == string(names.OwnerRayService) {
				moved = e.InvolvedObject.Name
			}
		}
		time.Sleep(time.Second)
	}
	if moved == "" {
		t.Fatal("no RayService moved onto the wrong token within 5 minutes")
	}
	env.PutSource(ns, "ray-token", tokenData(good))
	// Those the wrong token had not reached (no replacement started, read from the objects once the
	// good token is back) are current again: they must never move.
	unmoved := map[string]bool{}
	for _, svc := range services {
		rs, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Get(env.ctx, svc, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if svc != moved && rs.GetAnnotations()[names.RotationStartedAnnotation] == "" {
			unmoved[svc] = true
		}
	}
	for _, e := range env.Events(ns, "raysync", names.ReasonRotationStarted) {
		delete(unmoved, e.InvolvedObject.Name) // started and already completed (its Event seen)
	}
	for _, svc := range services {
		f.waitServingOn(svc, good, 8*time.Minute)
	}
	ledger, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "raysync-rotations", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(ledger.Data["rotations.json"]), `"id"`); n != 3 {
		t.Errorf("the ledger numbers %d rotations, want 3 (good, wrong, good again)", n)
	}
	replaced := map[string]int{}
	for _, e := range env.Events(ns, "raysync", names.ReasonRotationStarted) {
		if e.InvolvedObject.Kind == string(names.OwnerRayService) {
			replaced[e.InvolvedObject.Name]++
		}
	}
	if replaced[moved] < 2 {
		t.Errorf("%s moved onto the wrong token and was replaced %d time(s): want it replaced back", moved, replaced[moved])
	}
	for svc := range unmoved {
		if replaced[svc] != 0 {
			t.Errorf("%s had not moved when the good token came back, and was replaced %d time(s): want none", svc, replaced[svc])
		}
	}
	env.assertNoRefusals(ns)
	t.Logf("MEASURE wrong-token moved=%s replacements=%v unmoved-at-put-back=%v", moved, replaced, slices.Sorted(maps.Keys(unmoved)))
}
