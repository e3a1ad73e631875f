//go:build tools

// Package tools pins the Kubernetes control-plane binaries the e2e harness builds.
// It is a module of its own so k8s.io/kubernetes' replace directives never reach raysync's go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
