package framework

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one control-plane component started by the harness.
type process struct {
	name string
	path string
	dir  string // holds <name>.log
	args []string
	env  []string // added to the harness's environment
	pid  int
	done chan struct{} // closed when the process exits (only for children still owned by us)
}

// startProcess starts path with args, logging to <dir>/<name>.log. Unless detached, the child gets
// SIGKILL when the harness dies (Pdeathsig), so a crashed or killed test run leaves nothing behind.
func startProcess(dir, name, path string, args, env []string, detached bool, cloneflags uintptr) (*process, error) {
	logf, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Stdin = nil
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: cloneflags}
	if !detached {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := spawn(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, path: path, dir: dir, args: args, env: env, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pdeathsig fires when the *thread* that started the child exits, and the Go runtime may retire
// threads. Every child is therefore started from one goroutine locked to a thread that never exits.
var spawnRequests = make(chan spawnRequest)

type spawnRequest struct {
	cmd  *exec.Cmd
	done chan error
}

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: this thread lives as long as the process
		for r := range spawnRequests {
			r.done <- r.cmd.Start()
		}
	}()
}

func spawn(cmd *exec.Cmd) error {
	done := make(chan error)
	spawnRequests <- spawnRequest{cmd, done}
	return <-done
}

func (p *process) logPath() string { return filepath.Join(p.dir, p.name+".log") }

func (p *process) alive() bool {
	if p.done != nil {
		select {
		case <-p.done:
			return false
		default:
			return true
		}
	}
	return pidRuns(p.pid, p.path)
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs the process group.
func (p *process) stop(grace time.Duration) error {
	if !p.alive() {
		return nil
	}
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !p.alive() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	for i := 0; i < 100 && p.alive(); i++ {
		time.Sleep(50 * time.Millisecond)
	}
	if p.alive() {
		return fmt.Errorf("%s (pid %d) did not exit", p.name, p.pid)
	}
	return nil
}

// pidRuns reports whether pid is alive and still runs the binary at path (guards against PID reuse).
func pidRuns(pid int, path string) bool {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err == nil {
		// A zombie has exited; it only waits to be reaped.
		if f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:])); len(f) > 0 && f[0] == "Z" {
			return false
		}
	}
	return strings.TrimSuffix(exe, " (deleted)") == path
}

const pidFile = "pids"

// writePIDs records the processes in start order so another process can stop them (make dev-cluster-down).
func writePIDs(dir string, procs []*process) error {
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "%s %d %s\n", p.name, p.pid, p.path)
	}
	return os.WriteFile(filepath.Join(dir, pidFile), []byte(b.String()), 0o644)
}

func readPIDs(dir string) ([]*process, error) {
	f, err := os.Open(filepath.Join(dir, pidFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var procs []*process
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), " ", 3)
		if len(parts) != 3 {
			continue
		}
		pid, err := strconv.Atoi(parts[1])
		if err != nil {
			continue
		}
		procs = append(procs, &process{name: parts[0], pid: pid, path: parts[2], dir: dir})
	}
	return procs, s.Err()
}

// stopAll stops processes in reverse start order: operator, kcm, apiserver, etcd.
// Stopping the apiserver and etcd together leaves the apiserver hanging in graceful shutdown.
func stopAll(procs []*process) error {
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if err := procs[i].stop(20 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
