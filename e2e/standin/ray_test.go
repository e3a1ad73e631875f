package standin

import (
	"testing"
	"time"
)

func TestServeAppsDeployThenRun(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newServeState(time.Second)
	if s.running() {
		t.Fatal("Serve running before any deploy")
	}
	cfg := `{"applications":[{"name":"fruit","route_prefix":"/fruit","import_path":"fruit:app","deployments":[{"name":"Mango"},{"name":"Pear"}]},{"import_path":"hello.world"}]}`
	if err := s.apply([]byte(cfg), t0); err != nil {
		t.Fatal(err)
	}
	d := s.details(t0.Add(500 * time.Millisecond))
	if got := d.Applications["fruit"]; got.Status != appDeploying || got.Deployments["Mango"].Status != "UPDATING" || len(got.Deployments) != 2 {
		t.Errorf("half a second in: %+v", got)
	}
	d = s.details(t0.Add(time.Second))
	if got := d.Applications["default"]; got.Status != appRunning || got.RoutePrefix != "/" || got.Deployments["world"].Status != "HEALTHY" {
		t.Errorf("after the delay: %+v", got)
	}
	if app, status, _ := s.route("/fruit/mango", t0.Add(2*time.Second)); app != "fruit" || status != appRunning {
		t.Errorf("route /fruit/mango = %s %s", app, status)
	}
	if app, _, _ := s.route("/other", t0); app != "default" {
		t.Errorf("route /other = %s, want the / application", app)
	}

	// The same declaration again changes nothing; a changed application deploys again.
	changed := `{"applications":[{"name":"fruit","route_prefix":"/fruit","import_path":"fruit:app2"},{"import_path":"hello.world"}]}`
	if err := s.apply([]byte(changed), t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	d = s.details(t0.Add(5500 * time.Millisecond))
	if d.Applications["fruit"].Status != appDeploying || d.Applications["default"].Status != appRunning {
		t.Errorf("after a change: fruit %s, default %s", d.Applications["fruit"].Status, d.Applications["default"].Status)
	}
	for name, bad := range map[string]string{
		"not JSON":          `{`,
		"no import path":    `{"applications":[{"name":"x"}]}`,
		"a name used twice": `{"applications":[{"import_path":"a"},{"import_path":"b"}]}`,
	} {
		if err := s.apply([]byte(bad), t0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestJobLifecycle(t *testing.T) {
	t0 := time.Unix(1000, 0)
	s := newJobStore(100*time.Millisecond, time.Second)
	id, err := s.submit(jobRequest{Entrypoint: "python x.py", SubmissionID: "job-1"}, t0)
	if err != nil || id != "job-1" {
		t.Fatalf("submit = %q, %v", id, err)
	}
	if _, err := s.submit(jobRequest{Entrypoint: "x", SubmissionID: "job-1"}, t0); err == nil {
		t.Error("a submission id was accepted twice")
	}
	for _, tc := range []struct {
		at     time.Duration
		status string
	}{{0, jobPending}, {100 * time.Millisecond, jobRunning}, {1099 * time.Millisecond, jobRunning}, {1100 * time.Millisecond, jobSucceeded}} {
		info, _ := s.get(id, t0.Add(tc.at))
		if info.Status != tc.status {
			t.Errorf("at %s: %s, want %s", tc.at, info.Status, tc.status)
		}
	}
	if info, _ := s.get(id, t0.Add(2*time.Second)); info.EndTime != t0.Add(1100*time.Millisecond).UnixMilli() || info.StartTime == 0 {
		t.Errorf("times: %+v", info)
	}
	if status, _ := s.remove(id, t0.Add(2*time.Second)); status != jobSucceeded {
		t.Errorf("remove a finished job: %s", status)
	}
	if _, ok := s.get(id, t0); ok {
		t.Error("a removed job is still there")
	}

	gen, _ := s.submit(jobRequest{Entrypoint: "x"}, t0)
	if status, _ := s.remove(gen, t0.Add(500*time.Millisecond)); status != jobRunning {
		t.Errorf("removing a running job: %s, want it refused as RUNNING", status)
	}
	if stopped, _ := s.stop(gen, t0.Add(500*time.Millisecond)); !stopped {
		t.Error("stop of a running job")
	}
	if info, _ := s.get(gen, t0.Add(5*time.Second)); info.Status != jobStopped {
		t.Errorf("stopped job: %s", info.Status)
	}
	if stopped, _ := s.stop(gen, t0.Add(6*time.Second)); stopped {
		t.Error("a stopped job stopped again")
	}
}

func TestBackoffDoublesUpToThirtyTimesTheBase(t *testing.T) {
	base := 10 * time.Second
	for failures, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second,
		5: 160 * time.Second, 6: 300 * time.Second, 20: 300 * time.Second} {
		if got := backoffDelay(base, failures); got != want {
			t.Errorf("backoffDelay(10s, %d) = %s, want %s", failures, got, want)
		}
	}
}
