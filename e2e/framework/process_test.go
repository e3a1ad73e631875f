package framework

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHelperHarness is not a test: TestInterruptedRunLeavesNothing runs the test binary as a harness
// that starts a whole control plane and then waits to be killed.
func TestHelperHarness(t *testing.T) {
	dir := os.Getenv("FRAMEWORK_HELPER_DIR")
	if dir == "" {
		t.Skip("helper process only")
	}
	if _, err := Start(context.Background(), Options{KubeRayVersion: "v1.6.1", Dir: dir}); err != nil {
		t.Fatal(err)
	}
	os.Stdout.WriteString("READY\n")
	select {}
}

// TestInterruptedRunLeavesNothing kills a harness mid-run, as an interrupted or crashed `go test` does,
// and checks that etcd, the API server, the controller manager, the stand-in and the operator die with it.
func TestInterruptedRunLeavesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a control plane")
	}
	// Build (or find) the binaries here, without a deadline: on a cold machine the build takes
	// minutes, and the helper's readiness deadline below is for starting a control plane only.
	if _, err := EnsureBinaries(context.Background(), "v1.6.1", t.Logf); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHarness$", "-test.timeout=5m")
			cmd.Env = append(os.Environ(), "FRAMEWORK_HELPER_DIR="+dir)
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			ready := make(chan bool, 1)
			go func() {
				s := bufio.NewScanner(out)
				for s.Scan() {
					if strings.TrimSpace(s.Text()) == "READY" {
						ready <- true
					}
				}
				ready <- false
			}()
			select {
			case ok := <-ready:
				if !ok {
					t.Fatal("helper harness exited before its control plane was ready")
				}
			case <-time.After(4 * time.Minute):
				_ = cmd.Process.Kill()
				t.Fatal("helper harness never became ready")
			}
			procs, err := readPIDs(dir)
			if err != nil || len(procs) != 5 {
				t.Fatalf("pid file: %d processes, %v", len(procs), err)
			}
			t.Cleanup(func() { // whatever survived a failure must not outlive the test
				for _, p := range procs {
					if pidRuns(p.pid, p.path) {
						_ = syscall.Kill(p.pid, syscall.SIGKILL)
					}
				}
			})
			for _, p := range procs {
				if !pidRuns(p.pid, p.path) {
					t.Fatalf("%s (pid %d) is not running before the kill", p.name, p.pid)
				}
			}
			killed := time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()
			deadline := time.Now().Add(10 * time.Second)
			for _, p := range procs {
				for pidRuns(p.pid, p.path) {
					if time.Now().After(deadline) {
						t.Fatalf("%s (pid %d) still runs 10 s after the harness got %s", p.name, p.pid, sig)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			t.Logf("MEASURE harness %s: all 5 control-plane processes gone %s after the signal", sig, time.Since(killed).Round(time.Millisecond))
		})
	}
}
