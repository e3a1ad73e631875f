package projection

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// Ray reads its token once per process and accepts only that one, so a running cluster moves to a new
// token only as a whole (kuberay-facts.md). The invariant raysync keeps: once any container of a
// cluster has started with a token, the cluster's auth Secret changes only as part of a replacement
// or a restart that raysync performs. This file says where a cluster stands; plan_wave.go decides which
// clusters move, and when.

// RotationOptions configure how running clusters move to a new token.
type RotationOptions struct {
	// Policies by owner kind: OwnerRayService, OwnerRayJob, and "" for a standalone RayCluster.
	Policies map[names.OwnerKind]string
	// MaxConcurrent bounds the replacements and restarts in flight.
	MaxConcurrent int
	// Timeout is how long one may take before it blocks the wave.
	Timeout time.Duration
}

// DefaultMaxConcurrentRotations bounds the replacements and restarts in flight. A replacement runs the
// old and the new cluster side by side until traffic switches, so N in flight need the capacity of N
// more clusters; a restart takes a cluster offline. Five keeps that to a node pool's usual headroom and
// a bad rotation's reach to five clusters, and still moves 100 RayServices in 20 rounds.
const DefaultMaxConcurrentRotations = 5

// DefaultPolicies: a RayService can replace its cluster without downtime; anything else would stop
// work someone is running, so it waits for its owner (or `syncer rotate`).
var DefaultPolicies = map[names.OwnerKind]string{names.OwnerRayService: names.PolicyReplace, names.OwnerRayJob: names.PolicyHold, "": names.PolicyHold}

// standing is where one cluster stands with its token: its rotation state, the policy that moves it,
// and what a move acts on. (A rotation is one numbered change of the canonical token, ledger.Rotation.)
type standing struct {
	State  string    // names.Token*
	Policy string    // the policy in force (after any fallback)
	Since  time.Time // behind or rotating since
	// Held says why the cluster's policy fell back to hold ("" when it did not).
	Held string
	// Move is how raysync moves the cluster, by its policy or on request (replace or restart); "" when
	// it cannot, and Cannot says why, whatever the policy.
	Move, Cannot string
	// Unit is what moves the cluster: its RayService (replace) or itself (restart).
	Unit *unstructured.Unstructured
	// Current: the cluster's containers hold (or will start with) the current token.
	Current bool
	// Adopted: raysync may move the cluster (adoptionOf); a cluster behind and not adopted is reported
	// not_adopted and moved by nothing, whatever its policy says.
	Adopted bool
	// Invalid are raysync annotations on the cluster (or its owner) whose values raysync cannot read,
	// each with the reading it applied instead.
	Invalid []string
}

// ownerKind is OwnerRayService, OwnerRayJob or "" (standalone).
func ownerKind(rc *unstructured.Unstructured) names.OwnerKind {
	switch k := names.OwnerKind(metaString(rc, "labels", kuberay.OriginatedFromCRDLabel)); k {
	case names.OwnerRayService, names.OwnerRayJob:
		return k
	}
	return ""
}

// moveOf says how raysync can move the cluster to a new token, whatever its policy, or why it cannot.
// A restart must end with every pod on the new token, so it needs a Secret no other cluster's running
// containers hold; a RayService's cluster moves only by KubeRay's replacement, which keeps its traffic
// served where a restart would stop every pod serving it (and KubeRay v1.6's RayService controller puts
// spec.suspend back, which would interrupt a restart again and again; v1.5.1 and, read, v1.7.0 do not).
func moveOf(in *ClusterInput, t TokenTarget) (move, cannot string) {
	switch {
	case t.Mode == Referenced && !t.IsSource:
		return "", "it shares the managed Secret " + t.Name + ", which holds one token for every cluster naming it"
	case len(in.SharedWith) == 1:
		return "", "RayCluster " + in.SharedWith[0] + " also reads its Secret " + t.Name + ", which holds one token for every cluster naming it"
	case len(in.SharedWith) > 1:
		return "", "RayClusters " + strings.Join(in.SharedWith, ", ") + " also read its Secret " + t.Name + ", which holds one token for every cluster naming it"
	case ownerKind(in.Cluster) != names.OwnerRayService:
		return names.PolicyRestart, ""
	case in.Owner == nil:
		return "", "its RayService is not in raysync's cache"
	case upgradeStrategy(in.Owner) == "None":
		return "", "its RayService has upgradeStrategy None: KubeRay would not start a new cluster"
	case !slices.Contains(knownUpgradeStrategies, upgradeStrategy(in.Owner)):
		return "", "its RayService has upgradeStrategy " + upgradeStrategy(in.Owner) + ", which raysync does not know: it starts no replacement KubeRay may not finish"
	}
	return names.PolicyReplace, ""
}

