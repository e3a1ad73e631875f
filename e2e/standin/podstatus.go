package standin

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerView is one container as the status writer sees it.
type containerView struct {
	name, image, id string
	init            bool
	state, last     corev1.ContainerState
	ready           bool
	restarts        int
}

// podView is a pod as the status writer sees it.
type podView struct {
	bound          bool
	sandbox        bool // the pod's sandbox is ready (PodReadyToStartContainers)
	terminal       bool // the pod is being deleted and its containers have stopped
	podIP, hostIP  string
	startTime      time.Time
	initDone       bool
	initFailed     bool // an init container failed and the restart policy says never again
	restartPolicy  corev1.RestartPolicy
	initContainers []containerView
	containers     []containerView
}

// podPhase follows the kubelet's getPhase: a container waiting without ever having run keeps the
// pod Pending; a container waiting to restart counts as stopped.
func podPhase(v podView) corev1.PodPhase {
	if v.initFailed {
		return corev1.PodFailed
	}
	if !v.initDone {
		return corev1.PodPending
	}
	var running, stopped, succeeded, waiting int
	for _, c := range v.containers {
		switch {
		case c.state.Running != nil:
			running++
		case c.state.Terminated != nil:
			stopped++
			if c.state.Terminated.ExitCode == 0 {
				succeeded++
			}
		case c.last.Terminated != nil:
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0 && v.terminal && stopped == succeeded:
		return corev1.PodSucceeded // a deleted pod's containers will not restart
	case stopped > 0 && v.terminal:
		return corev1.PodFailed
	case stopped > 0 && v.restartPolicy == corev1.RestartPolicyAlways:
		return corev1.PodRunning
	case stopped > 0 && stopped == succeeded:
		return corev1.PodSucceeded
	case stopped > 0 && v.restartPolicy == corev1.RestartPolicyNever:
		return corev1.PodFailed
	case stopped > 0:
		return corev1.PodRunning // OnFailure: restarting
	}
	return corev1.PodPending
}

// podConditions computes the conditions the kubelet sets; a condition keeps its transition time
// while its status does not change.
func podConditions(v podView, phase corev1.PodPhase, prev []corev1.PodCondition, now time.Time) []corev1.PodCondition {
	cond := func(t corev1.PodConditionType, ok bool, reason string, notReady []string) corev1.PodCondition {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionTrue}
		if !ok {
			c.Status, c.Reason = corev1.ConditionFalse, reason
			if len(notReady) > 0 {
				c.Message = fmt.Sprintf("containers with %s status: [%s]", map[bool]string{true: "incomplete", false: "unready"}[t == corev1.PodInitialized], strings.Join(notReady, " "))
			}
		}
		c.LastTransitionTime = metav1.NewTime(now)
		for _, p := range prev {
			if p.Type == t && p.Status == c.Status {
				c.LastTransitionTime = p.LastTransitionTime
			}
		}
		return c
	}
	var incomplete, unready []string
	if !v.initDone {
		for _, c := range v.initContainers {
			if c.state.Terminated == nil || c.state.Terminated.ExitCode != 0 {
				incomplete = append(incomplete, c.name)
			}
		}
	}
	for _, c := range v.containers {
		if !c.ready {
			unready = append(unready, c.name)
		}
	}
	terminal := phase == corev1.PodSucceeded || phase == corev1.PodFailed
	readyReason := "ContainersNotReady"
	if terminal {
		readyReason = "PodCompleted"
	}
	ready := len(unready) == 0 && v.initDone && !terminal
	return []corev1.PodCondition{
		cond(corev1.PodReadyToStartContainers, v.sandbox && !terminal, "", nil),
		cond(corev1.PodInitialized, v.initDone, "ContainersNotInitialized", incomplete),
		cond(corev1.PodReady, ready, readyReason, unready),
		cond(corev1.ContainersReady, ready, readyReason, unready),
		cond(corev1.PodScheduled, v.bound, "Unschedulable", nil),
	}
}

// podStatus is the whole status the stand-in writes through pods/status.
func podStatus(v podView, prev []corev1.PodCondition, now time.Time) corev1.PodStatus {
	phase := podPhase(v)
	s := corev1.PodStatus{
		Phase:                 phase,
		Conditions:            podConditions(v, phase, prev, now),
		HostIP:                v.hostIP,
		PodIP:                 v.podIP,
		InitContainerStatuses: containerStatuses(v.initContainers),
		ContainerStatuses:     containerStatuses(v.containers),
	}
	if v.hostIP != "" {
		s.HostIPs = []corev1.HostIP{{IP: v.hostIP}}
	}
	if v.podIP != "" {
		s.PodIPs = []corev1.PodIP{{IP: v.podIP}}
	}
	if !v.startTime.IsZero() {
		t := metav1.NewTime(v.startTime)
		s.StartTime = &t
	}
	return s
}

func containerStatuses(cs []containerView) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, 0, len(cs))
	for _, c := range cs {
		started := c.state.Running != nil
		st := corev1.ContainerStatus{Name: c.name, Image: c.image, State: c.state, LastTerminationState: c.last,
			Ready: c.ready, RestartCount: int32(c.restarts), Started: &started, ContainerID: c.id}
		if c.id != "" {
			st.ImageID = "standin://" + c.image
		}
		out = append(out, st)
	}
	return out
}
