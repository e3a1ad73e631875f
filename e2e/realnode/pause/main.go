// Command pause is the real node's sandbox image (as Kubernetes' pause: sleep until told to stop,
// reap orphans) and the e2e tests' tiny workload image: `pause env NAME...` prints those variables
// first, `pause env -once NAME...` prints them and exits (for exec); `pause resolve NAME...` prints
// what the pod's DNS (its /etc/resolv.conf, written by the kubelet) answers for each name, and exits;
// `pause exit CODE` exits with CODE at once (a crashing container), `pause sleep DURATION` exits 0
// after DURATION (an init container that waits).
package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	args := os.Args[1:]
	if len(args) == 2 && args[0] == "exit" {
		code, err := strconv.Atoi(args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		os.Exit(code)
	}
	if len(args) == 2 && args[0] == "sleep" {
		d, err := time.ParseDuration(args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		time.Sleep(d)
		return
	}
	if len(args) > 0 && args[0] == "resolve" {
		failed := false
		for _, n := range args[1:] {
			addrs, err := net.LookupHost(n)
			if err != nil {
				failed = true
				fmt.Printf("%s: %v\n", n, err)
				continue
			}
			fmt.Printf("%s=%s\n", n, strings.Join(addrs, ","))
		}
		if failed {
			os.Exit(1)
		}
		return
	}
	if len(args) > 0 && args[0] == "env" {
		once := len(args) > 1 && args[1] == "-once"
		if once {
			args = args[1:]
		}
		for _, n := range args[1:] {
			fmt.Printf("%s=%s\n", n, os.Getenv(n))
		}
		if once {
			return
		}
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			return
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
