package projection

import (
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// A fleet rotation is a rollout. The wave planner looks at every managed cluster at once and decides
// which replacements (of a RayService's cluster) and restarts (of a RayCluster) start, advance, finish
// or are reported blocked, never more than RotationOptions.MaxConcurrent in flight. Its state lives in
// the objects it acts on (annotations, spec.suspend), so a restarted raysync or a new leader resumes
// where the last one was.

// unit is what one replacement or restart acts on, and the clusters it moves.
type unit struct {
	ownerKind names.OwnerKind // OwnerRayService or OwnerRayCluster: the kind of obj
	obj       *unstructured.Unstructured
	action    string // names.PolicyReplace or PolicyRestart; "" when held
	members   []clusterView
	behind    bool
	since     time.Time // behind since (the earliest member)
	requested bool      // `syncer rotate` asked for it
	waits     string    // why it cannot start now ("" when it can)
	adopted   bool      // a member is adopted (adoptionOf): the unit is
}

// clusterView is one managed cluster's input and decision, as the wave sees them.
type clusterView struct {
	in   *ClusterInput
	plan ClusterPlan
	// released: raysync no longer manages the cluster (out of scope, skipped, no token auth), and it
	// carries a restart raysync started: the wave only ends that restart.
	released bool
}

func (u *unit) key() string {
	return string(u.ownerKind) + "/" + u.obj.GetNamespace() + "/" + u.obj.GetName()
}

// wavePlan is what the wave does now.
type wavePlan struct {
	Actions  []Action
	InFlight int
	Blocked  bool
	// Paused: the control ConfigMap stops the wave; Held counts the units it keeps from starting.
	Paused       bool
	Held         int
	Started      []string      // unit keys started by this plan
	Observed     []string      // expected units the caches now show in flight
	RequeueAfter time.Duration // look again then (a rotation in flight may time out)
}

// planWave decides the fleet's replacements and restarts. expected holds units started by earlier
// plans whose start the caches may not show yet (they count as in flight).
func planWave(clusters []clusterView, cfg Config, now time.Time, expected map[string]bool) wavePlan {
	var w wavePlan
	cur := ledger.Rotation{}
	if len(clusters) > 0 {
		cur = clusters[0].in.Sources.rotation
	}
	w.Actions = droppedRequests(clusters)
	units := groupUnits(clusters)
	var candidates []*unit
	seen := map[string]bool{}
	for _, u := range units {
		seen[u.key()] = true
		started := startedAt(u.obj)
		if !started.IsZero() && expected[u.key()] {
			w.Observed = append(w.Observed, u.key())
		}
		if started.IsZero() {
			if expected[u.key()] {
				w.InFlight++
			} else if u.action != "" && u.behind && u.waits == "" {
				candidates = append(candidates, u)
			}
			continue
		}
		w.InFlight++
		if wait := resumeWait(u, now); wait > 0 {
			w.RequeueAfter = minPositive(w.RequeueAfter, wait)
		} else if done, actions := advance(u, now, started, cfg.Rotation.Timeout); done || len(actions) > 0 {
			w.Actions = append(w.Actions, actions...)
			if done {
				w.InFlight--
				continue
			}
		}
		age := now.Sub(started)
		timedOut := cfg.Rotation.Timeout > 0 && age > cfg.Rotation.Timeout
		if why := incrementalStall(u, age, timedOut); why != "" {
			// An incremental upgrade stalls for ever without a Gateway controller, and a slow one may
			// outlast the timeout; its old cluster serves all the while. It gives its slot to the next
			// unit and completes whenever KubeRay promotes its new cluster.
			w.InFlight--
			if metaString(u.obj, "annotations", names.RotationBlockedAnnotation) == "" {
				w.Actions = append(w.Actions, blockActions(u, now, why)...)
			}
		} else if timedOut {
			if metaString(u.obj, "annotations", names.RotationTargetAnnotation) == cur.Name() {
				w.Blocked = true // a unit blocked on an older rotation no longer holds the wave back
			}
			if metaString(u.obj, "annotations", names.RotationBlockedAnnotation) == "" {
				w.Actions = append(w.Actions, blockActions(u, now, fmt.Sprintf("the %s started %s ago has not completed: "+
					"no further cluster starts rotating until it completes or is deleted", verbOf(u), age.Round(time.Second)))...)
			}
		} else if cfg.Rotation.Timeout > 0 {
			w.RequeueAfter = minPositive(w.RequeueAfter, cfg.Rotation.Timeout-age+time.Second)
		}
		if u.ownerKind == names.OwnerRayService && age <= replacementStartTimeout {
			// Look again when a replacement KubeRay did not start is given up (advanceReplace): nothing
			// else may change meanwhile, and the slot is the wave's.
			w.RequeueAfter = minPositive(w.RequeueAfter, replacementStartTimeout-age+time.Second)
		}
	}
	for k := range expected {
		if !seen[k] {
			w.InFlight++ // started, and its unit not in the caches at all yet
		}
	}
	w.Actions = append(w.Actions, recordAdoptions(units, now)...)
	if len(clusters) > 0 && clusters[0].in.Sources.control.paused {
		// The emergency stop: nothing new starts; what is in flight went on above, to its end.
		w.Paused, w.Held = true, len(candidates)
		return w
	}
	if w.Blocked || cur.ID == 0 {
		return w
	}
	sort.Slice(candidates, func(i, j int) bool {
		a, b := candidates[i], candidates[j]
		if a.requested != b.requested {
			return a.requested
		}
		if !a.since.Equal(b.since) {
			return a.since.Before(b.since)
		}
		return a.key() < b.key()
	})
	for _, u := range candidates {
		if w.InFlight >= cfg.Rotation.MaxConcurrent {
			break
		}
		w.Actions = append(w.Actions, startActions(u, cur, now)...)
		w.Started = append(w.Started, u.key())
		w.InFlight++
	}
	return w
}

// recordAdoptions records on each adopted RayService that raysync adopted it (names.AdoptedAnnotation),
// once: its later clusters, born on KubeRay's token while raysync was down, then move by its policy as
// its earlier ones did. (A standalone or RayJob cluster is its own unit, and carries its own evidence.)
func recordAdoptions(units []*unit, now time.Time) []Action {
	var acts []Action
	for _, u := range units {
		rs := u.obj
		if u.ownerKind != names.OwnerRayService || !u.adopted || metaString(rs, "annotations", names.AdoptedAnnotation) != "" {
			continue
		}
		a := ownedMarks(rs)
		a[names.AdoptedAnnotation] = now.UTC().Format(time.RFC3339)
		acts = append(acts, PatchRotation{Kind: names.OwnerRayService, Namespace: rs.GetNamespace(), Name: rs.GetName(),
			Patch: rayServiceApply(rs, a, rotationID(rs))})
	}
	return acts
}

// groupUnits gathers clusters into what moves them: a RayService (replace) or the cluster itself.
func groupUnits(clusters []clusterView) []*unit {
	byKey := map[string]*unit{}
	var order []*unit
	for _, c := range clusters {
		r := c.plan.Standing
		requested := rotateRequested(c.in.Cluster)
		obj, action := r.Unit, ""
		switch {
		case released(c) || r.State == "" || r.Unit == nil:
			// A cluster raysync does not (or no longer) plans a token for moves nowhere; one it was
			// restarting is a unit still, so that the restart ends (advance).
			if startedAt(c.in.Cluster).IsZero() {
				continue
			}
			obj = c.in.Cluster
		case names.OwnerKind(obj.GetKind()) == names.OwnerRayService:
			action = names.PolicyReplace
		case r.Policy == names.PolicyRestart:
			action = names.PolicyRestart
		case requested && r.Cannot == "" && r.Move == names.PolicyReplace:
			obj, action = c.in.Owner, names.PolicyReplace
		case requested && r.Cannot == "":
			action = names.PolicyRestart
		}
		u := &unit{ownerKind: names.OwnerKind(obj.GetKind()), obj: obj, action: action}
		if prev, ok := byKey[u.key()]; ok {
			u = prev
		} else {
			byKey[u.key()] = u
			order = append(order, u)
		}
		u.members = append(u.members, c)
		u.requested = u.requested || requested
		u.adopted = u.adopted || r.Adopted
		if r.State == names.TokenBehind {
			if !u.behind || r.Since.Before(u.since) {
				u.since = r.Since
			}
			u.behind = true
		}
		if why := waits(c, u.action); why != "" {
			u.waits = why
		}
	}
	return order
}

// released: raysync no longer plans a token for the cluster (out of scope, skipped, or without token auth).
func released(c clusterView) bool { return c.released || c.plan.Status.Mode == "" }

// waits says why a cluster's unit cannot start now.
func waits(c clusterView, action string) string {
	owner := c.in.Owner
	switch {
	case ownerKind(c.in.Cluster) == names.OwnerRayJob && owner != nil && jobRunning(owner):
		return "its RayJob is running"
	case action == names.PolicyReplace && owner != nil && pendingCluster(owner) != "":
		return "its RayService is already starting a new cluster"
	case action == names.PolicyReplace && owner != nil && suspended(owner):
		return "its RayService is suspended"
	case action == names.PolicyRestart && suspended(c.in.Cluster):
		// Someone suspended it: a restart would end with suspend: false. Once its pods are gone its
		// Secret takes the current token, as a stopped cluster's does.
		return "it is suspended"
	}
	return ""
}

// droppedRequests consumes `raysync.dev/rotate` on clusters it cannot apply to: one that is current
// (a request kept until the next rotation would restart it then), and one raysync cannot move.
func droppedRequests(clusters []clusterView) []Action {
	var acts []Action
	for _, c := range clusters {
		rc, r := c.in.Cluster, c.plan.Standing
		if !rotateRequested(rc) {
			continue
		}
		var why string
		switch {
		case r.State == names.TokenCurrent:
			why = "the cluster already runs on the current canonical token"
		case r.State == names.TokenNotAdopted:
			why = "raysync has not adopted this cluster (it runs on a token raysync did not write): adopt it first (" + names.AdoptAnnotation + "=true, or `syncer adopt`)"
		case r.State == names.TokenBehind && r.Cannot != "":
			why = "raysync cannot move this cluster: " + r.Cannot
		default:
			continue
		}
		acts = append(acts, PatchRotation{Kind: names.OwnerRayCluster, Namespace: rc.GetNamespace(), Name: rc.GetName(),
			Patch: mergePatch(rc, map[string]any{names.RotateAnnotation: nil}, nil)},
			RecordEvent{Object: rc, Type: corev1.EventTypeNormal, Reason: names.ReasonRotationNotNeeded,
				Message: "removed the rotation request (" + names.RotateAnnotation + "): " + why})
	}
	return acts
}

func jobRunning(job *unstructured.Unstructured) bool {
	s, _, _ := unstructured.NestedString(job.Object, "status", "jobDeploymentStatus")
	return s != "Complete" && s != "Failed"
}

func activeCluster(rs *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(rs.Object, "status", "activeServiceStatus", "rayClusterName")
	return v
}

func pendingCluster(rs *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(rs.Object, "status", "pendingServiceStatus", "rayClusterName")
	return v
}

// incrementalStall says why an incremental upgrade in flight for age no longer holds a slot of the
// wave ("" while it does). KubeRay v1.6.1 raises a pending cluster's Serve target capacity (and
// records it in status.pendingServiceStatus.targetCapacity) only once a Gateway controller has
// accepted the RayService's Gateway and HTTPRoute, in the same reconcile that reads the pending
// cluster's Serve applications (applicationStatuses). So applications without a target capacity, past the time a
// replacement has to start, mean no controller: KubeRay will move no traffic, and the old cluster
// serves for ever. Past --rotation-timeout, an incremental upgrade that moves traffic is only slow
// (ceil(100/stepSizePercent) x intervalSeconds at the least).
func incrementalStall(u *unit, age time.Duration, timedOut bool) string {
	rs := u.obj
	if u.ownerKind != names.OwnerRayService || upgradeStrategy(rs) != incrementalUpgrade || pendingCluster(rs) == "" {
		return ""
	}
	_, hasCapacity, _ := unstructured.NestedFieldNoCopy(rs.Object, "status", "pendingServiceStatus", "targetCapacity")
	apps, _, _ := unstructured.NestedMap(rs.Object, "status", "pendingServiceStatus", "applicationStatuses")
	class, _, _ := unstructured.NestedString(rs.Object, "spec", "upgradeStrategy", "clusterUpgradeOptions", "gatewayClassName")
	switch {
	case !hasCapacity && len(apps) > 0 && age > replacementStartTimeout:
		return fmt.Sprintf("its incremental upgrade moves no traffic: the new RayCluster %s serves, but no Gateway controller has accepted "+
			"Gateway %s-gateway and HTTPRoute %s-httproute (gatewayClassName %q), and KubeRay moves traffic only once one has; the old cluster "+
			"serves on the token it had meanwhile. Its slot goes to the next unit; it completes when KubeRay promotes the new cluster",
			pendingCluster(rs), rs.GetName(), rs.GetName(), class)
	case timedOut:
		pct, _, _ := unstructured.NestedInt64(rs.Object, "status", "pendingServiceStatus", "trafficRoutedPercent")
		return fmt.Sprintf("its incremental upgrade has moved %d%% of the traffic to the new RayCluster %s in %s; the old cluster "+
			"serves on the token it had meanwhile. Its slot goes to the next unit; it completes when KubeRay promotes the new cluster",
			pct, pendingCluster(rs), age.Round(time.Second))
	}
	return ""
}

// advance moves a rotation in flight on, and finishes it when it is done, or when nothing it waits
// for can happen any more: no unit holds a slot of the wave for ever, and no cluster raysync suspended
// stays suspended without a way forward.
func advance(u *unit, now, started time.Time, timeout time.Duration) (done bool, acts []Action) {
	if u.ownerKind == names.OwnerRayService {
		return advanceReplace(u, now, started)
	}
	m := u.members[0] // a restart moves one cluster
	rc := m.in.Cluster
	holds := m.plan.TargetHoldsCurrent
	state, _, _ := unstructured.NestedString(rc.Object, "status", "state")
	end := PatchRotation{Kind: names.OwnerRayCluster, Namespace: rc.GetNamespace(), Name: rc.GetName(),
		Patch: mergePatch(rc, map[string]any{names.RotationStartedAnnotation: nil, names.RotationTargetAnnotation: nil, names.RotationBlockedAnnotation: nil}, nil)}
	target := metaString(rc, "annotations", names.RotationTargetAnnotation)
	gone := len(m.in.Pods) == 0
	switch {
	case released(m):
		return true, abandon(u, names.AbandonUnmanaged, fmt.Sprintf("restart for rotation %s abandoned: raysync no longer manages this cluster's token "+
			"(out of scope, skipped, or without token auth); resumed it as it was", target))
	case suspended(rc) && gone && holds:
		// Every pod is gone and the Secret holds the new token: start the cluster again. KubeRay
		// resumes a suspended cluster only on an explicit suspend: false.
		return false, []Action{PatchRotation{Kind: names.OwnerRayCluster, Namespace: rc.GetNamespace(), Name: rc.GetName(),
			Patch: mergePatch(rc, nil, map[string]any{"suspend": false})}}
	case suspended(rc) && gone && !writesToken(m.plan) && !tokenComing(m.plan):
		// Nothing will put the new token into its Secret: waiting would keep the cluster down for ever.
		return true, abandon(u, names.AbandonCannotMove, fmt.Sprintf("restart for rotation %s abandoned: every pod is gone, but %s; "+
			"resumed the cluster on the token its Secret holds. It stays behind", target, whyNoToken(m.plan)))
	case suspended(rc) && timeout > 0 && now.Sub(started) > timeout:
		return true, abandon(u, names.AbandonTimeout, fmt.Sprintf("restart for rotation %s abandoned: the cluster was still suspended after %s "+
			"(not every pod had gone); resumed it on the token it had. It stays behind", target, timeout))
	case suspended(rc):
		return false, nil // KubeRay is stopping the pods, or the Secret is taking the token
	case slices.ContainsFunc(m.in.Pods, func(p *corev1.Pod) bool { return p.CreationTimestamp.Time.Before(started.Truncate(time.Second)) }):
		// spec.suspend was cleared before every pod had stopped: the cluster runs on as it was.
		return true, append([]Action{end}, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationRetried,
			"the restart was interrupted: spec.suspend was cleared before every pod had stopped, so the cluster still runs on the token it had; it is behind, and its policy moves it again")...)
	case !restartedSince(m.in.Pods, started) || !headReady(m.in.Pods) || (state != "" && state != "ready"):
		return false, nil // the new pods are starting
	case !holds:
		// A newer rotation came while the cluster restarted: it runs on the token of the one it was
		// restarted for. This restart is over; the cluster is behind and its policy moves it again.
		return true, append([]Action{end}, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationRetried,
			fmt.Sprintf("restarted for rotation %s, but the canonical token was rotated again meanwhile: the cluster runs on an earlier token and stays behind until it is restarted again", target))...)
	}
	took := now.Sub(started)
	end.Completes = took
	return true, append([]Action{end}, unitEvents(u, corev1.EventTypeNormal, names.ReasonRotationCompleted,
		fmt.Sprintf("restarted on the current canonical token in %s", took.Round(time.Second)))...)
}

