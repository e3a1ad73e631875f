package framework

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
)

// RemoteAddrs lists the remote ends of the TCP sockets a control-plane process holds (connected or
// connecting; listeners left out), read from /proc. Tests use it to show that a process talks to
// loopback only, e.g. that the KubeRay operator reaches pod IPs only through the stand-in's proxy.
func (c *ControlPlane) RemoteAddrs(name string) ([]netip.AddrPort, error) {
	p := c.proc(name)
	if p == nil {
		return nil, fmt.Errorf("no %s process", name)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
	if err != nil {
		return nil, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", p.pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var out []netip.AddrPort
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", p.pid, table))
		if err != nil {
			continue
		}
		s := bufio.NewScanner(f)
		s.Scan() // header
		for s.Scan() {
			// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
			f := strings.Fields(s.Text())
			if len(f) < 10 || !inodes[f[9]] || f[3] == "0A" { // 0A: LISTEN
				continue
			}
			if ap, err := parseProcAddr(f[2]); err == nil {
				out = append(out, ap)
			}
		}
		f.Close()
	}
	return out, nil
}

// parseProcAddr reads /proc/net/tcp's "0100007F:1F90" (IPv4) or 32-hex-digit IPv6 form: the
// address in 32-bit words of host (little-endian) byte order, the port in big-endian hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	host, port, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	raw, err := hex.DecodeString(host)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("bad address %q", s)
	}
	for i := 0; i < len(raw); i += 4 {
		raw[i], raw[i+1], raw[i+2], raw[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
	}
	var p uint16
	if _, err := fmt.Sscanf(port, "%X", &p); err != nil {
		return netip.AddrPort{}, fmt.Errorf("bad port in %q", s)
	}
	addr, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(addr.Unmap(), p), nil
}
