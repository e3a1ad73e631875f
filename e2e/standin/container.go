package standin

import (
	"fmt"
	"strings"
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

// backOff waits before a restart, in CrashLoopBackOff. As the kubelet's, the first restart is
// immediate; from the second failure on it waits, doubling each time up to 30 times the base (the
// kubelet's 10 s .. 5 min).
func (p *podRuntime) backOff(c *containerRuntime) bool {
	p.mu.Lock()
	c.failures++
	c.ready = false
	if c.failures > 1 {
		delay := backoffDelay(p.k.cfg.Backoff, c.failures-1)
		msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", delay, c.spec.Name, p.pod.Name)
		c.state, c.last = waiting("CrashLoopBackOff", msg), c.state
		p.event(c, corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s in pod %s_%s(%s)", c.spec.Name, p.pod.Name, p.pod.Namespace, p.pod.UID)
		p.mu.Unlock()
		p.changed()
		if !sleep(p.ctx, delay) {
			return false
		}
		p.mu.Lock()
	} else {
		c.last = c.state
	}
	c.restarts++
	p.mu.Unlock()
	if p.cluster.name != "" {
		p.k.stats.restart(p.cluster)
	}
	return p.ctx.Err() == nil
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
	if !p.pull(c) {
		return 0, false
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
		p.event(c, corev1.EventTypeWarning, "Failed", "Error: %v", err)
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
	// Ready at once unless something must say so: a Ray process that joins, a readiness probe.
	c.ready = !c.init && (p.real == nil && kindOf(p, c) == kindPlain || p.real != nil && c.spec.ReadinessProbe == nil)
	restarts := c.restarts
	p.event(c, corev1.EventTypeNormal, "Created", "Container created")
	p.event(c, corev1.EventTypeNormal, "Started", "Container started")
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
	p.mu.Lock()
	if time.Since(started) > 60*p.k.cfg.Backoff {
		c.failures = 0 // ran long enough: the kubelet forgets the back-off
	}
	// A completed init container is ready, as the kubelet reports it.
	c.ready = c.init && code == 0
	c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason,
		StartedAt: metav1.NewTime(started), FinishedAt: metav1.Now(), ContainerID: c.id}}
	p.mu.Unlock()
	if p.ctx.Err() != nil {
		return 0, false // stopped for the pod's deletion: its terminal status says how it ended
	}
	p.changed()
	return code, true
}

// pull "pulls" a container's image as the kubelet's image manager would, with its Events: an image
// of the private registry without credentials fails and backs off until the pod's pull Secrets
// hold them; any other image is present on the node unless the policy says Always. false: the pod
// is going away.
func (p *podRuntime) pull(c *containerRuntime) bool {
	image := c.spec.Image
	if c.spec.ImagePullPolicy != corev1.PullAlways && registryHost(image) != p.k.cfg.PrivateRegistry {
		p.event(c, corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine and can be accessed by the pod", image)
		return true
	}
	for {
		missing, err := pullImage(p.ctx, p.k.objects, p.pod, image, p.k.cfg.PrivateRegistry)
		if len(missing) > 0 {
			p.event(nil, corev1.EventTypeWarning, "FailedToRetrieveImagePullSecret",
				"Unable to retrieve some image pull secrets (%s); attempting to pull the image may not succeed.", strings.Join(missing, ", "))
		}
		p.event(c, corev1.EventTypeNormal, "Pulling", "Pulling image %q", image)
		if err == nil {
			p.event(c, corev1.EventTypeNormal, "Pulled", "Successfully pulled image %q", image)
			return true
		}
		p.event(c, corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %v", image, err)
		p.event(c, corev1.EventTypeWarning, "Failed", "Error: ErrImagePull")
		p.mu.Lock()
		c.pullFailures++
		delay := backoffDelay(p.k.cfg.Backoff, c.pullFailures)
		c.state = waiting("ErrImagePull", err.Error())
		p.mu.Unlock()
		p.changed()
		if !sleep(p.ctx, min(delay, p.k.cfg.Backoff)) {
			return false
		}
		p.event(c, corev1.EventTypeNormal, "BackOff", "Back-off pulling image %q", image)
		p.event(c, corev1.EventTypeWarning, "Failed", "Error: ImagePullBackOff")
		p.mu.Lock()
		c.state = waiting("ImagePullBackOff", fmt.Sprintf("Back-off pulling image %q", image))
		p.mu.Unlock()
		p.changed()
		if !sleep(p.ctx, delay) {
			return false
		}
	}
}

// setReady marks a running container ready (a Ray process that joined its cluster).
func (p *podRuntime) setReady(c *containerRuntime) {
	p.mu.Lock()
	c.ready = c.state.Running != nil
	p.mu.Unlock()
	p.changed()
}