// resumeWait is how long a restart whose Secret already holds the new token must stay suspended:
// until every kubelet's Secret cache can have seen the write (its acknowledgement, then a watch's
// lag). Resumed earlier, KubeRay's new pods could start on a node still handing out the previous token,
// the whole cluster on it while its Secret says the new one. The write's time is the Secret's
// synced-at (durable: the same after a restart of raysync); 0 when it is due, or not a restart there.
func resumeWait(u *unit, now time.Time) time.Duration {
	if u.ownerKind != names.OwnerRayCluster {
		return 0
	}
	m := u.members[0]
	if !suspended(m.in.Cluster) || len(m.in.Pods) > 0 || !m.plan.TargetHoldsCurrent {
		return 0
	}
	written := syncedAt(m.in.Target)
	if written.IsZero() {
		return 0
	}
	if visible := written.Add(writeAckSlack + kubeletWatchLag); now.Before(visible) {
		return visible.Sub(now)
	}
	return 0
}

// abandon ends a restart that cannot finish: raysync's marks go, the cluster resumes (suspend: false)
// on whatever token its Secret holds, and its policy does not restart it again for this rotation.
func abandon(u *unit, reason, msg string) []Action {
	rc := u.obj
	var spec map[string]any
	if suspended(rc) {
		spec = map[string]any{"suspend": false}
	}
	marks := map[string]any{names.RotationStartedAnnotation: nil, names.RotationTargetAnnotation: nil, names.RotationBlockedAnnotation: nil}
	if target := metaString(rc, "annotations", names.RotationTargetAnnotation); target != "" {
		marks[names.RotationAbandonedAnnotation] = target
	}
	patch := PatchRotation{Kind: names.OwnerRayCluster, Namespace: rc.GetNamespace(), Name: rc.GetName(), Abandons: reason, Patch: mergePatch(rc, marks, spec)}
	return append([]Action{patch}, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationAbandoned, msg)...)
}