// The RayService upgrade strategies raysync can start a replacement with: KubeRay's default (none
// given, or NewCluster: a blue-green switch) and its incremental upgrade (held unless asked for: see
// policyOf). None starts no new cluster; any other raysync does not know.
const incrementalUpgrade = "NewClusterWithIncrementalUpgrade"

var knownUpgradeStrategies = []string{"", "NewCluster", incrementalUpgrade, "None"}

// replacementStartTimeout: a replacement whose RayService shows no new cluster by then will not get one
// (KubeRay's zero-downtime upgrade is off: the operator's ENABLE_ZERO_DOWNTIME=false, the incremental
// upgrade's feature gate off, or the RayService suspended). raysync gives it up (RotationAbandoned)
// instead of holding a slot of the wave until --rotation-timeout.
const replacementStartTimeout = 2 * time.Minute

// policyOf is the cluster's rotation policy and, when it cannot apply, why it falls back to hold. An
// annotation value raysync cannot read is reported (invalid) and read as hold, the safest policy.
func policyOf(in *ClusterInput, opts RotationOptions, move, cannot string) (policy, held, invalid string) {
	rc := in.Cluster
	policy = opts.Policies[ownerKind(rc)]
	switch p := metaString(rc, "annotations", names.RotationAnnotation); p {
	case "":
	case names.PolicyReplace, names.PolicyRestart, names.PolicyHold, names.PolicyGateway:
		policy = p
	default:
		invalid = fmt.Sprintf("%s %q is not replace, restart, hold or gateway: read as hold, the safest", names.RotationAnnotation, p)
		return names.PolicyHold, "its " + names.RotationAnnotation + " annotation is not a policy raysync knows", invalid
	}
	switch {
	case policy == "" || policy == names.PolicyHold:
		return names.PolicyHold, "", ""
	case cannot != "":
		return names.PolicyHold, cannot, ""
	case policy == names.PolicyReplace && move != names.PolicyReplace:
		return names.PolicyHold, "only a RayService can replace its cluster", ""
	case policy == names.PolicyReplace && upgradeStrategy(in.Owner) == incrementalUpgrade && !asksFor(in, names.PolicyReplace):
		return names.PolicyHold, "its RayService upgrades incrementally (" + incrementalUpgrade + "): KubeRay moves traffic only with its " +
			"RayServiceIncrementalUpgrade gate on and a Gateway controller, old and new clusters serving a weighted mix of tokens meanwhile; " +
			"annotate " + names.RotationAnnotation + "=replace to let raysync start it, or `syncer rotate` it", ""
	case policy == names.PolicyReplace && abandonedFor(in.Owner, in.Sources.rotation.Name()):
		return names.PolicyHold, "KubeRay started no new cluster for rotation " + in.Sources.rotation.Name() + " within " + replacementStartTimeout.String() +
			" (Event " + names.ReasonRotationAbandoned + "): its zero-downtime upgrade is off (the operator's ENABLE_ZERO_DOWNTIME=false, the incremental " +
			"upgrade's gate, or the RayService suspended); `syncer rotate` tries again, and the next rotation replaces it", ""
	case policy == names.PolicyRestart && move != names.PolicyRestart:
		return names.PolicyHold, "a RayService's cluster moves only by replacement, which keeps its traffic served (a restart stops every pod serving it; on KubeRay v1.6 its RayService also puts spec.suspend back, so a restart would never end)", ""
	case policy == names.PolicyRestart && abandonedFor(rc, in.Sources.rotation.Name()):
		return names.PolicyHold, "its restart for rotation " + in.Sources.rotation.Name() + " was abandoned (Event " + names.ReasonRotationAbandoned +
			"); `syncer rotate` tries again, and the next rotation restarts it", ""
	}
	return policy, "", ""
}

