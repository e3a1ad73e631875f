//go:build tools

// Package tools pins containerd 2 for the real node (kubelet 1.37 expects containerd 2.x): the daemon,
// its runc shim and ctr. A module of its own, so its dependencies never meet Kubernetes' pins.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
