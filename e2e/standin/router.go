package standin

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
)

// Ray's default ports and the container port names KubeRay gives them.
const (
	dashboardPort     = 8265
	servePort         = 8000
	dashboardPortName = "dashboard"
	servePortName     = "serve"
	clusterDomain     = "cluster.local"
)

var (
	errUnknownHost = errors.New("no such host")
	errRefused     = errors.New("connection refused")
)

// podDirectory is what the kubelet knows about the pods it runs.
type podDirectory interface {
	podByIP(ip string) *podRuntime
	podByUID(uid string) *podRuntime
}

// router finds the emulated server behind a host:port, the way DNS and kube-proxy would: a
// Service name resolves to one of the ready pods its selector picks (through the port's
// targetPort), a pod IP to that pod. It never opens a connection.
type router struct {
	services corelisters.ServiceLister
	pods     corelisters.PodLister
	dir      podDirectory
}

// destination is where a request goes.
type destination struct {
	handler http.Handler
	pod     *podRuntime
	port    int
	byPodIP bool
}

// resolve routes hostport. namespace completes a bare Service name (a pod's own namespace); the
// loopback host means the caller's own pod (self).
func (rt *router) resolve(hostport, namespace string, self *podRuntime) (destination, error) {
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		host, portStr = hostport, "80"
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return destination{}, fmt.Errorf("%s: %w", hostport, errUnknownHost)
	}
	if host == "localhost" || strings.HasPrefix(host, "127.") {
		if self == nil {
			return destination{}, fmt.Errorf("%s: %w", hostport, errRefused)
		}
		return listening(self, port, false)
	}
	if ip := net.ParseIP(host); ip != nil {
		p := rt.dir.podByIP(ip.String())
		if p == nil {
			return destination{}, fmt.Errorf("%s: %w", hostport, errUnknownHost)
		}
		return listening(p, port, true)
	}
	svcName, ns, ok := splitServiceHost(host, namespace)
	if !ok {
		return destination{}, fmt.Errorf("%s: %w", hostport, errUnknownHost)
	}
	svc, err := rt.services.Services(ns).Get(svcName)
	if err != nil || len(svc.Spec.Selector) == 0 {
		return destination{}, fmt.Errorf("%s: %w", hostport, errUnknownHost)
	}
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if int(svc.Spec.Ports[i].Port) == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		return destination{}, fmt.Errorf("%s: %w", hostport, errRefused)
	}
	pods, err := rt.pods.Pods(ns).List(labels.SelectorFromSet(svc.Spec.Selector))
	if err != nil {
		return destination{}, fmt.Errorf("%s: %w", hostport, errRefused)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	for _, pod := range pods {
		p := rt.dir.podByUID(string(pod.UID))
		if p == nil || !p.ready() {
			continue
		}
		target, ok := targetPort(pod, sp)
		if !ok {
			continue
		}
		if d, err := listening(p, target, false); err == nil {
			return d, nil
		}
	}
	return destination{}, fmt.Errorf("%s: no ready endpoint: %w", hostport, errRefused)
}

// splitServiceHost reads <svc>.<ns>.svc.cluster.local, <svc>.<ns>.svc, <svc>.<ns> and, with a
// namespace to complete it, <svc>.
func splitServiceHost(host, namespace string) (name, ns string, ok bool) {
	host = strings.TrimSuffix(host, ".")
	host = strings.TrimSuffix(host, "."+clusterDomain)
	host = strings.TrimSuffix(host, ".svc")
	parts := strings.Split(host, ".")
	switch {
	case len(parts) == 2:
		return parts[0], parts[1], true
	case len(parts) == 1 && namespace != "":
		return parts[0], namespace, true
	}
	return "", "", false
}

// targetPort is the pod port a Service port sends to.
func targetPort(pod *corev1.Pod, sp *corev1.ServicePort) (int, bool) {
	switch {
	case sp.TargetPort.IntValue() != 0:
		return sp.TargetPort.IntValue(), true
	case sp.TargetPort.StrVal != "":
		for _, c := range pod.Spec.Containers {
			for _, cp := range c.Ports {
				if cp.Name == sp.TargetPort.StrVal {
					return int(cp.ContainerPort), true
				}
			}
		}
		return 0, false
	}
	return int(sp.Port), true
}

func listening(p *podRuntime, port int, byIP bool) (destination, error) {
	h := p.listener(port)
	if h == nil {
		return destination{}, fmt.Errorf("%s:%d: %w", p.ip, port, errRefused)
	}
	return destination{handler: h, pod: p, port: port, byPodIP: byIP}, nil
}

// rayPort is the port a Ray container declares under name, or Ray's default.
func rayPort(c *corev1.Container, name string, def int) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	return def
}