// writesToken: the cluster's plan puts the current token into its Secret.
func writesToken(p ClusterPlan) bool {
	return slices.ContainsFunc(p.Actions, func(a Action) bool {
		switch a := a.(type) {
		case CreateSecret:
			return a.Propagates
		case UpdateSecret:
			return a.Propagates
		}
		return false
	})
}

// tokenComing: the cluster's Secret is not written in this plan, but will be without anyone's help (KubeRay
// creates it, then raysync writes it) or once the source is usable again: the restart waits (up to the
// timeout) rather than give up.
func tokenComing(p ClusterPlan) bool {
	return p.TokenCase == string(tokenLeftToKubeRay) || p.TokenCase == string(tokenSourceInvalid)
}

// whyNoToken says why a cluster's Secret does not take the current token, from its plan.
func whyNoToken(p ClusterPlan) string {
	switch {
	case p.Standing.Cannot != "":
		return p.Standing.Cannot
	case p.Status.Token == names.StateNotOwned:
		return "its auth Secret is not raysync's to write"
	case p.Status.Token == names.StateMissing:
		return "its auth Secret is missing while containers of clusters naming it run"
	}
	return "its auth Secret keeps the token other containers run on (" + p.TokenCase + ")"
}

func suspended(rc *unstructured.Unstructured) bool {
	v, _, _ := unstructured.NestedBool(rc.Object, "spec", "suspend")
	return v
}

