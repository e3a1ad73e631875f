package standin

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Pod roles the stand-in runs.
const (
	roleHead      = "head"
	roleWorker    = "worker"
	roleSubmitter = "submitter"
)

// podRuntime runs one pod: it binds it, runs its containers as the kubelet would, and publishes
// their state through pods/status.
type podRuntime struct {
	k       *Kubelet
	pod     *corev1.Pod // as admitted: a pod's spec never changes
	role    string
	cluster clusterKey // ray.io/cluster (empty for submitters)
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{} // closed when every goroutine of the pod has returned
	dirty   chan struct{} // the status needs writing

	mu          sync.Mutex
	bound       bool
	sandbox     bool // the pod's network and files are set up (PodReadyToStartContainers)
	ip          string
	startTime   time.Time
	initDone    bool
	initFailed  bool
	terminating bool
	init        []*containerRuntime
	main        []*containerRuntime
	conditions  []corev1.PodCondition
	head        *head // while this pod's Ray head runs
	// wantsReal: its namespace runs real processes; real is their pod's namespace and files.
	wantsReal bool
	real      *realPod
}

func newPodRuntime(k *Kubelet, pod *corev1.Pod, role string) *podRuntime {
	ctx, cancel := context.WithCancel(context.Background())
	p := &podRuntime{k: k, pod: pod.DeepCopy(), role: role, ctx: ctx, cancel: cancel,
		done: make(chan struct{}), dirty: make(chan struct{}, 1),
		cluster: clusterKey{pod.Namespace, pod.Labels[labelCluster]}}
	for i := range p.pod.Spec.InitContainers {
		p.init = append(p.init, &containerRuntime{spec: &p.pod.Spec.InitContainers[i], index: i, init: true,
			state: waiting("PodInitializing", "")})
	}
	for i := range p.pod.Spec.Containers {
		p.main = append(p.main, &containerRuntime{spec: &p.pod.Spec.Containers[i], index: i,
			state: waiting("PodInitializing", "")})
	}
	return p
}

func (p *podRuntime) String() string { return p.pod.Namespace + "/" + p.pod.Name }

// run is the pod's life: wait the start delay, bind, run init containers in order, then the
// containers side by side until they end for good or the pod is deleted.
func (p *podRuntime) run(delay time.Duration) {
	var wg sync.WaitGroup
	defer func() { wg.Wait(); close(p.done) }()
	if !sleep(p.ctx, delay) {
		return
	}
	if err := p.k.bind(p.ctx, p.pod); err != nil {
		if !isGone(err) && p.ctx.Err() == nil { // a pod deleted before it was bound is no error
			p.k.log.Error("bind pod", "pod", p.String(), "err", err)
		}
		return
	}
	p.mu.Lock()
	p.bound, p.startTime = true, time.Now()
	if adopted := p.pod.Status.PodIP != ""; adopted {
		// A pod this Node ran before the stand-in restarted: like a rebooted node, it keeps its IP and
		// start time, and its containers run again, counted as restarts.
		p.ip = p.k.claimIP(p, p.pod.Status.PodIP)
		if st := p.pod.Status.StartTime; st != nil {
			p.startTime = st.Time
		}
		p.adoptRestartCounts()
	} else {
		p.ip = p.k.assignIP(p)
	}
	if len(p.init) == 0 {
		// With init containers, the kubelet says PodInitializing until it creates the containers.
		for _, c := range p.main {
			c.state = waiting("ContainerCreating", "")
		}
	}
	p.mu.Unlock()
	wg.Add(1)
	go func() { defer wg.Done(); p.writeStatusLoop() }()
	p.changed()
	if p.wantsReal && !p.setUpReal() {
		return
	}
	p.mu.Lock()
	p.sandbox = true
	p.mu.Unlock()
	p.changed()

	for _, c := range p.init {
		if c.spec.RestartPolicy != nil && *c.spec.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			wg.Add(1) // a sidecar: it keeps running next to the containers
			go func() { defer wg.Done(); p.keepRunning(c) }()
			continue
		}
		if !p.runInit(c) {
			return
		}
	}
	p.mu.Lock()
	p.initDone = true
	p.mu.Unlock()
	p.changed()
	for _, c := range p.main {
		wg.Add(1)
		go func() { defer wg.Done(); p.keepRunning(c) }()
	}
}

