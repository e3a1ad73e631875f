package projection

import (
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// A fleet rotation is a rollout. The wave planner looks at every managed cluster at once and decides
// which replacements (of a RayService's cluster) and restarts (of a RayCluster) start, advance, finish
// or are reported blocked, never more than RotationOptions.MaxConcurrent in flight. Its state lives in
// the objects it acts on (annotations, spec.suspend), so a restarted raysync or a new leader resumes
// where the last one was.

// unit is what one replacement or restart acts on, and the clusters it moves.
type unit struct {
	kind      string // "RayService" or "RayCluster"
	obj       *unstructured.Unstructured
	action    string // names.PolicyReplace or PolicyRestart; "" when held
	members   []clusterView
	behind    bool
	since     time.Time // behind since (the earliest member)
	requested bool      // `syncer rotate` asked for it
	waits     string    // why it cannot start now ("" when it can)
}

// clusterView is one managed cluster's input and decision, as the wave sees them.
type clusterView struct {
	in   *ClusterInput
	plan ClusterPlan
}

func (u *unit) key() string { return u.kind + "/" + u.obj.GetNamespace() + "/" + u.obj.GetName() }

// wavePlan is what the wave does now.
type wavePlan struct {
	Actions      []Action
	InFlight     int
	Blocked      bool
	Started      []string      // unit keys started by this plan
	Observed     []string      // expected units the caches now show in flight
	RequeueAfter time.Duration // look again then (a rotation in flight may time out)
}

// planWave decides the fleet's replacements and restarts. expected holds units started by earlier
// plans whose start the caches may not show yet (they count as in flight).
func planWave(clusters []clusterView, cfg Config, now time.Time, expected map[string]bool) wavePlan {
	var w wavePlan
	cur := rotation{}
	if len(clusters) > 0 {
		cur = clusters[0].in.Sources.rotation
	}
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
		if done, actions := advance(u, now, started); done || len(actions) > 0 {
			w.Actions = append(w.Actions, actions...)
			if done {
				w.InFlight--
				continue
			}
		}
		age := now.Sub(started)
		if cfg.Rotation.Timeout > 0 && age > cfg.Rotation.Timeout {
			if metaString(u.obj, "annotations", names.RotationTargetAnnotation) == cur.Name() {
				w.Blocked = true // a unit blocked on an older rotation no longer holds the wave back
			}
			if metaString(u.obj, "annotations", names.RotationBlockedAnnotation) == "" {
				w.Actions = append(w.Actions, blockActions(u, now, age)...)
			}
		} else if cfg.Rotation.Timeout > 0 {
			w.RequeueAfter = minPositive(w.RequeueAfter, cfg.Rotation.Timeout-age+time.Second)
		}
	}
	for k := range expected {
		if !seen[k] {
			w.InFlight++ // started, and its unit not in the caches at all yet
		}
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

// groupUnits gathers clusters into what moves them: a RayService (replace) or the cluster itself.
func groupUnits(clusters []clusterView) []*unit {
	byKey := map[string]*unit{}
	var order []*unit
	for _, c := range clusters {
		r := c.plan.Rotation
		if r.State == "" || r.Unit == nil {
			continue
		}
		requested := metaString(c.in.Cluster, "annotations", names.RotateAnnotation) != ""
		obj, action := r.Unit, ""
		switch {
		case obj.GetKind() == "RayService":
			action = names.PolicyReplace
		case r.Policy == names.PolicyRestart:
			action = names.PolicyRestart
		case requested && r.Held == "" && ownerKind(c.in.Cluster) == "RayService" && c.in.Owner != nil && upgradeStrategy(c.in.Owner) != "None":
			obj, action = c.in.Owner, names.PolicyReplace
		case requested && r.Held == "":
			action = names.PolicyRestart
		}
		u := &unit{kind: obj.GetKind(), obj: obj, action: action}
		if prev, ok := byKey[u.key()]; ok {
			u = prev
		} else {
			byKey[u.key()] = u
			order = append(order, u)
		}
		u.members = append(u.members, c)
		u.requested = u.requested || requested
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

// waits says why a cluster's unit cannot start now.
func waits(c clusterView, action string) string {
	owner := c.in.Owner
	switch {
	case ownerKind(c.in.Cluster) == "RayJob" && owner != nil && jobRunning(owner):
		return "its RayJob is running"
	case action == names.PolicyReplace && owner != nil && pendingCluster(owner) != "":
		return "its RayService is already starting a new cluster"
	}
	return ""
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

// advance moves a rotation in flight on, and finishes it when it is done.
func advance(u *unit, now, started time.Time) (done bool, acts []Action) {
	if u.kind == "RayService" {
		return advanceReplace(u, now, started)
	}
	if len(u.members) != 1 {
		return false, nil
	}
	m := u.members[0]
	rc := m.in.Cluster
	suspend, _, _ := unstructured.NestedBool(rc.Object, "spec", "suspend")
	holds := m.plan.TargetHoldsCurrent
	state, _, _ := unstructured.NestedString(rc.Object, "status", "state")
	switch {
	case suspend && len(m.in.Pods) == 0 && holds:
		// Every pod is gone and the Secret holds the new token: start the cluster again. KubeRay
		// resumes a suspended cluster only on an explicit suspend: false.
		return false, []Action{PatchRotation{Kind: "RayCluster", Namespace: rc.GetNamespace(), Name: rc.GetName(),
			Patch: mergePatch(rc, nil, map[string]any{"suspend": false})}}
	case !suspend && holds && restartedSince(m.in.Pods, started) && headReady(m.in.Pods) && (state == "" || state == "ready"):
		took := now.Sub(started)
		acts = append(acts, PatchRotation{Kind: "RayCluster", Namespace: rc.GetNamespace(), Name: rc.GetName(), Completes: took,
			Patch: mergePatch(rc, map[string]any{names.RotationStartedAnnotation: nil, names.RotationTargetAnnotation: nil, names.RotationBlockedAnnotation: nil}, nil)})
		return true, append(acts, unitEvents(u, corev1.EventTypeNormal, names.ReasonRotationCompleted,
			fmt.Sprintf("restarted on the current canonical token in %s", took.Round(time.Second)))...)
	}
	return false, nil
}

// advanceReplace finishes a replacement once the RayService serves from a cluster created for it and
// the old cluster is gone.
func advanceReplace(u *unit, now, started time.Time) (bool, []Action) {
	rs := u.obj
	active := activeCluster(rs)
	if active == "" || pendingCluster(rs) != "" {
		return false, nil
	}
	for _, m := range u.members {
		rc := m.in.Cluster
		if rc.GetName() != active || rc.GetCreationTimestamp().Time.Before(started.Truncate(time.Second)) {
			return false, nil // the old cluster is still there, or the active one predates the replacement
		}
	}
	if len(u.members) == 0 {
		return false, nil
	}
	for _, m := range u.members {
		if !m.plan.Rotation.Current {
			// The new cluster started on another token (raysync was not watching when it was born): this
			// replacement is over and did not move the RayService, which is behind; its policy moves it again.
			acts := []Action{PatchRotation{Kind: "RayService", Namespace: rs.GetNamespace(), Name: rs.GetName(), Patch: rayServiceApply(rs, nil, rotationID(rs))}}
			return true, append(acts, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationRetried,
				fmt.Sprintf("new RayCluster %s started on a token other than the canonical one (raysync was not watching when it was created): this replacement did not move the RayService, which stays behind until it is replaced again", active))...)
		}
	}
	took := now.Sub(started)
	acts := []Action{PatchRotation{Kind: "RayService", Namespace: rs.GetNamespace(), Name: rs.GetName(), Completes: took,
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
