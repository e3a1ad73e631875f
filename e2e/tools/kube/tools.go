//go:build tools

// Package tools pins the Kubernetes binaries the e2e harness builds: the control plane, and the
// kubelet, kube-proxy and kube-scheduler of the real node (e2e/realnode), all from one source.
// It is a module of its own so k8s.io/kubernetes' replace directives never reach raysync's go.mod.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
