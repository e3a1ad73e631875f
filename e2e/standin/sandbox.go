package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// A real container runs under a sandbox: the stand-in's own binary, started as `standin sandbox
// SPEC` in a new mount and PID namespace, enters the pod's network namespace, puts the pod's volumes
// at their mount paths (and a private /tmp and /etc/hosts) without changing anything the host sees,
// and runs the container's command as its only child, as an init would: it forwards SIGTERM to it,
// reaps what it leaves, and exits with its status (the kernel then ends every process left in the
// PID namespace, as a container runtime does when a container stops).

// SandboxSpec is one container's process and view of the filesystem.
type SandboxSpec struct {
	NetNS  string      `json:"netns"` // path of the network namespace to enter ("": stay)
	Mounts []MountSpec `json:"mounts"`
	Hosts  string      `json:"hosts,omitempty"` // a file to bind over /etc/hosts (after the mounts)
	// Hostname is the container's hostname (a pod's name), in a UTS namespace of its own.
	Hostname string   `json:"hostname,omitempty"`
	Env      []string `json:"env"`
	Argv     []string `json:"argv"`
	Dir      string   `json:"dir,omitempty"`
	Log      string   `json:"log"` // the container's stdout and stderr
}

// MountSpec puts Source (a file or directory of the pod's) at Target; Tmpfs mounts a fresh tmpfs.
type MountSpec struct {
	Source   string `json:"source,omitempty"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Tmpfs    bool   `json:"tmpfs,omitempty"`
}

// SandboxCommand is the command that runs spec (written to specPath) in its namespaces.
func SandboxCommand(self, specPath string, spec SandboxSpec) (*exec.Cmd, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(specPath, b, 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "sandbox", specPath)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS, Pdeathsig: syscall.SIGKILL}
	return cmd, nil
}

// RunSandbox is `standin sandbox SPEC`: it returns the exit code of the container's command.
func RunSandbox(specPath string) int {
	runtime.LockOSThread() // the network namespace is a thread's; the child is forked from this one
	spec, err := readSpec(specPath)
	if err == nil {
		err = enter(spec)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "standin sandbox:", err)
		return 126
	}
	log, err := os.OpenFile(spec.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "standin sandbox:", err)
		return 126
	}
	path, err := lookPath(spec.Argv[0], spec.Env)
	if err != nil {
		fmt.Fprintf(log, "standin sandbox: %v\n", err)
		return 127
	}
	devnull, _ := os.Open(os.DevNull)
	child, err := os.StartProcess(path, spec.Argv, &os.ProcAttr{Dir: spec.Dir, Env: spec.Env, Files: []*os.File{devnull, log, log},
		Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		fmt.Fprintf(log, "standin sandbox: start %s: %v\n", path, err)
		return 126
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		for s := range signals {
			_ = syscall.Kill(-child.Pid, s.(syscall.Signal))
		}
	}()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return 1
		case pid != child.Pid:
			continue // an orphan this init reaps
		case ws.Signaled():
			return 128 + int(ws.Signal())
		}
		return ws.ExitStatus()
	}
}

func readSpec(path string) (SandboxSpec, error) {
	var spec SandboxSpec
	b, err := os.ReadFile(path)
	if err != nil {
		return spec, err
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, err
	}
	if len(spec.Argv) == 0 {
		return spec, errors.New("no command")
	}
	return spec, nil
}

// enter joins the pod's network and builds the container's view of the filesystem. Nothing mounted
// here propagates to the host: the whole tree is made private first.
func enter(spec SandboxSpec) error {
	if spec.NetNS != "" {
		f, err := os.Open(spec.NetNS)
		if err != nil {
			return err
		}
		err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
		f.Close()
		if err != nil {
			return fmt.Errorf("enter %s: %w", spec.NetNS, err)
		}
	}
	if spec.Hostname != "" {
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	mounts := append([]MountSpec(nil), spec.Mounts...)
	sort.SliceStable(mounts, func(i, j int) bool { return depth(mounts[i].Target) < depth(mounts[j].Target) })
	if spec.Hosts != "" {
		mounts = append(mounts, MountSpec{Source: spec.Hosts, Target: "/etc/hosts", ReadOnly: true})
	}
	for _, m := range mounts {
		if err := mountOne(m); err != nil {
			return fmt.Errorf("mount %s: %w", m.Target, err)
		}
	}
	return nil
}

func depth(p string) int { return strings.Count(filepath.Clean(p), "/") }

func mountOne(m MountSpec) error {
	dir := m.Tmpfs
	if !dir {
		st, err := os.Stat(m.Source)
		if err != nil {
			return err
		}
		dir = st.IsDir()
	}
	if err := ensureTarget(m.Target, dir); err != nil {
		return err
	}
	if m.Tmpfs {
		return unix.Mount("tmpfs", m.Target, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777")
	}
	if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if m.ReadOnly {
		return unix.Mount("", m.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, "")
	}
	return nil
}

// ensureTarget makes target exist in this mount namespace only: when a directory on its path does
// not exist, the deepest one that does is shadowed by a tmpfs holding the same entries (each bound
// from the original), and the rest is created in that tmpfs. The host never sees the new path.
func ensureTarget(target string, dir bool) error {
	if _, err := os.Lstat(target); err == nil {
		return nil
	}
	parent := filepath.Dir(target)
	for {
		if _, err := os.Stat(parent); err == nil {
			break
		}
		parent = filepath.Dir(parent)
	}
	if parent == "/" {
		return errors.New("cannot create a path in / without changing the host")
	}
	if err := shadow(parent); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if dir {
		return os.Mkdir(target, 0o755)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func shadow(dir string) error {
	// The original directory stays reachable through this descriptor once the tmpfs covers its path.
	orig, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer orig.Close()
	entries, err := orig.ReadDir(-1)
	if err != nil {
		return err
	}
	st, err := orig.Stat()
	if err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("mode=%o", st.Mode().Perm())); err != nil {
		return err
	}
	for _, e := range entries {
		src, dst := fmt.Sprintf("/proc/self/fd/%d/%s", orig.Fd(), e.Name()), filepath.Join(dir, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			link, err := os.Readlink(src)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, dst); err != nil {
				return err
			}
			continue
		case e.IsDir():
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
		default:
			f, err := os.Create(dst)
			if err != nil {
				return err
			}
			f.Close()
		}
		if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("keep %s: %w", dst, err)
		}
	}
	return nil
}

// lookPath finds name on the PATH of the container's env.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, kv := range env {
		if path, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, d := range filepath.SplitList(path) {
				p := filepath.Join(d, name)
				if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
					return p, nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s: not found on the container's PATH", name)
}
