package standin

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Namespace annotations the stand-in honours, for tests that need pods to stay as they were
// before there was a kubelet (or to start later, like a slow image pull).
const (
	// AnnotationStart "never" leaves the namespace's pods Pending, unbound, as without a kubelet.
	AnnotationStart = "standin.raysync.dev/start"
	// AnnotationStartDelay overrides the start delay for the namespace's pods (a Go duration).
	AnnotationStartDelay = "standin.raysync.dev/start-delay"
)

// Config is how the stand-in behaves. Durations of the real thing are in brackets.
type Config struct {
	NodeName string
	// StartDelay is how long a pod waits before the kubelet binds it and creates its containers
	// (scheduling plus image pull).
	StartDelay time.Duration
	// Backoff is the kubelet's restart back-off base [10s]; it doubles up to 30 times this.
	Backoff time.Duration
	// GCSRetry is how often wait-gcs-ready polls the head [5s].
	GCSRetry time.Duration
	// JoinTimeout is how long a worker's raylet waits for a head that is not up yet [~60s].
	JoinTimeout time.Duration
	// ServeDeployDelay is how long a Serve application stays DEPLOYING.
	ServeDeployDelay time.Duration
	// JobPending and JobDuration: a Ray job is PENDING, then RUNNING, then SUCCEEDED.
	JobPending, JobDuration time.Duration
	// PrivateRegistry is the registry host whose images need pull credentials.
	PrivateRegistry string
	// Real runs the pods of namespaces annotated AnnotationRay=real as real processes (zero: never).
	Real RealConfig
}

// Kubelet runs Ray pods on one emulated Node.
type Kubelet struct {
	cfg     Config
	kube    kubernetes.Interface
	fp      *Fingerprinter
	stats   *stats
	router  *router
	objects objectSource
	log     *slog.Logger
	nsl     corelisters.NamespaceLister
	// events records the kubelet's Events (source component "kubelet", as the real one's).
	events      record.EventRecorder
	broadcaster record.EventBroadcaster

	real *realRuntime  // nil: no real processes
	stop chan struct{} // closed by Close: the secret reflectors end

	mu    sync.Mutex
	pods  map[types.UID]*podRuntime
	byIP  map[string]*podRuntime
	heads map[clusterKey]*head
	ips   ipam
}

