package standin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The pod network of real-Ray pods. Ray advertises its node's IP and the autoscaler matches Ray nodes
// to pods by status.podIP, so a real Ray process must run on its pod's IP; Endpoints refuse loopback
// addresses, so that IP cannot be a loopback one. Each real pod therefore gets a network namespace of
// its own, with the pod IP on a veth whose other end is on a bridge in one more namespace, the
// stand-in's "node network": pods reach each other there and nowhere else (no route leads out of
// it, and the host's own namespace never sees these addresses). Inside, Ray binds its default ports
// and localhost as in a real pod. The stand-in reaches pods by dialling from the node network, and
// pods reach the API server through a relay the stand-in listens with there (nodeIP:443).

// nodeNetwork is the bridge namespace and the pod namespaces of one stand-in.
type nodeNetwork struct {
	id string // distinguishes this stand-in's namespaces from another's (its PID)

	mu   sync.Mutex
	next int
}

// netnsDir is where `ip netns` keeps named network namespaces.
const netnsDir = "/run/netns"

func (n *nodeNetwork) bridgeNS() string { return "rsn-" + n.id }

func (n *nodeNetwork) path() string { return filepath.Join(netnsDir, n.bridgeNS()) }

// newNodeNetwork creates the node network (bridge br0 with the Node's IP), after deleting what
// stand-ins that are no longer running left behind.
func newNodeNetwork() (*nodeNetwork, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("real Ray pods need root (network and mount namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("real Ray pods need iproute2's ip command")
	}
	removeStaleNamespaces()
	n := &nodeNetwork{id: strconv.Itoa(os.Getpid())}
	ns := n.bridgeNS()
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "link", "add", "br0", "type", "bridge"},
		{"-n", ns, "addr", "add", nodeIP + "/15", "dev", "br0"},
		{"-n", ns, "link", "set", "br0", "up"},
	} {
		if err := ip(args...); err != nil {
			n.close()
			return nil, err
		}
	}
	return n, nil
}

// removeStaleNamespaces deletes the namespaces of stand-ins whose process is gone.
func removeStaleNamespaces() {
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, "rsn-") && !strings.HasPrefix(name, "rsp-") {
			continue
		}
		pid, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(name, "rsn-"), "rsp-"), "-")
		if p, err := strconv.Atoi(pid); err == nil && unix.Kill(p, 0) == nil {
			continue // its stand-in runs
		}
		_ = ip("netns", "del", name)
	}
}

// close deletes the node network and every pod namespace of this stand-in.
func (n *nodeNetwork) close() {
	entries, _ := os.ReadDir(netnsDir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "rsp-"+n.id+"-") {
			_ = ip("netns", "del", e.Name())
		}
	}
	_ = ip("netns", "del", n.bridgeNS())
}

// addPod creates a pod's namespace with podIP on eth0, a default route to the Node (so that Ray finds
// its own address as it does in a pod; nothing answers beyond), and returns the namespace's path.
func (n *nodeNetwork) addPod(podIP string) (string, error) {
	n.mu.Lock()
	n.next++
	idx := n.next
	n.mu.Unlock()
	name := fmt.Sprintf("rsp-%s-%d", n.id, idx)
	veth := fmt.Sprintf("v%d", idx)
	for _, args := range [][]string{
		{"netns", "add", name},
		{"-n", n.bridgeNS(), "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name},
		{"-n", n.bridgeNS(), "link", "set", veth, "master", "br0", "up"},
		{"-n", name, "link", "set", "lo", "up"},
		{"-n", name, "addr", "add", podIP + "/15", "dev", "eth0"},
		{"-n", name, "link", "set", "eth0", "up"},
		{"-n", name, "route", "add", "default", "via", nodeIP},
	} {
		if err := ip(args...); err != nil {
			_ = ip("netns", "del", name)
			return "", err
		}
	}
	return filepath.Join(netnsDir, name), nil
}

// removePod deletes a pod's namespace (its veth goes with it).
func (n *nodeNetwork) removePod(path string) {
	if path != "" {
		_ = ip("netns", "del", filepath.Base(path))
	}
}

// dial connects to addr from the node network.
func (n *nodeNetwork) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.in(func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// listen listens on addr in the node network.
func (n *nodeNetwork) listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := n.in(func() (err error) {
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// in runs f on an OS thread that has entered the node network; the sockets f opens stay there.
func (n *nodeNetwork) in(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	defer orig.Close()
	target, err := os.Open(filepath.Join(netnsDir, n.bridgeNS()))
	if err != nil {
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter the node network: %w", err)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// This thread must never run anything else: leave it locked, and the runtime ends it.
		runtime.LockOSThread()
		return fmt.Errorf("leave the node network: %w", err)
	}
	return ferr
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