// adoptionOf says whether raysync may move the cluster, from the objects alone (every replica, and
// raysync after a restart, decide alike). Adopted by an operator: raysync.dev/adopt=true on the
// cluster or on its RayService or RayJob, or its namespace (or every namespace) in the control
// ConfigMap. Adopted by what raysync did: its Secret carries raysync's mark (raysync wrote the token
// it holds: a cluster born while raysync ran), the RayCluster raysync's record of it, raysync moved it
// before (its rotation marks), or raysync adopted its RayService (raysync.dev/adopted). A cluster that
// reads the canonical source itself is adopted once its containers started after raysync first saw the
// source. Anything else ran before raysync, or was born on KubeRay's token while raysync was down: not
// adopted. invalid names a raysync.dev/adopt value raysync cannot read (read as not adopted).
func adoptionOf(in *ClusterInput, t TokenTarget) (adopted bool, invalid string) {
	for _, obj := range []*unstructured.Unstructured{in.Cluster, in.Owner} {
		if obj == nil {
			continue
		}
		switch v := metaString(obj, "annotations", names.AdoptAnnotation); v {
		case "true":
			return true, ""
		case "", "false":
		default:
			invalid = fmt.Sprintf("%s %q on %s %s is not true or false: read as false (not adopted)", names.AdoptAnnotation, v, obj.GetKind(), obj.GetName())
		}
		if metaString(obj, "annotations", names.AdoptedAnnotation) != "" || !startedAt(obj).IsZero() ||
			metaString(obj, "annotations", names.RotationAbandonedAnnotation) != "" {
			return true, invalid
		}
	}
	switch {
	case in.Sources.control.adopts(in.Cluster.GetNamespace()):
		return true, invalid
	case in.Target != nil && in.Target.Annotations[names.TokenSHA256Annotation] != "":
		return true, invalid
	case metaString(in.Cluster, "annotations", names.TokenRotationAnnotation) != "":
		return true, invalid
	case in.Owner != nil && ownerKind(in.Cluster) == names.OwnerRayService && rotationID(in.Owner) != "":
		return true, invalid
	case t.IsSource && len(in.Sources.ledger) > 0:
		began := earliestStart(in.Pods)
		return !began.IsZero() && !began.Before(in.Sources.ledger[0].FirstSeen), invalid
	}
	return false, invalid
}

// abandonedFor: raysync gave up a restart of rc (and resumed it), or a replacement of the RayService
// rc, for rotation.
func abandonedFor(rc *unstructured.Unstructured, rotation string) bool {
	return rc != nil && rotation != "" && metaString(rc, "annotations", names.RotationAbandonedAnnotation) == rotation
}

// asksFor: the cluster (or its RayService or RayJob, which copy theirs onto it at creation) is
// annotated with policy.
func asksFor(in *ClusterInput, policy string) bool {
	return metaString(in.Cluster, "annotations", names.RotationAnnotation) == policy ||
		in.Owner != nil && metaString(in.Owner, "annotations", names.RotationAnnotation) == policy
}