// NewKubelet wires a kubelet to the informers of factory (which the caller starts).
func NewKubelet(cfg Config, kube kubernetes.Interface, factory informers.SharedInformerFactory, fp *Fingerprinter, log *slog.Logger) (*Kubelet, error) {
	k := &Kubelet{cfg: cfg, kube: kube, fp: fp, stats: newStats(), objects: liveObjects{kube}, log: log,
		pods: map[types.UID]*podRuntime{}, byIP: map[string]*podRuntime{}, heads: map[clusterKey]*head{}}
	real, err := newRealRuntime(cfg.Real)
	if err != nil {
		return nil, fmt.Errorf("real Ray: %w", err)
	}
	k.real = real
	k.broadcaster = record.NewBroadcaster()
	k.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	k.events = k.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.NodeName})
	core := factory.Core().V1()
	k.nsl = core.Namespaces().Lister()
	k.stop = make(chan struct{})
	k.objects = newWatchedSecrets(kube, k.nsl, k.stop)
	k.router = &router{services: core.Services().Lister(), pods: core.Pods().Lister(), dir: k}
	if k.real != nil {
		go k.writeClientHosts()
	}
	_, err = core.Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { k.observe(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { k.observe(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				k.terminate(pod.UID, false)
			}
		},
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// observe admits a pod, or finishes it once it is being deleted.
func (k *Kubelet) observe(pod *corev1.Pod) {
	if pod.DeletionTimestamp != nil {
		k.terminate(pod.UID, true)
		return
	}
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != k.cfg.NodeName {
		return // another node's (there is none; someone bound it by hand)
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	role := roleOf(pod)
	if role == "" {
		return
	}
	k.mu.Lock()
	_, known := k.pods[pod.UID]
	k.mu.Unlock()
	if known {
		return
	}
	delay, start, real := k.namespaceOptions(pod.Namespace)
	if !start {
		return
	}
	p := newPodRuntime(k, pod, role)
	p.wantsReal = real
	k.mu.Lock()
	if _, known := k.pods[pod.UID]; known {
		k.mu.Unlock()
		return
	}
	k.pods[pod.UID] = p
	k.mu.Unlock()
	go p.run(delay)
}

// namespaceOptions applies the namespace's annotations: when its pods start (start false: never),
// and whether they run real processes.
func (k *Kubelet) namespaceOptions(namespace string) (delay time.Duration, start, real bool) {
	ns, err := k.nsl.Get(namespace)
	if err != nil {
		// The pod's watch may deliver it before the namespace's: ask the API server.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if ns, err = k.kube.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{}); err != nil {
			return k.cfg.StartDelay, true, false
		}
	}
	if ns.Annotations[AnnotationStart] == "never" {
		return 0, false, false
	}
	real = ns.Annotations[AnnotationRay] == "real"
	if v, ok := ns.Annotations[AnnotationStartDelay]; ok {
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			return d, true, real
		}
		k.log.Warn("ignoring an invalid start delay", "namespace", namespace, "annotation", AnnotationStartDelay)
	}
	return k.cfg.StartDelay, true, real
}

// Close deletes the node network of real pods (their processes end with the stand-in) and flushes
// the Events.
func (k *Kubelet) Close() {
	close(k.stop)
	k.real.close()
	k.broadcaster.Shutdown()
}

// terminate stops a pod's containers; finalize then deletes the pod object for good, as the
// kubelet does at the end of a graceful deletion.
func (k *Kubelet) terminate(uid types.UID, finalize bool) {
	k.mu.Lock()
	p := k.pods[uid]
	k.mu.Unlock()
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.terminating {
		p.mu.Unlock()
		return
	}
	p.terminating = true
	for _, c := range append(append([]*containerRuntime{}, p.init...), p.main...) {
		if c.state.Running != nil {
			p.event(c, corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
		}
	}
	p.mu.Unlock()
	go func() {
		p.cancel()
		<-p.done
		p.mu.Lock()
		ip := p.ip
		p.mu.Unlock()
		k.mu.Lock()
		delete(k.pods, uid)
		if ip != "" && k.byIP[ip] == p {
			delete(k.byIP, ip)
			k.ips.release(ip)
		}
		k.mu.Unlock()
		if !finalize {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// The kubelet writes the pod's terminal status (containers terminated, phase Succeeded or
		// Failed) before it deletes the object.
		p.mu.Lock()
		v := p.view()
		v.terminal = true
		status := podStatus(v, p.conditions, time.Now())
		p.mu.Unlock()
		if v.bound {
			if err := k.writeStatus(ctx, p.pod, status); err != nil && !isGone(err) {
				k.log.Warn("write terminal pod status", "pod", p.String(), "err", err)
			}
		}
		err := k.kube.CoreV1().Pods(p.pod.Namespace).Delete(ctx, p.pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &p.pod.UID}})
		if err != nil && !isGone(err) {
			k.log.Warn("finish pod deletion", "pod", p.String(), "err", err)
		}
	}()
}

func (k *Kubelet) bind(ctx context.Context, pod *corev1.Pod) error {
	if pod.Spec.NodeName == k.cfg.NodeName {
		return nil
	}
	return k.kube.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: k.cfg.NodeName},
	}, metav1.CreateOptions{})
}

func (k *Kubelet) writeStatus(ctx context.Context, pod *corev1.Pod, status corev1.PodStatus) error {
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = k.kube.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func (k *Kubelet) assignIP(p *podRuntime) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	ip := k.ips.next()
	k.byIP[ip] = p
	return ip
}

// claimIP gives p the IP it already has (a pod adopted after a restart of the stand-in).
func (k *Kubelet) claimIP(p *podRuntime, ip string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ips.claim(ip)
	k.byIP[ip] = p
	return ip
}

func (k *Kubelet) podByIP(ip string) *podRuntime {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.byIP[ip]
}

func (k *Kubelet) podByUID(uid string) *podRuntime {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.pods[types.UID(uid)]
}

func (k *Kubelet) pod(namespace, name string) *podRuntime {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.pods {
		if p.pod.Namespace == namespace && p.pod.Name == name {
			return p
		}
	}
	return nil
}

// registerHead makes h the head its cluster's workers reach (the newest head wins, as the head
// Service would select it).
func (k *Kubelet) registerHead(h *head) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.heads[h.cluster] = h
}

func (k *Kubelet) unregisterHead(h *head) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.heads[h.cluster] == h {
		delete(k.heads, h.cluster)
	}
}

func (k *Kubelet) headOf(c clusterKey) *head {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.heads[c]
}

// liveObjects reads Secrets and ConfigMaps from the API server at the moment a container is
// created, as the kubelet hands a container the values current at its creation.
type liveObjects struct{ kube kubernetes.Interface }

func (l liveObjects) Secret(ctx context.Context, ns, name string) (*corev1.Secret, error) {
	return l.kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
}

func (l liveObjects) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return l.kube.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
}

func isGone(err error) bool { return apierrors.IsNotFound(err) || apierrors.IsConflict(err) }
