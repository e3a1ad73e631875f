package projection

// What a wave writes: the patches that start, advance, finish or report a replacement or a restart,
// and the Events that say so.

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// startActions starts a replacement or a restart and says so on the objects people look at.
func startActions(u *unit, cur ledger.Rotation, now time.Time) []Action {
	stamp := now.UTC().Format(time.RFC3339)
	var acts []Action
	var msg string
	if u.action == names.PolicyReplace {
		// Each replacement writes a new value: a cluster replaced for a rotation that did not start on
		// it (raysync was down when it started) is replaced again, and only a change starts KubeRay's.
		id := fmt.Sprintf("%s-%d", cur.Name(), now.Unix())
		acts = append(acts, PatchRotation{Kind: names.OwnerRayService, Namespace: u.obj.GetNamespace(), Name: u.obj.GetName(), Starts: names.PolicyReplace,
			Patch: rayServiceApply(u.obj, map[string]any{names.RotationStartedAnnotation: stamp, names.RotationTargetAnnotation: cur.Name()}, id)})
		msg = fmt.Sprintf("replacing RayCluster %s with a new cluster that starts with rotation %s of the canonical token; traffic switches when it is ready", memberNames(u), cur.Name())
		if upgradeStrategy(u.obj) == incrementalUpgrade {
			msg = fmt.Sprintf("replacing RayCluster %s with a new cluster that starts with rotation %s of the canonical token; KubeRay moves the traffic "+
				"to it step by step once a Gateway controller has accepted its Gateway and HTTPRoute", memberNames(u), cur.Name())
		}
	} else {
		marks := map[string]any{names.RotationStartedAnnotation: stamp, names.RotationTargetAnnotation: cur.Name(), names.RotateAnnotation: nil}
		if metaString(u.obj, "annotations", names.RotationAbandonedAnnotation) != "" {
			marks[names.RotationAbandonedAnnotation] = nil
		}
		acts = append(acts, PatchRotation{Kind: names.OwnerRayCluster, Namespace: u.obj.GetNamespace(), Name: u.obj.GetName(), Starts: names.PolicyRestart,
			Patch: mergePatch(u.obj, marks, map[string]any{"suspend": true})})
		msg = fmt.Sprintf("restarting the whole cluster on rotation %s of the canonical token: every pod stops, then all start with the new token", cur.Name())
	}
	for _, m := range u.members {
		if u.action == names.PolicyReplace && rotateRequested(m.in.Cluster) {
			acts = append(acts, PatchRotation{Kind: names.OwnerRayCluster, Namespace: m.in.Cluster.GetNamespace(), Name: m.in.Cluster.GetName(),
				Patch: mergePatch(m.in.Cluster, map[string]any{names.RotateAnnotation: nil}, nil)})
		}
	}
	return append(acts, unitEvents(u, corev1.EventTypeNormal, names.ReasonRotationStarted, msg)...)
}

func blockActions(u *unit, now time.Time, why string) []Action {
	stamp := now.UTC().Format(time.RFC3339)
	var patch PatchRotation
	if u.ownerKind == names.OwnerRayService {
		patch = PatchRotation{Kind: names.OwnerRayService, Namespace: u.obj.GetNamespace(), Name: u.obj.GetName(),
			Patch: rayServiceApply(u.obj, map[string]any{names.RotationStartedAnnotation: metaString(u.obj, "annotations", names.RotationStartedAnnotation),
				names.RotationTargetAnnotation: metaString(u.obj, "annotations", names.RotationTargetAnnotation), names.RotationBlockedAnnotation: stamp},
				rotationID(u.obj))}
	} else {
		patch = PatchRotation{Kind: names.OwnerRayCluster, Namespace: u.obj.GetNamespace(), Name: u.obj.GetName(),
			Patch: mergePatch(u.obj, map[string]any{names.RotationBlockedAnnotation: stamp}, nil)}
	}
	return append([]Action{patch}, unitEvents(u, corev1.EventTypeWarning, names.ReasonRotationBlocked, why)...)
}

func verbOf(u *unit) string {
	if u.ownerKind == names.OwnerRayService {
		return "replacement"
	}
	return "restart"
}

// unitEvents records an Event on the unit's object and, for a RayService, on its clusters.
func unitEvents(u *unit, typ, reason, msg string) []Action {
	acts := []Action{RecordEvent{Object: u.obj, Type: typ, Reason: reason, Message: msg}}
	if u.ownerKind == names.OwnerRayService {
		for _, m := range u.members {
			acts = append(acts, RecordEvent{Object: m.in.Cluster, Type: typ, Reason: reason, Message: msg})
		}
	}
	return acts
}

func memberNames(u *unit) string {
	var n []string
	for _, m := range u.members {
		n = append(n, m.in.Cluster.GetName())
	}
	return strings.Join(n, ", ")
}

// rotationID reads the rotation value raysync last wrote into a RayService's head pod template: raysync
// keeps owning it with the same value (a different one would start another upgrade).
func rotationID(rs *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(rs.Object, "spec", "rayClusterConfig", "headGroupSpec", "template", "metadata", "annotations", names.RotationIDAnnotation)
	return v
}

// rayServiceApply is the server-side apply configuration raysync owns on a RayService: its metadata
// annotations (nil: none, which gives them up) and, when rotationID is set, the rotation number in the
// head pod template, whose change is what makes KubeRay start a new cluster.
// raysync's record of adopting the RayService is part of every apply once it is there: an apply that
// left it out would give it up, and server-side apply would remove it.
func rayServiceApply(rs *unstructured.Unstructured, annotations map[string]any, rotationID string) []byte {
	if adopted := metaString(rs, "annotations", names.AdoptedAnnotation); adopted != "" && annotations[names.AdoptedAnnotation] == nil {
		annotations = maps.Clone(annotations)
		if annotations == nil {
			annotations = map[string]any{}
		}
		annotations[names.AdoptedAnnotation] = adopted
	}
	obj := map[string]any{"apiVersion": "ray.io/v1", "kind": string(names.OwnerRayService),
		"metadata": map[string]any{"name": rs.GetName(), "namespace": rs.GetNamespace()}}
	if len(annotations) > 0 {
		obj["metadata"].(map[string]any)["annotations"] = annotations
	}
	if rotationID != "" {
		obj["spec"] = map[string]any{"rayClusterConfig": map[string]any{"headGroupSpec": map[string]any{"template": map[string]any{
			"metadata": map[string]any{"annotations": map[string]any{names.RotationIDAnnotation: rotationID}}}}}}
	}
	b, _ := json.Marshal(obj)
	return b
}

// ownedMarks are the rotation marks raysync keeps on a RayService now (a replacement in flight), which
// an apply for another purpose must carry so as not to give them up.
func ownedMarks(rs *unstructured.Unstructured) map[string]any {
	out := map[string]any{}
	for _, k := range []string{names.RotationStartedAnnotation, names.RotationTargetAnnotation, names.RotationBlockedAnnotation} {
		if v := metaString(rs, "annotations", k); v != "" {
			out[k] = v
		}
	}
	return out
}

// mergePatch is a JSON merge patch of annotations and spec fields (nil values delete), with the
// object's resourceVersion as precondition.
func mergePatch(obj *unstructured.Unstructured, annotations, spec map[string]any) []byte {
	meta := map[string]any{"resourceVersion": obj.GetResourceVersion()}
	if len(annotations) > 0 {
		meta["annotations"] = annotations
	}
	p := map[string]any{"metadata": meta}
	if len(spec) > 0 {
		p["spec"] = spec
	}
	b, _ := json.Marshal(p)
	return b
}
