package standin

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The Node's address and the pods' range: RFC 2544 benchmarking addresses, valid for Endpoints and
// EndpointSlices (loopback is not), never routed anywhere and never dialled: they are data.
const (
	nodeIP    = "198.18.0.1"
	podPrefix = "198.19."
)

// ipam hands out pod IPs from 198.19.0.0/16.
type ipam struct {
	last  int
	inUse map[string]bool
}

func (a *ipam) next() string {
	if a.inUse == nil {
		a.inUse = map[string]bool{}
	}
	for {
		a.last = a.last%(1<<16-2) + 1
		ip := fmt.Sprintf("%s%d.%d", podPrefix, a.last>>8, a.last&0xff)
		if !a.inUse[ip] && !strings.HasSuffix(ip, ".0") && !strings.HasSuffix(ip, ".255") {
			a.inUse[ip] = true
			return ip
		}
	}
}

func (a *ipam) release(ip string) { delete(a.inUse, ip) }

// claim marks ip as taken (a pod that already has it).
func (a *ipam) claim(ip string) {
	if a.inUse == nil {
		a.inUse = map[string]bool{}
	}
	a.inUse[ip] = true
}

// RegisterNode creates (or refreshes) the one Node pods are bound to: the EndpointSlice controller
// leaves out endpoints whose pod's Node does not exist.
func (k *Kubelet) RegisterNode(ctx context.Context) error {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: k.cfg.NodeName, Labels: map[string]string{
		"kubernetes.io/hostname": k.cfg.NodeName, "kubernetes.io/os": "linux", "node.kubernetes.io/standin": "true"}}}
	cur, err := k.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, err = k.kube.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("register node %s: %w", k.cfg.NodeName, err)
	}
	now := metav1.Now()
	cur.Status = corev1.NodeStatus{
		Phase:       corev1.NodeRunning,
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: nodeIP}, {Type: corev1.NodeHostName, Address: k.cfg.NodeName}},
		Capacity:    nodeCapacity(),
		Allocatable: nodeCapacity(),
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "the raysync kubelet stand-in is running", LastHeartbeatTime: now, LastTransitionTime: now}},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "standin", OperatingSystem: "linux", Architecture: "amd64"},
	}
	if _, err := k.kube.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("node %s status: %w", k.cfg.NodeName, err)
	}
	return nil
}

func nodeCapacity() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("1000"),
		corev1.ResourceMemory: resource.MustParse("4Ti"),
		corev1.ResourcePods:   resource.MustParse("100000"),
	}
}
