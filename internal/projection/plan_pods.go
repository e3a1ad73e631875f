package projection

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// planPodConfig makes a cluster's pod templates carry the pull secrets and the autoscaler's client
// certificate (creating the managed copies first), then deals with the pods created before that:
// never-started ones are recycled, running ones reported. A pod is immutable: only a new pod gets
// the fixed template.
func planPodConfig(in *ClusterInput, cfg Config, p *ClusterPlan) {
	rc := in.Cluster
	var states [4]string // room for the usual few pull secrets without allocating
	tc, pullStates, tlsState := podTemplateConfig(in, p, states[:0])
	autoscaling := podtemplate.Autoscaling(rc)

	check := in.drift
	if check == nil {
		check = podtemplate.Drift
	}
	d, err := check(rc, tc)
	if err != nil {
		p.warnOnce(in, names.ReasonInvalidSpec, fmt.Sprintf("raysync cannot read the pod templates: %v; leaving them alone", err))
		d = podtemplate.Missing{Pull: len(tc.PullSecrets) > 0, TLS: tc.TLS != nil}
	}
	for _, st := range pullStates {
		if st == names.StateInSync && d.Pull {
			st = names.StateOutOfSync
		}
		p.Status.PullSecret = worst(p.Status.PullSecret, st)
	}
	if tlsState == names.StateInSync && d.TLS {
		tlsState = names.StateOutOfSync
	}
	p.Status.AutoscalerTLS = tlsState
	if len(pullStates) > 0 {
		p.Status.StalePods[names.StalePullSecret] = 0
	}
	if tlsState != "" {
		p.Status.StalePods[names.StaleAutoscalerTLS] = 0
	}
	if err != nil {
		return
	}

	recycle := cfg.Pods.RecyclePending
	switch {
	case !d.Any():
		p.TemplatesInPlace = true
	case podtemplate.RecreateStrategy(rc) && !cfg.Pods.AllowRecreate && anyStarted(in.Pods):
		// A template change restarts every pod of a Recreate cluster: wait until none runs.
		p.Status.Deferred = true
		recycle = false
		p.warnOnce(in, names.ReasonTemplatePatchDeferred, "upgradeStrategy Recreate would restart every running pod to add raysync's pull secrets or autoscaler TLS; "+
			"not patching (start raysync with --allow-recreate to permit it)")
	default:
		desired, _, _ := podtemplate.Desired(rc, tc)
		patch, err := podtemplate.MergePatch(rc, desired)
		if err != nil {
			p.warnOnce(in, names.ReasonInvalidSpec, fmt.Sprintf("raysync cannot patch the pod templates: %v; leaving them alone", err))
			return
		}
		p.Actions = append(p.Actions, PatchCluster{Namespace: rc.GetNamespace(), Name: rc.GetName(), Patch: patch, Reapplied: in.Memory.templatesApplied})
		p.event(in, corev1.EventTypeNormal, names.ReasonTemplatePatched, "pod templates now carry raysync's pull secrets / autoscaler TLS")
		recycle = false // the pods are handled on the next pass, once the cache holds the patched template
	}
	planPods(in, tc, autoscaling, recycle, p)
}

// podTemplateConfig is what the cluster's pods must carry (the copies they name planned into p), and
// the state of each pull-secret copy (appended to pullStates) and of the TLS copy ("" when there is
// none to make).
func podTemplateConfig(in *ClusterInput, p *ClusterPlan, pullStates []string) (tc podtemplate.Config, _ []string, tlsState string) {
	usable := 0 // how many pull sources, in order, are usable
	for i, src := range in.Sources.pull {
		state := names.StateSourceInvalid
		if src.valid() {
			var ok bool
			if state, ok = planCopy(in, src, p); ok {
				if usable == i {
					usable++
				} else {
					tc.PullSecrets = append(tc.PullSecrets, src.name.Name)
				}
			}
		}
		pullStates = append(pullStates, state)
	}
	// The names of the first usable sources are the shared list's start; the rest were appended.
	if usable > 0 {
		tc.PullSecrets = append(slices.Clip(in.Sources.pullNames[:usable]), tc.PullSecrets...)
	}
	if src := in.Sources.tls; src != nil && podtemplate.Autoscaling(in.Cluster) {
		tlsState = names.StateSourceInvalid
		if src.valid() {
			var usable bool
			if tlsState, usable = planCopy(in, *src, p); usable {
				tc.TLS = src.template
			}
		}
	}
	return tc, pullStates, tlsState
}

