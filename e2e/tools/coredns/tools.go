//go:build tools

// Package tools pins CoreDNS, the real node's cluster DNS (run as a pod, as in any cluster).
package tools

import _ "github.com/coredns/coredns"