// advanceReplace finishes a replacement once the RayService serves from a cluster created for it and
// the old cluster is gone.
func advanceReplace(u *unit, now, started time.Time) (bool, []Action) {
	rs := u.obj
	active := activeCluster(rs)
	if pendingCluster(rs) == "" && now.Sub(started) > replacementStartTimeout && !slices.ContainsFunc(u.members, func(m clusterView) bool {
		return !m.in.Cluster.GetCreationTimestamp().Time.Before(started.Truncate(time.Second))
	}) {
		// No new cluster, pending or serving: KubeRay will not start one. The slot goes to the next unit.
		target := metaString(rs, "annotations", names.RotationTargetAnnotation)
		acts := []Action{PatchRotation{Kind: names.OwnerRayService, Namespace: rs.GetNamespace(), Name: rs.GetName(), Abandons: names.AbandonNoNewCluster,
			Patch: rayServiceApply(rs, map[string]any{names.RotationAbandonedAnnotation: target}, rotationID(rs))}}
		return true, append(acts, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationAbandoned, fmt.Sprintf(
			"replacement for rotation %s abandoned: KubeRay started no new cluster within %s, so its zero-downtime upgrade is off (the operator's "+
				"ENABLE_ZERO_DOWNTIME=false, the incremental upgrade's feature gate, or the RayService suspended); the RayService keeps serving on "+
				"the token it had and stays behind. `syncer rotate` tries again", target, replacementStartTimeout))...)
	}
	if active == "" || pendingCluster(rs) != "" {
		return false, nil
	}
	for _, m := range u.members {
		rc := m.in.Cluster
		if rc.GetName() != active || rc.GetCreationTimestamp().Time.Before(started.Truncate(time.Second)) {
			return false, nil // the old cluster is still there, or the active one predates the replacement
		}
	}
	for _, m := range u.members {
		if !m.plan.Standing.Current {
			// The new cluster started on another token (raysync was not watching when it was born): this
			// replacement is over and did not move the RayService, which is behind; its policy moves it again.
			acts := []Action{PatchRotation{Kind: names.OwnerRayService, Namespace: rs.GetNamespace(), Name: rs.GetName(), Patch: rayServiceApply(rs, nil, rotationID(rs))}}
			return true, append(acts, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationRetried,
				fmt.Sprintf("new RayCluster %s started on a token other than the canonical one (raysync was not watching when it was created): this replacement did not move the RayService, which stays behind until it is replaced again", active))...)
		}
	}
	took := now.Sub(started)
	acts := []Action{PatchRotation{Kind: names.OwnerRayService, Namespace: rs.GetNamespace(), Name: rs.GetName(), Completes: took,
		Patch: rayServiceApply(rs, nil, rotationID(rs))}}
	return true, append(acts, unitEvents(u, corev1.EventTypeNormal, names.ReasonRotationCompleted,
		fmt.Sprintf("serving from RayCluster %s on the current canonical token; the replacement took %s", active, took.Round(time.Second)))...)
}

// restartedSince: every pod of the cluster was created after the restart began.
func restartedSince(pods []*corev1.Pod, started time.Time) bool {
	return len(pods) > 0 && !slices.ContainsFunc(pods, func(p *corev1.Pod) bool {
		return p.CreationTimestamp.Time.Before(started.Truncate(time.Second))
	})
}

func headReady(pods []*corev1.Pod) bool {
	return slices.ContainsFunc(pods, func(p *corev1.Pod) bool {
		if p.Labels[kuberay.NodeTypeLabel] != "head" || p.DeletionTimestamp != nil {
			return false
		}
		return slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		})
	})
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}
