// Command supervisor runs the real node of raysync's e2e harness, as kind's node container runs
// kubelet and containerd. The harness starts it in new mount, network and PID namespaces:
//
//	supervisor node -dir DIR     # PID 1 of the node: mounts, then the processes of DIR/spec.json
//	supervisor relay -listen A -to B
//	supervisor proxy -listen A -dns D -allow CIDR
//
// As PID 1 it reaps every orphan (containerd's shims re-parent to it), and when it exits the kernel
// kills everything left in its PID namespace, so a node can never outlive its supervisor. Its mounts
// live and die with its mount namespace; its network namespace holds the node's addresses.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Spec is what the harness writes to DIR/spec.json (the harness has its own copy of these types).
type Spec struct {
	// Tmpfs are directories hidden behind an empty tmpfs inside the node (/run, /var/lib, /var/log):
	// whatever the node's programs write at their hard-coded paths stays in the node and goes with it.
	Tmpfs []string `json:"tmpfs"`
	// Binds are files or directories of the harness mounted over the node's view of a path (/etc/hosts).
	Binds []Bind `json:"binds"`
	// Processes start in order; each waits for the previous one's socket, if it names one.
	Processes []Process `json:"processes"`
}

type Bind struct {
	Source string `json:"source"`
	Target string `json:"target"`
}

type Process struct {
	Name string   `json:"name"`
	Path string   `json:"path"`
	Args []string `json:"args"`
	Env  []string `json:"env"`
	// WaitFor is a path (a socket) that exists once the process is ready.
	WaitFor string `json:"waitFor"`
}

func main() {
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	if len(os.Args) < 2 {
		log.Fatal("usage: supervisor node -dir DIR | supervisor relay -listen ADDR -to ADDR | supervisor proxy -listen ADDR -dns ADDR -allow CIDR")
	}
	var err error
	switch os.Args[1] {
	case "node":
		fs := flag.NewFlagSet("node", flag.ExitOnError)
		dir := fs.String("dir", "", "the node's directory (spec.json, logs)")
		_ = fs.Parse(os.Args[2:])
		err = runNode(*dir)
	case "relay":
		fs := flag.NewFlagSet("relay", flag.ExitOnError)
		listen := fs.String("listen", "", "address to listen on")
		to := fs.String("to", "", "address to relay to")
		_ = fs.Parse(os.Args[2:])
		err = relay(*listen, *to)
	case "proxy":
		fs := flag.NewFlagSet("proxy", flag.ExitOnError)
		listen := fs.String("listen", "", "address to listen on (loopback)")
		dns := fs.String("dns", "", "the cluster DNS (CoreDNS's Service address:53)")
		allow := fs.String("allow", "", "the only addresses the proxy dials (the node's, its pods', its Services')")
		_ = fs.Parse(os.Args[2:])
		err = serveProxy(*listen, *dns, *allow)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

func runNode(dir string) error {
	if os.Getpid() != 1 {
		return errors.New("must run as PID 1 of a new PID namespace (the harness starts it so)")
	}
	b, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return err
	}
	var spec Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("spec.json: %w", err)
	}
	if err := mountNode(spec); err != nil {
		return err
	}
	// The harness moves one end of a veth pair into this namespace and addresses it, then says so.
	if err := waitPath(filepath.Join(dir, "network-ready"), 60*time.Second); err != nil {
		return fmt.Errorf("network never configured: %w", err)
	}

	s := &supervisor{exited: map[int]syscall.WaitStatus{}, names: map[int]string{}, stop: make(chan struct{})}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	go s.reap(sigs)
	for _, p := range spec.Processes {
		if err := s.start(dir, p); err != nil {
			s.stopAll()
			return err
		}
		if p.WaitFor != "" {
			if err := waitPath(p.WaitFor, 60*time.Second); err != nil {
				s.stopAll()
				return fmt.Errorf("%s: %w", p.Name, err)
			}
		}
		log.Printf("%s started", p.Name)
	}
	_ = os.WriteFile(filepath.Join(dir, "node-ready"), nil, 0o644)
	<-s.stop
	s.stopAll()
	log.Print("node stopped")
	return nil // PID 1 exits: the kernel kills what is left (containers) in this PID namespace
}

// mountNode makes the node's mounts private to it, gives it its own /proc, and hides the host
// paths the kubelet, containerd and CNI write to behind tmpfs.
func mountNode(spec Spec) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	for _, t := range spec.Tmpfs {
		if err := syscall.Mount("tmpfs", t, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("tmpfs on %s: %w", t, err)
		}
	}
	for _, b := range spec.Binds {
		if err := syscall.Mount(b.Source, b.Target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", b.Source, b.Target, err)
		}
	}
	return nil
}

type supervisor struct {
	mu     sync.Mutex
	order  []int
	names  map[int]string
	exited map[int]syscall.WaitStatus
	stop   chan struct{}
	once   sync.Once
}

func (s *supervisor) start(dir string, p Process) error {
	logf, err := os.OpenFile(filepath.Join(dir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(p.Path, p.Args...)
	cmd.Env = append(os.Environ(), p.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	s.order = append(s.order, cmd.Process.Pid)
	s.names[cmd.Process.Pid] = p.Name
	return nil
}

// reap collects every child and orphan (the duty of PID 1) and turns SIGTERM into an orderly stop.
func (s *supervisor) reap(sigs chan os.Signal) {
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			s.once.Do(func() { close(s.stop) })
			continue
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
			s.mu.Lock()
			if name, ok := s.names[pid]; ok {
				s.exited[pid] = ws
				log.Printf("%s (pid %d) exited: %v", name, pid, exitText(ws))
			}
			s.mu.Unlock()
		}
	}
}

func exitText(ws syscall.WaitStatus) string {
	if ws.Signaled() {
		return "signal " + ws.Signal().String()
	}
	return fmt.Sprintf("status %d", ws.ExitStatus())
}

// stopAll stops the processes in reverse start order (kube-proxy, kubelet, containerd), each with
// SIGTERM and 10 s of grace.
func (s *supervisor) stopAll() {
	s.mu.Lock()
	order := append([]int(nil), s.order...)
	s.mu.Unlock()
	for i := len(order) - 1; i >= 0; i-- {
		pid := order[i]
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			s.mu.Lock()
			_, done := s.exited[pid]
			s.mu.Unlock()
			if done {
				break
			}
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

func waitPath(path string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s did not appear within %s", path, timeout)
}

// relay forwards TCP connections: the node reaches the API server, which listens on loopback only,
// at the host end of its veth.
func relay(listen, to string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			u, err := net.DialTimeout("tcp", to, 5*time.Second)
			if err != nil {
				log.Printf("relay to %s: %v", to, err)
				return
			}
			defer u.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			go func() { _, _ = io.Copy(c, u); c.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
			<-done
			<-done
		}()
	}
}
