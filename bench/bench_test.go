package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestSmoke runs the bench at tiny sizes (make test), so it keeps compiling and working, and checks
// the invariants every run must show: one write per target, no writes while idle.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	out := filepath.Join(t.TempDir(), "smoke.json")
	cmd := exec.Command("go", "run", ".", "-smoke", "-out", out)
	cmd.Stderr = os.Stderr
	if b, err := cmd.Output(); err != nil {
		t.Fatalf("bench -smoke: %v\n%s", err, b)
	} else {
		t.Logf("%s", b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	// The fan-out's later rounds write raysync's CPU profiles beside the results (make bench:
	// bench/results/, git-ignored), never into $TMPDIR, where every make test left them.
	if p, _ := filepath.Glob(filepath.Join(filepath.Dir(out), "raysync-fanout-*.pprof")); len(p) == 0 {
		t.Errorf("no CPU profile beside %s", out)
	}
	if len(r.Rotation) != 1 || r.Rotation[0].Writes != r.Rotation[0].N || r.Rotation[0].LastMs <= 0 {
		t.Errorf("rotation: %+v (want exactly one write per target)", r.Rotation)
	} else if r.Rotation[0].RotationEvents != r.Rotation[0].N {
		t.Errorf("rotation recorded %d TokenRotated Events for %d clusters", r.Rotation[0].RotationEvents, r.Rotation[0].N)
	}
	if r.Idle == nil || r.Idle.Writes != 0 {
		t.Errorf("idle: %+v (want no writes)", r.Idle)
	}
	if len(r.Memory) != 2 || r.Memory[0].PeakRSSMi <= 0 {
		t.Errorf("memory: %+v", r.Memory)
	}
	if len(r.Race) != 3 {
		t.Errorf("race: %d start delays measured, want 3", len(r.Race))
	}
	for _, x := range r.Race {
		if x.RaysyncFirst+x.KubeRayFirst != x.Clusters || x.Clusters == 0 {
			t.Errorf("race: %+v (want every cluster's Secret created by raysync or KubeRay and measured)", x)
		}
		if x.ContainerStarts < 2*x.Clusters {
			t.Errorf("race at %d ms: %d container starts for %d clusters (want a head and a worker each)", x.StartDelayMs, x.ContainerStarts, x.Clusters)
		}
	}
	if len(r.Running) != 1 || r.Running[0].ExternalRequests == 0 || r.Running[0].OperatorAccepted == 0 ||
		r.Running[0].OperatorRejected != 0 || r.Running[0].JoinFailures != 0 {
		t.Errorf("rotation with running clusters: %+v (want requests counted, none from the operator refused, every join accepted)", r.Running)
	}
	if len(r.Fleet) != 1 || !r.Fleet[0].Done || r.Fleet[0].OperatorRejected != 0 || r.Fleet[0].JoinFailures != 0 ||
		r.Fleet[0].PeakInFlight > r.Fleet[0].Bound {
		t.Errorf("fleet rotation: %+v (want done, within the bound, nothing refused)", r.Fleet)
	}
	if len(r.Admission) != 12 {
		t.Errorf("admission: %d rounds, want 12 (at once and one at a time, 3 start delays, today and webhook)", len(r.Admission))
	}
	for _, x := range r.Admission {
		if x.Pods < 2*x.Clusters || x.ContainerStarts == 0 {
			t.Errorf("admission %+v: pods or starts not counted", x)
		}
		if x.Mode == "webhook" && (x.BornWithout != 0 || x.Recycled != 0 || x.NonCanonical != 0) {
			t.Errorf("admission with the webhook: %+v (want every pod born with raysync's entries on the canonical token)", x)
		}
	}
	if b := r.Burst; b == nil || b.Mutated != b.Pods || b.ServerP99Ms <= 0 {
		t.Errorf("admission burst: %+v (want every pod mutated and the answer time measured)", b)
	}
	e := r.ESO
	if e == nil || len(e.Rotation) != 3 || len(e.Idle) != 2 || e.Memory.PeakRSSMi <= 0 {
		t.Fatalf("External Secrets Operator side by side incomplete: %+v", e)
	}
	for _, x := range e.Rotation[:2] { // raysync, then ESO at 10s: both deliver to every target
		if x.Done != x.N || x.Writes != x.N {
			t.Errorf("%s rotation: %d/%d targets, %d writes (want all, one each)", x.Client, x.Done, x.N, x.Writes)
		}
	}
	if x := e.Rotation[2]; x.Client != "eso refresh 1h" || x.Done != 0 {
		t.Errorf("%s rotation: %d targets done within the limit; ESO cannot see a change before its refresh", x.Client, x.Done)
	}
	if x := e.Idle[0]; x.RequestsPerSec == 0 {
		t.Errorf("ESO at refresh 10s made no requests while idle: is it running? %+v", x)
	}
}
