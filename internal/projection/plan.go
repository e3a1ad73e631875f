package projection

import (
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Action is one step of a plan. apply.go executes a plan's actions in order and stops at the first
// that fails (the key goes back to the queue and the next pass plans again from fresh caches). Every
// action type is declared here; the applier refuses one it has no case for.
type Action interface{ isAction() }

// CreateSecret creates a Secret the caches do not hold.
type CreateSecret struct {
	Secret *corev1.Secret
	// Propagates: this write delivers the canonical token (raysync_propagation_seconds).
	Propagates bool
}

// UpdateSecret writes Secret, which carries the resourceVersion it was read at (a precondition).
type UpdateSecret struct {
	Secret     *corev1.Secret
	Propagates bool
	// MarksRace: the write is over a token kubelets may have read (names.WrittenUnderPodsAnnotation):
	// the applier stamps the mark with the time it sends the write, and again with the acknowledgement's
	// time when that came more than writeAckSlack later.
	MarksRace bool
}

// ReplaceSecret deletes Old (preconditions: its UID and resourceVersion) and creates New: a Secret's
// type cannot change.
type ReplaceSecret struct{ Old, New *corev1.Secret }

// DeleteSecret deletes a managed copy nothing references (preconditions: UID and resourceVersion).
type DeleteSecret struct{ Secret *corev1.Secret }

// PatchCluster sends a JSON merge patch of raysync's template entries to a RayCluster; the patch
// carries the cluster's resourceVersion, so a concurrent change fails with a conflict.
type PatchCluster struct {
	Namespace, Name string
	Patch           []byte
	// Reapplied: raysync's entries had been in place before (KubeRay or someone removed them).
	Reapplied bool
}

// DeletePod deletes a pod so KubeRay recreates it (preconditions: UID and resourceVersion): a
// never-started one, from the fixed template, or one that may hold the token its Secret held before
// raysync's write (recycleRacedPods).
type DeletePod struct {
	Pod     *corev1.Pod
	Missing []string // names.StalePullSecret / names.StaleAutoscalerTLS / names.RecycledAuthToken
}

// RecordEvent records an Event. With DedupKey set, apply remembers DedupValue for the cluster, and
// the planner plans the Event again only when the value changes (or the cluster was forgotten).
type RecordEvent struct {
	Object                runtime.Object
	Type, Reason, Message string
	DedupKey, DedupValue  string
	// StartedWithout counts running pods this report names for the first time (reason
	// StalePodConfig): pods that started without raysync's entries, for the metrics.
	StartedWithout int
	StaleReason    string
}

// CreateService creates a gateway address (an ExternalName Service raysync owns).
type CreateService struct{ Service *corev1.Service }

// UpdateService writes a gateway address raysync owns (its resourceVersion is the precondition).
type UpdateService struct{ Service *corev1.Service }

func (CreateService) isAction() {}
func (UpdateService) isAction() {}

// PatchRotation starts, advances or finishes a replacement or a restart.
type PatchRotation struct {
	// Kind is OwnerRayService (Patch is a server-side apply configuration with raysync's field
	// manager, so GitOps tools applying the rest of the object leave it alone) or OwnerRayCluster (a
	// JSON merge patch carrying the cluster's resourceVersion).
	Kind            names.OwnerKind
	Namespace, Name string
	Patch           []byte
	// Starts is the action this patch starts (names.PolicyReplace or PolicyRestart), for the metrics.
	Starts string
	// Completes is how long the rotation it completes took (0: it completes none).
	Completes time.Duration
	// Abandons says why this patch gives up a restart and resumes the cluster (a names.Abandon*; ""
	// when it does not), for the metrics.
	Abandons string
}

// RecordToken writes onto a RayCluster raysync's record of the token its containers run on
// (names.TokenRotationAnnotation and TokenWrittenAtAnnotation; null values remove them): a JSON merge
// patch carrying the cluster's UID as precondition, so it never lands on a namesake.
type RecordToken struct {
	Namespace, Name string
	Patch           []byte
}

func (RecordToken) isAction() {}

func (CreateSecret) isAction()  {}
func (UpdateSecret) isAction()  {}
func (ReplaceSecret) isAction() {}
func (DeleteSecret) isAction()  {}
func (PatchCluster) isAction()  {}
func (DeletePod) isAction()     {}
func (RecordEvent) isAction()   {}
func (PatchRotation) isAction() {}

// ClusterInput is everything one decision about one RayCluster reads (gather.go fills it).
type ClusterInput struct {
	Cluster *unstructured.Unstructured
	Sources *sourceView
	// Target is the token target Secret as cached (or read live), nil when absent or when the
	// cluster reads the source itself.
	Target *corev1.Secret
	// Copies are the Secrets in the cluster's namespace named like pod-source copies (copyNamed finds
	// one): a list of a few, cheaper than a map on every cluster of every scrape.
	Copies []*corev1.Secret
	Pods   []*corev1.Pod
	// Readers are the pods of the other clusters that read the token target (several clusters may
	// name one Secret): it may have been read when any of theirs may have started.
	Readers []*corev1.Pod
	// SharedWith names the other RayClusters whose pods read the token target, running or not.
	SharedWith []string
	// sharedRecords are their records of the token their containers run on (plan_token_record.go).
	sharedRecords map[string]tokenRecord
	// Foreign are the Secret names the cluster needs (its token target, copies of pod sources) that
	// exist in its namespace and are not raysync's, as the caches show: never written, never referenced.
	Foreign map[string]bool
	Memory  clusterMemory
	Now     time.Time
	// WatchingSince is when this process began acting on its caches: a Secret created before then
	// arrived while nobody was watching, and may have been read before raysync saw it.
	WatchingSince time.Time
	// Owner is the cluster's RayService or RayJob as cached (nil for a standalone cluster).
	Owner *unstructured.Unstructured
	// GatewayAddress is the Service <name>-gw of the cluster's RayService (else of the cluster) as
	// cached, nil when absent or the gateway is off.
	GatewayAddress *corev1.Service
	// targetName is the token target's name ("" when there is none to write): see puts a live Secret there.
	targetName string
	// reportOnly: the plan is read for its Status alone (the Reporter, on every scrape), so the
	// Events, on which no status depends, are not built.
	reportOnly bool
	// drift checks the pod templates: podtemplate.Drift when nil, or the Reporter's memo of it (same answers).
	drift func(*unstructured.Unstructured, podtemplate.Config) (podtemplate.Missing, error)
}

// copyNamed is the Secret of Copies named name (nil: none).
func (in *ClusterInput) copyNamed(name string) *corev1.Secret {
	for _, s := range in.Copies {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// setCopy puts s in Copies, in place of the one of its name.
func (in *ClusterInput) setCopy(s *corev1.Secret) {
	for i, c := range in.Copies {
		if c.Name == s.Name {
			in.Copies[i] = s
			return
		}
	}
	if in.Copies == nil {
		in.Copies = make([]*corev1.Secret, 0, 2) // a pull secret and the client certificate, usually
	}
	in.Copies = append(in.Copies, s)
}

// ClusterPlan is the decision for one RayCluster: what to do, and where it stands.
type ClusterPlan struct {
	Actions []Action
	Status  ClusterStatus
	// RequeueAfter asks for another look (a pod too young to recycle); 0: none.
	RequeueAfter time.Duration
	// Unchanged: the token target already holds the token. Refused: targets raysync will not touch.
	Unchanged bool
	Refused   int
	// TemplatesInPlace: the cluster's templates carry every entry raysync wants.
	TemplatesInPlace bool
	// TargetHoldsCurrent: the Secret the cluster's pods read holds the current token (the source
	// itself always does), so pods created now start on it.
	TargetHoldsCurrent bool
	// Standing is where the cluster stands with its token (zero when raysync does not manage it).
	Standing standing
	// TokenCase names what raysync made of the token target (a tokenCase), for debug logs; "" when
	// the cluster has none.
	TokenCase string `json:"-"`
}

// ClusterStatus is where one in-scope RayCluster stands. Metrics and `syncer status` both read it.
type ClusterStatus struct {
	Namespace  string `json:"namespace"`
	RayCluster string `json:"raycluster"`
	// Owner is the RayService or RayJob that generated the cluster ("" for a standalone cluster).
	Owner     string          `json:"owner,omitempty"`
	OwnerKind names.OwnerKind `json:"ownerKind,omitempty"`
	// Mode is generated or referenced; "" when the cluster does not use token auth.
	Mode  Mode   `json:"mode,omitempty"`
	Token string `json:"token,omitempty"` // a names.State*; "" when not a token target
	// PullSecret and AutoscalerTLS are names.State* values; "" when not configured or not applicable.
	PullSecret    string         `json:"pullSecret,omitempty"`
	AutoscalerTLS string         `json:"autoscalerTLS,omitempty"`
	StalePods     map[string]int `json:"stalePods"` // by names.Stale* reason
	Deferred      bool           `json:"templatePatchDeferred,omitempty"`
	// Rotation is where the cluster's running containers stand with the token; nil when not applicable.
	Rotation *RotationStatus `json:"rotation,omitempty"`
	// Invalid, for a cluster without Rotation, are its raysync annotations raysync cannot read (with
	// Rotation: Rotation.Invalid), each with the reading applied.
	Invalid []string `json:"invalidAnnotations,omitempty"`
}

// InvalidAnnotations are the cluster's raysync annotations raysync cannot read, with their readings.
func (s ClusterStatus) InvalidAnnotations() []string {
	if s.Rotation != nil {
		return s.Rotation.Invalid
	}
	return s.Invalid
}

// RotationStatus is a cluster's token rotation state, as `syncer status` and the metrics report it.
type RotationStatus struct {
	State  string     `json:"state"`           // current, behind, rotating, blocked
	Policy string     `json:"policy"`          // replace, restart, hold (after any fallback)
	Since  *time.Time `json:"since,omitempty"` // behind or rotating since
	Held   string     `json:"held,omitempty"`  // why the policy fell back to hold
	// Move is how raysync moves the cluster, by its policy or on request: replace or restart; "" when
	// it cannot, and Unmovable says why (whatever the policy: `syncer rotate` refuses it too).
	Move      string `json:"move,omitempty"`
	Unmovable string `json:"unmovable,omitempty"`
	// Invalid are raysync annotations whose values raysync cannot read, each with the reading applied.
	Invalid []string `json:"invalidAnnotations,omitempty"`
}

// InSync reports whether every applicable target is in sync and no pod is stale.
func (s ClusterStatus) InSync() bool {
	for _, st := range []string{s.Token, s.PullSecret, s.AutoscalerTLS} {
		if st != "" && st != names.StateInSync {
			return false
		}
	}
	for _, n := range s.StalePods {
		if n > 0 {
			return false
		}
	}
	if s.Rotation != nil && (s.Rotation.State == names.TokenBehind || s.Rotation.State == names.TokenBlocked || s.Rotation.State == names.TokenNotAdopted) {
		return false
	}
	return !s.Deferred
}

// recordStanding records where the cluster stands with its token, in the plan and its status.
func (p *ClusterPlan) recordStanding(in *ClusterInput, cfg Config, t TokenTarget, holdsCurrent bool) {
	p.Standing = standingOf(in, cfg, t, holdsCurrent)
	st := &RotationStatus{State: p.Standing.State, Policy: p.Standing.Policy, Held: p.Standing.Held, Move: p.Standing.Move, Unmovable: p.Standing.Cannot}
	if !p.Standing.Since.IsZero() {
		since := p.Standing.Since.UTC()
		st.Since = &since
	}
	st.Invalid = p.Standing.Invalid
	p.Status.Rotation = st
	if len(p.Standing.Invalid) > 0 {
		p.warnOnce(in, names.ReasonInvalidAnnotation, strings.Join(p.Standing.Invalid, "; "))
	}
	switch {
	case p.Standing.State == names.TokenNotAdopted:
		p.onceNormal(in, names.ReasonNotAdopted, notAdoptedMessage(p.Standing))
	case p.Standing.Held != "" && p.Standing.State == names.TokenBehind:
		p.warnOnce(in, names.ReasonRotationHeld, "this cluster keeps the token it runs on until it is restarted or deleted: "+p.Standing.Held)
	}
}

// notAdoptedMessage says why raysync moves nothing of a cluster it did not adopt, and what adopting it
// would do.
func notAdoptedMessage(r standing) string {
	would := "hold it (its policy; `syncer rotate` moves it on request)"
	switch {
	case r.Policy == names.PolicyReplace:
		would = "replace it (its RayService starts a new cluster on the canonical token; traffic switches when it is ready)"
	case r.Policy == names.PolicyRestart:
		would = "restart it (every pod stops, then all start on the canonical token)"
	case r.Policy == names.PolicyGateway:
		would = "leave it running (the gateway accepts the canonical token for it)"
	}
	return "this cluster runs on a token raysync did not write (it ran before raysync, or was created while raysync was down): raysync " +
		"replaces or restarts nothing of it until it is adopted (annotation " + names.AdoptAnnotation + "=true, `syncer adopt`, or its namespace in " +
		"the control ConfigMap). Adopting it would " + would
}

// planCluster decides everything about one managed RayCluster: its token target, then its managed
// copies, pod templates and pods. A pure function of its input.
func planCluster(in *ClusterInput, cfg Config) ClusterPlan {
	rc := in.Cluster
	p := ClusterPlan{Status: ClusterStatus{Namespace: rc.GetNamespace(), RayCluster: rc.GetName(), StalePods: map[string]int{}}}
	if crd := rc.GetLabels()[kuberay.OriginatedFromCRDLabel]; crd != "" {
		p.Status.Owner, p.Status.OwnerKind = rc.GetLabels()[kuberay.OriginatedFromNameLabel], names.OwnerKind(crd)
	}
	f := planToken(in, cfg, &p)
	if cfg.Pods.enabled() {
		planPodConfig(in, cfg, &p)
	}
	planGatewayAddress(in, cfg, &p)
	if p.Status.Rotation == nil { // with a token, recordStanding said it
		for _, v := range []string{invalidSkip(rc), invalidRotate(rc)} {
			if v != "" {
				p.Status.Invalid = append(p.Status.Invalid, v)
			}
		}
		if len(p.Status.Invalid) > 0 {
			p.warnOnce(in, names.ReasonInvalidAnnotation, strings.Join(p.Status.Invalid, "; "))
		}
	}
	if f != nil {
		// Last: the template patch carries the resourceVersion the record's patch would change.
		p.recordToken(f)
	}
	return p
}

// warnOnce plans a Warning Event on the cluster once per generation and reason.
func (p *ClusterPlan) warnOnce(in *ClusterInput, reason, message string) {
	if in.reportOnly {
		return
	}
	gen := generationKey(in.Cluster)
	if in.Memory.warned[reason] == gen {
		return
	}
	p.Actions = append(p.Actions, RecordEvent{Object: in.Cluster, Type: corev1.EventTypeWarning, Reason: reason,
		Message: message, DedupKey: reason, DedupValue: gen})
}

// onceNormal plans a Normal Event on the cluster once per generation and reason (as warnOnce).
func (p *ClusterPlan) onceNormal(in *ClusterInput, reason, message string) {
	if in.reportOnly {
		return
	}
	gen := generationKey(in.Cluster)
	if in.Memory.warned[reason] == gen {
		return
	}
	p.Actions = append(p.Actions, RecordEvent{Object: in.Cluster, Type: corev1.EventTypeNormal, Reason: reason,
		Message: message, DedupKey: reason, DedupValue: gen})
}

func (p *ClusterPlan) event(in *ClusterInput, typ, reason, message string) {
	if in.reportOnly {
		return
	}
	p.Actions = append(p.Actions, RecordEvent{Object: in.Cluster, Type: typ, Reason: reason, Message: message})
}

func generationKey(rc *unstructured.Unstructured) string {
	return string(rc.GetUID()) + "/" + strconv.FormatInt(rc.GetGeneration(), 10)
}

// worst orders states by how much attention they need ("" is no state yet).
func worst(a, b string) string {
	if a == "" {
		return b
	}
	rank := func(s string) int {
		switch s {
		case names.StateOutOfSync:
			return 1
		case names.StateNotOwned:
			return 2
		case names.StateSourceInvalid:
			return 3
		}
		return 0
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}
