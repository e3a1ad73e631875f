package standin

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerRuntime is one container of a pod the stand-in runs.
type containerRuntime struct {
	spec  *corev1.Container
	index int // in spec.containers or spec.initContainers
	init  bool

	// Guarded by the pod's mutex.
	state, last  corev1.ContainerState
	ready        bool
	restarts     int
	failures     int // consecutive failed runs (back-off exponent)
	pullFailures int
	id           string
	fingerprint  string // of the RAY_AUTH_TOKEN of the current run
	pid          int    // a real container's sandbox, while it runs
	logPath      string // a real container's current log
}

func waiting(reason, msg string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
}

// runInit runs an init container until it succeeds (false: the pod failed or is going away).
func (p *podRuntime) runInit(c *containerRuntime) bool {
	for {
		code, ok := p.runOnce(c)
		if !ok {
			return false
		}
		if code == 0 {
			return true
		}
		if p.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			p.mu.Lock()
			p.initFailed = true
			p.mu.Unlock()
			p.changed()
			return false
		}
		if !p.backOff(c) {
			return false
		}
	}
}

// keepRunning runs a container, restarting it as its pod's restart policy says.
func (p *podRuntime) keepRunning(c *containerRuntime) {
	for {
		code, ok := p.runOnce(c)
		if !ok {
			return
		}
		switch p.pod.Spec.RestartPolicy {
		case corev1.RestartPolicyNever:
			return
		case corev1.RestartPolicyOnFailure:
			if code == 0 {
				return
			}
		}
		if !p.backOff(c) {
			return
		}
	}
}

// backOff waits before a restart, in CrashLoopBackOff, doubling each time up to 30 times the base
// (the kubelet's 10 s .. 5 min).
func (p *podRuntime) backOff(c *containerRuntime) bool {
	p.mu.Lock()
	c.failures++
	delay := backoffDelay(p.k.cfg.Backoff, c.failures)
	last := c.state
	c.state, c.last = waiting("CrashLoopBackOff", fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", delay, c.spec.Name, p.pod.Name)), last
	c.ready = false
	p.mu.Unlock()
	p.changed()
	if !sleep(p.ctx, delay) {
		return false
	}
	p.mu.Lock()
	c.restarts++
	p.mu.Unlock()
	if p.cluster.name != "" {
		p.k.stats.restart(p.cluster)
	}
	return true
}

func backoffDelay(base time.Duration, failures int) time.Duration {
	d := base
	for i := 1; i < failures && d < 30*base; i++ {
		d *= 2
	}
	return min(d, 30*base)
}

// runOnce creates and runs a container once: pull its image, resolve its env, start it, wait for
// its process to exit. ok is false when the pod is going away.
func (p *podRuntime) runOnce(c *containerRuntime) (code int, ok bool) {
	for {
		err := pullImage(p.ctx, p.k.objects, p.pod, c.spec.Image, p.k.cfg.PrivateRegistry)
		if err == nil {
			break
		}
		p.mu.Lock()
		c.pullFailures++
		delay := backoffDelay(p.k.cfg.Backoff, c.pullFailures)
		c.state = waiting("ErrImagePull", err.Error())
		p.mu.Unlock()
		p.changed()
		if !sleep(p.ctx, min(delay, p.k.cfg.Backoff)) {
			return 0, false
		}
		p.mu.Lock()
		c.state = waiting("ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", c.spec.Image))
		p.mu.Unlock()
		p.changed()
		if !sleep(p.ctx, delay) {
			return 0, false
		}
	}
	var env map[string]string
	for {
		p.mu.Lock()
		net := podNetwork{podIP: p.ip, hostIP: nodeIP}
		p.mu.Unlock()
		var err error
		if env, err = resolveEnv(p.ctx, p.k.objects, p.pod, c.spec, net); err == nil {
			break
		}
		if p.ctx.Err() != nil {
			return 0, false
		}
		p.mu.Lock()
		c.state = waiting("CreateContainerConfigError", err.Error())
		p.mu.Unlock()
		p.changed()
		if !sleep(p.ctx, p.k.cfg.Backoff) {
			return 0, false
		}
	}
	auth, hasToken := rayAuthFromEnv(p.k.fp, env)
	started := time.Now()
	p.mu.Lock()
	c.id = fmt.Sprintf("standin://%s/%s/%d", p.pod.UID, c.spec.Name, c.restarts)
	c.fingerprint = ""
	if hasToken {
		c.fingerprint = auth.token.Fingerprint()
	}
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}}
	c.ready = p.real == nil && kindOf(p, c) == kindPlain
	restarts := c.restarts
	p.mu.Unlock()
	p.k.stats.started(ContainerStart{Namespace: p.pod.Namespace, Pod: p.pod.Name, PodUID: string(p.pod.UID),
		Cluster: p.cluster.name, NodeType: p.role, Container: c.spec.Name, Init: c.init, RestartCount: restarts,
		StartedAt: started, TokenFingerprint: c.fingerprint})
	p.changed()

	var reason string
	if p.real != nil {
		code, reason = p.runReal(c, env)
	} else {
		code, reason = p.execute(c, env, auth, hasToken)
	}
	if p.ctx.Err() != nil {
		return 0, false
	}
	p.mu.Lock()
	if time.Since(started) > 60*p.k.cfg.Backoff {
		c.failures = 0 // ran long enough: the kubelet forgets the back-off
	}
	c.ready = false
	c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason,
		StartedAt: metav1.NewTime(started), FinishedAt: metav1.Now(), ContainerID: c.id}}
	p.mu.Unlock()
	p.changed()
	return code, true
}

// setReady marks a running container ready (a Ray process that joined its cluster).
func (p *podRuntime) setReady(c *containerRuntime) {
	p.mu.Lock()
	c.ready = c.state.Running != nil
	p.mu.Unlock()
	p.changed()
}
