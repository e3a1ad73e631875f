package framework

import (
	"fmt"
	"os"
	"testing"
)

func TestParseProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"0100A8C6:1F49":                         "198.168.0.1:8009",
		"00000000000000000000000001000000:0050": "[::1]:80",
		"0000000000000000FFFF00000100007F:1F90": "127.0.0.1:8080",
	} {
		got, err := parseProcAddr(in)
		if err != nil || got.String() != want {
			t.Errorf("parseProcAddr(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
}

// The harness's ports are never ones the kernel hands out as source ports of outgoing connections:
// one was taken between choosing it and etcd binding it while another package's tests ran (CI).
func TestHarnessPortsAreOutsideTheEphemeralRange(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Skip("no ip_local_port_range here")
	}
	var first, last int
	if _, err := fmt.Sscan(string(b), &first, &last); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for i := 0; i < 50; i++ {
		ports, err := freePorts(4)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ports {
			if p >= first && p <= last {
				t.Fatalf("port %d is in the ephemeral range %d-%d", p, first, last)
			}
			if seen[p] {
				t.Fatalf("port %d handed out twice", p)
			}
			seen[p] = true
		}
	}
}