// adoptRestartCounts carries on the restart counts of the pod's last status: containers that had
// started once run again, so that is one restart more.
func (p *podRuntime) adoptRestartCounts() {
	prev := map[string]corev1.ContainerStatus{}
	for _, st := range append(append([]corev1.ContainerStatus{}, p.pod.Status.InitContainerStatuses...), p.pod.Status.ContainerStatuses...) {
		prev[st.Name] = st
	}
	for _, c := range append(append([]*containerRuntime{}, p.init...), p.main...) {
		if st, ok := prev[c.spec.Name]; ok {
			c.restarts = int(st.RestartCount)
			if st.State.Running != nil || st.State.Terminated != nil || st.LastTerminationState.Terminated != nil {
				c.restarts++
			}
		}
	}
}

// event records one of the kubelet's Events about the pod, or about its container c (nil: the pod).
func (p *podRuntime) event(c *containerRuntime, eventType, reason, format string, args ...any) {
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.pod.Namespace, Name: p.pod.Name, UID: p.pod.UID}
	if c != nil {
		ref.FieldPath = fmt.Sprintf("spec.containers{%s}", c.spec.Name)
		if c.init {
			ref.FieldPath = fmt.Sprintf("spec.initContainers{%s}", c.spec.Name)
		}
	}
	p.k.events.Eventf(ref, eventType, reason, format, args...)
}

// changed asks the status writer to publish the pod's state.
func (p *podRuntime) changed() {
	select {
	case p.dirty <- struct{}{}:
	default:
	}
}

func (p *podRuntime) view() podView {
	v := podView{bound: p.bound, sandbox: p.sandbox, podIP: p.ip, startTime: p.startTime, initDone: p.initDone || len(p.init) == 0,
		initFailed: p.initFailed, restartPolicy: p.pod.Spec.RestartPolicy}
	if p.bound {
		v.hostIP = nodeIP
	}
	for _, c := range p.init {
		v.initContainers = append(v.initContainers, c.view())
	}
	for _, c := range p.main {
		v.containers = append(v.containers, c.view())
	}
	return v
}

func (c *containerRuntime) view() containerView {
	return containerView{name: c.spec.Name, image: c.spec.Image, id: c.id, init: c.init, state: c.state, last: c.last,
		ready: c.ready, restarts: c.restarts}
}

// writeStatusLoop publishes the latest state whenever it changed, one write at a time.
func (p *podRuntime) writeStatusLoop() {
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-p.dirty:
		}
		p.mu.Lock()
		status := podStatus(p.view(), p.conditions, time.Now())
		p.conditions = status.Conditions
		p.mu.Unlock()
		for p.ctx.Err() == nil {
			err := p.k.writeStatus(p.ctx, p.pod, status)
			if err == nil || isGone(err) {
				break
			}
			p.k.log.Warn("write pod status", "pod", p.String(), "err", err)
			sleep(p.ctx, 200*time.Millisecond)
		}
	}
}

// ready reports whether every container is ready (the pod would be an endpoint).
func (p *podRuntime) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.bound || p.terminating {
		return false
	}
	for _, c := range p.main {
		if !c.ready {
			return false
		}
	}
	return true
}

// listener is what answers on port of this pod's IP (nil: connection refused).
func (p *podRuntime) listener(port int) http.Handler {
	if p.real != nil {
		return p.realListener(port)
	}
	ray := &p.pod.Spec.Containers[0]
	p.mu.Lock()
	h, running := p.head, len(p.main) > 0 && p.main[0].state.Running != nil
	p.mu.Unlock()
	switch {
	case h != nil && port == rayPort(ray, dashboardPortName, dashboardPort):
		return h.handler
	case running && p.role != roleSubmitter && port == rayPort(ray, servePortName, servePort):
		// Serve runs a proxy on every node once an application was deployed.
		if ch := p.k.headOf(p.cluster); ch != nil && ch.serve.running() {
			return serveProxy(ch.serve, p.cluster.name, time.Now)
		}
	}
	return nil
}

// report is the pod as the JSON endpoint shows it.
func (p *podRuntime) report() PodReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := PodReport{Namespace: p.pod.Namespace, Name: p.pod.Name, UID: string(p.pod.UID), IP: p.ip, Phase: string(podPhase(p.view()))}
	for _, c := range append(append([]*containerRuntime{}, p.init...), p.main...) {
		cr := ContainerReport{Name: c.spec.Name, Init: c.init, RestartCount: c.restarts, Log: c.logPath}
		switch {
		case c.state.Running != nil:
			cr.State, cr.TokenFingerprint = "running", c.fingerprint
		case c.state.Terminated != nil:
			cr.State, cr.Reason, cr.TokenFingerprint = "terminated", c.state.Terminated.Reason, c.fingerprint
		case c.state.Waiting != nil:
			cr.State, cr.Reason = "waiting", c.state.Waiting.Reason
		}
		r.Containers = append(r.Containers, cr)
	}
	return r
}

// sleep waits d, or less if ctx ends (false then).
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
