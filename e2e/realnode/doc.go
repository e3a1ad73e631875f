// Package realnode holds the e2e tests that run on the real node (TestRealNode…): kubelet,
// kube-proxy and containerd in namespaces of their own beside a local control plane
// (e2e/framework/realnode.go), its supervisor in ./supervisor and its pause image in ./pause.
package realnode
