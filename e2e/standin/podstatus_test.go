package standin

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func running() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
}

func exited(code int32) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}
}

func TestPodPhaseFollowsTheKubelet(t *testing.T) {
	ray := func(state, last corev1.ContainerState, ready bool) containerView {
		return containerView{name: "ray", state: state, last: last, ready: ready}
	}
	none := corev1.ContainerState{}
	tests := map[string]struct {
		v    podView
		want corev1.PodPhase
	}{
		"init not done": {podView{restartPolicy: corev1.RestartPolicyAlways, containers: []containerView{ray(waiting("PodInitializing", ""), none, false)}}, corev1.PodPending},
		"config error":  {podView{initDone: true, restartPolicy: corev1.RestartPolicyAlways, containers: []containerView{ray(waiting("CreateContainerConfigError", ""), none, false)}}, corev1.PodPending},
		"running":       {podView{initDone: true, restartPolicy: corev1.RestartPolicyAlways, containers: []containerView{ray(running(), none, true)}}, corev1.PodRunning},
		"crash looping": {podView{initDone: true, restartPolicy: corev1.RestartPolicyAlways, containers: []containerView{ray(waiting("CrashLoopBackOff", ""), exited(1), false)}}, corev1.PodRunning},
		"one crash looping, one pulling": {podView{initDone: true, restartPolicy: corev1.RestartPolicyAlways, containers: []containerView{
			ray(waiting("CrashLoopBackOff", ""), exited(1), false), {name: "side", state: waiting("ErrImagePull", "")}}}, corev1.PodPending},
		"submitter succeeded":  {podView{initDone: true, restartPolicy: corev1.RestartPolicyNever, containers: []containerView{ray(exited(0), none, false)}}, corev1.PodSucceeded},
		"submitter failed":     {podView{initDone: true, restartPolicy: corev1.RestartPolicyNever, containers: []containerView{ray(exited(1), none, false)}}, corev1.PodFailed},
		"OnFailure restarting": {podView{initDone: true, restartPolicy: corev1.RestartPolicyOnFailure, containers: []containerView{ray(exited(1), none, false)}}, corev1.PodRunning},
		"init failed, Never":   {podView{initFailed: true, restartPolicy: corev1.RestartPolicyNever}, corev1.PodFailed},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := podPhase(tc.v); got != tc.want {
				t.Errorf("podPhase = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPodStatusConditionsAndAddresses(t *testing.T) {
	t0 := time.Unix(1000, 0)
	v := podView{bound: true, podIP: "198.19.0.7", hostIP: nodeIP, startTime: t0, restartPolicy: corev1.RestartPolicyAlways,
		initContainers: []containerView{{name: waitGCSReady, state: running()}},
		containers:     []containerView{{name: "ray-worker", state: waiting("PodInitializing", "")}}}
	s := podStatus(v, nil, t0)
	cond := func(s corev1.PodStatus, typ corev1.PodConditionType) corev1.PodCondition {
		for _, c := range s.Conditions {
			if c.Type == typ {
				return c
			}
		}
		t.Fatalf("no %s condition", typ)
		return corev1.PodCondition{}
	}
	if s.Phase != corev1.PodPending || s.PodIP != "198.19.0.7" || s.PodIPs[0].IP != "198.19.0.7" || s.HostIP != nodeIP || s.StartTime == nil {
		t.Errorf("status: %+v", s)
	}
	if c := cond(s, corev1.PodInitialized); c.Status != corev1.ConditionFalse || c.Message != "containers with incomplete status: [wait-gcs-ready]" {
		t.Errorf("Initialized: %+v", c)
	}
	if c := cond(s, corev1.PodScheduled); c.Status != corev1.ConditionTrue {
		t.Errorf("PodScheduled: %+v", c)
	}

	v.initDone = true
	v.initContainers[0].state = exited(0)
	v.containers[0].state, v.containers[0].ready = running(), true
	later := podStatus(v, s.Conditions, t0.Add(time.Minute))
	if later.Phase != corev1.PodRunning {
		t.Errorf("phase %s", later.Phase)
	}
	for _, typ := range []corev1.PodConditionType{corev1.PodReady, corev1.ContainersReady, corev1.PodInitialized} {
		if c := cond(later, typ); c.Status != corev1.ConditionTrue || !c.LastTransitionTime.Equal(&metav1.Time{Time: t0.Add(time.Minute)}) {
			t.Errorf("%s: %+v", typ, c)
		}
	}
	if c := cond(later, corev1.PodScheduled); !c.LastTransitionTime.Equal(&metav1.Time{Time: t0}) {
		t.Errorf("PodScheduled moved its transition time without changing: %+v", c)
	}
	if st := later.ContainerStatuses[0]; !st.Ready || st.Started == nil || !*st.Started {
		t.Errorf("container status: %+v", st)
	}
}