// planPods recycles never-started pods that lack raysync's entries and reports started ones.
func planPods(in *ClusterInput, tc podtemplate.Config, autoscaling, recycle bool, p *ClusterPlan) {
	var stale [len(staleReasons)][]string // started pods' names, by what they lack
	for _, pod := range in.Pods {
		missing := podMissing(pod, tc, autoscaling)
		if missing == 0 || pod.DeletionTimestamp != nil {
			continue
		}
		if podStarted(pod) {
			for i, reason := range staleReasons {
				if missing.has(i) {
					p.Status.StalePods[reason]++
					stale[i] = append(stale[i], pod.Name)
				}
			}
			continue
		}
		if !recycle || !controlledBy(pod, in.Cluster.GetUID()) || (pod.Status.Phase != corev1.PodPending && pod.Status.Phase != "") {
			continue
		}
		if age := in.Now.Sub(pod.CreationTimestamp.Time); age < RecycleGrace {
			if wait := RecycleGrace - age; p.RequeueAfter == 0 || wait < p.RequeueAfter {
				p.RequeueAfter = wait
			}
			continue
		}
		p.Actions = append(p.Actions, DeletePod{Pod: pod, Missing: missing.reasons()})
		p.event(in, corev1.EventTypeNormal, names.ReasonPodRecycled, fmt.Sprintf(
			"deleted pending pod %s (missing %s, containers never started) so KubeRay recreates it from the fixed template", pod.Name, strings.Join(missing.reasons(), ", ")))
	}
	if in.reportOnly {
		return
	}
	for i, reason := range staleReasons {
		pods := stale[i]
		key, list := staleEventKeys[i], strings.Join(pods, ",")
		if len(pods) == 0 || in.Memory.warned[key] == list {
			continue
		}
		before := strings.Split(in.Memory.warned[key], ",")
		fresh := 0
		for _, name := range pods {
			if !slices.Contains(before, name) {
				fresh++
			}
		}
		p.Actions = append(p.Actions, RecordEvent{Object: in.Cluster, Type: corev1.EventTypeWarning, Reason: names.ReasonStalePodConfig,
			Message:  fmt.Sprintf("%d running Ray pod(s) (e.g. %s) lack raysync's %s; they are not deleted and pick it up when restarted", len(pods), pods[0], reason),
			DedupKey: key, DedupValue: list, StartedWithout: fresh, StaleReason: reason})
	}
}

// staleReasons are what a Ray pod can lack, in the order events and DeletePod.Missing name them;
// staleEventKeys their Events' dedup keys.
var (
	staleReasons   = [...]string{names.StalePullSecret, names.StaleAutoscalerTLS}
	staleEventKeys = [...]string{names.ReasonStalePodConfig + "/" + names.StalePullSecret, names.ReasonStalePodConfig + "/" + names.StaleAutoscalerTLS}
)

// missingEntries is a set of staleReasons, by index (a bit set: a pod checked on every scrape
// allocates nothing for it).
type missingEntries uint8

func (m missingEntries) has(i int) bool { return m&(1<<i) != 0 }

// reasons lists the set as names.StalePullSecret / names.StaleAutoscalerTLS.
func (m missingEntries) reasons() []string {
	var out []string
	for i, r := range staleReasons {
		if m.has(i) {
			out = append(out, r)
		}
	}
	return out
}

// podMissing is what a Ray pod lacks of raysync's entries.
func podMissing(p *corev1.Pod, tc podtemplate.Config, autoscaling bool) missingEntries {
	var missing missingEntries
	for _, n := range tc.PullSecrets {
		if !slices.ContainsFunc(p.Spec.ImagePullSecrets, func(r corev1.LocalObjectReference) bool { return r.Name == n }) {
			missing |= 1 << 0
			break
		}
	}
	if tc.TLS != nil && autoscaling && slices.ContainsFunc(p.Spec.Containers, isAutoscaler) && !podtemplate.PodHasTLS(p, tc.TLS) {
		missing |= 1 << 1
	}
	return missing
}

func isAutoscaler(c corev1.Container) bool { return c.Name == podtemplate.AutoscalerContainer }

// podStarted reports whether any process of the pod has started: an init container (including a
// native sidecar) or a container that is running or has terminated. Such a pod holds its
// configuration and is never recycled.
func podStarted(p *corev1.Pod) bool {
	started := func(cs corev1.ContainerStatus) bool {
		return cs.State.Running != nil || cs.State.Terminated != nil || cs.LastTerminationState.Terminated != nil ||
			(cs.Started != nil && *cs.Started)
	}
	return slices.ContainsFunc(p.Status.InitContainerStatuses, started) || slices.ContainsFunc(p.Status.ContainerStatuses, started)
}

func anyStarted(pods []*corev1.Pod) bool { return slices.ContainsFunc(pods, podStarted) }

// controlledBy reports whether the pod's controller is the RayCluster with this UID: raysync deletes
// only pods KubeRay created for that very cluster (a label is not ownership).
func controlledBy(p *corev1.Pod, uid types.UID) bool {
	owner, ok := controllerUID(p.OwnerReferences)
	return ok && owner == uid
}

// controllerUID is the UID of the controller among refs (ok false: none), as metav1.GetControllerOf
// finds it, without the copy that allocates.
func controllerUID(refs []metav1.OwnerReference) (uid types.UID, ok bool) {
	for i := range refs {
		if c := refs[i].Controller; c != nil && *c {
			return refs[i].UID, true
		}
	}
	return "", false
}