// standingOf says where a cluster whose target holds (or, reading the source itself, was started
// with) the token it has stands against the current rotation.
func standingOf(in *ClusterInput, cfg Config, t TokenTarget, holdsCurrent bool) standing {
	r := standing{Current: holdsCurrent}
	r.Move, r.Cannot = moveOf(in, t)
	var invalidPolicy, invalidAdopt string
	r.Policy, r.Held, invalidPolicy = policyOf(in, cfg.Rotation, r.Move, r.Cannot)
	r.Adopted, invalidAdopt = adoptionOf(in, t)
	for _, v := range []string{invalidPolicy, invalidAdopt, invalidSkip(in.Cluster), invalidRotate(in.Cluster)} {
		if v != "" {
			r.Invalid = append(r.Invalid, v)
		}
	}
	r.Unit = in.Cluster
	if r.Policy == names.PolicyReplace || (ownerKind(in.Cluster) == names.OwnerRayService && !startedAt(in.Owner).IsZero()) {
		r.Unit = in.Owner // a replacement acts on the RayService (also one `syncer rotate` asked for)
	}
	inFlight := startedAt(r.Unit)
	switch {
	case !inFlight.IsZero() && !(r.Policy == names.PolicyReplace && holdsCurrent):
		r.State, r.Since = names.TokenRotating, inFlight
		if cfg.Rotation.Timeout > 0 && in.Now.Sub(inFlight) > cfg.Rotation.Timeout {
			r.State = names.TokenBlocked
		}
	case holdsCurrent:
		r.State = names.TokenCurrent
	case !r.Adopted:
		r.State, r.Since = names.TokenNotAdopted, behindSince(in)
	default:
		r.State, r.Since = names.TokenBehind, behindSince(in)
	}
	return r
}

// behindSince is when the cluster missed its first rotation: the ledger's first sight of the rotation
// after the one its Secret holds; for a token the ledger never numbered (or no longer lists), the
// first rotation after its pods started, or when they started if none came since.
func behindSince(in *ClusterInput) time.Time {
	l := in.Sources.ledger
	if len(l) == 0 && in.Sources.rotation.ID != 0 {
		l = ledger.Ledger{in.Sources.rotation}
	}
	if in.Target != nil {
		held := tokenDigest(in.Target.Data[kuberay.AuthTokenKey])
		for i, r := range l {
			if r.Digest == held && i+1 < len(l) {
				return l[i+1].FirstSeen
			}
		}
	}
	began := earliestStart(in.Pods)
	if began.IsZero() {
		return in.Sources.rotation.FirstSeen
	}
	for _, r := range l {
		if r.FirstSeen.After(began) {
			return r.FirstSeen
		}
	}
	return began
}

// earliestStart is when the first container of the pods started, else when the first pod was created.
func earliestStart(pods []*corev1.Pod) time.Time {
	var first, created time.Time
	earlier := func(a, b time.Time) time.Time {
		if a.IsZero() || (!b.IsZero() && b.Before(a)) {
			return b
		}
		return a
	}
	for _, p := range pods {
		created = earlier(created, p.CreationTimestamp.Time)
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			first = earlier(first, containerStartedAt(cs))
		}
	}
	if first.IsZero() {
		return created
	}
	return first
}

// startedAt reads when a replacement or restart of obj began (zero: none in flight).
func startedAt(obj *unstructured.Unstructured) time.Time {
	if obj == nil {
		return time.Time{}
	}
	v := metaString(obj, "annotations", names.RotationStartedAnnotation)
	if v == "" {
		return time.Time{} // no rotation in flight: parsing "" would allocate an error each scrape
	}
	t, _ := time.Parse(time.RFC3339, v)
	return t
}

func upgradeStrategy(rs *unstructured.Unstructured) string {
	v, _, _ := unstructured.NestedString(rs.Object, "spec", "upgradeStrategy", "type")
	return v
}

// startedBefore reports whether any container of the pods started before t: with the source itself as
// target, those containers hold the token the source had then.
func startedBefore(pods []*corev1.Pod, t time.Time) bool {
	if t.IsZero() {
		return false
	}
	before := func(cs corev1.ContainerStatus) bool {
		s := containerStartedAt(cs)
		return !s.IsZero() && s.Before(t.Truncate(time.Second))
	}
	return slices.ContainsFunc(pods, func(p *corev1.Pod) bool {
		return slices.ContainsFunc(p.Status.InitContainerStatuses, before) || slices.ContainsFunc(p.Status.ContainerStatuses, before)
	})
}
