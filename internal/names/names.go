// Package names holds every name raysync's users see or match on: the labels and annotations it
// writes, the reasons of its Events, and the label values of its metrics. Each is part of raysync's
// interface: dashboards, alerts, kubectl selectors and GitOps rules depend on them.
package names

// Labels and annotations raysync writes.
const (
	// ManagedByLabel marks Secrets raysync created and may update or delete (its managed copies).
	ManagedByLabel = "raysync.dev/managed-by"
	ManagedByValue = "raysync"

	// SkipAnnotation on a RayCluster ("true") makes raysync leave it alone. A value other than "true"
	// or "false" is read as false, as before it was said (raysync keeps managing the cluster), and is
	// reported (Event InvalidAnnotation, raysync_invalid_annotations, syncer status).
	SkipAnnotation = "raysync.dev/skip"
	// SourceAnnotation on a target names the source (NAMESPACE/NAME) it was last written from.
	SourceAnnotation = "raysync.dev/source"
	// KindAnnotation on a managed copy says what it is a copy of (a Kind).
	KindAnnotation = "raysync.dev/kind"
	// TokenSHA256Annotation: a short digest of the token, on the Secret that holds the token anyway,
	// so people can compare targets without reading them. Never logged, never in an Event or metric.
	TokenSHA256Annotation = "raysync.dev/token-sha256"
	// SyncedAtAnnotation: when raysync wrote the token it holds (RFC 3339); on a Secret raysync created
	// holding it, the second before its creation (no container can have read it earlier).
	SyncedAtAnnotation = "raysync.dev/synced-at"
	// WrittenUnderPodsAnnotation (RFC 3339, the write's time) on a token target raysync wrote over a
	// token while a kubelet could read it (every write over a token but a restart's, with the cluster
	// suspended and no pod left): a kubelet may have read the earlier value just before the write, or
	// from a cache that had not seen it yet, so raysync recycles the cluster's pods whose containers
	// started around the write. raysync 0.2 wrote "true" (the time was then its synced-at).
	WrittenUnderPodsAnnotation = "raysync.dev/written-under-pods"
)

// Rotation: how a running cluster moves to a new canonical token (README, "Rotation").
const (
	// RotationAnnotation on a RayCluster (RayServices and RayJobs copy theirs onto their clusters)
	// chooses the cluster's policy: replace, restart, hold or gateway. A value raysync does not know is
	// read as hold, the safest, and reported (Event InvalidAnnotation, raysync_invalid_annotations).
	RotationAnnotation = "raysync.dev/rotation"
	PolicyReplace      = "replace"
	PolicyRestart      = "restart"
	PolicyHold         = "hold"
	// PolicyGateway (with the gateway on): a rotation changes what the gateway accepts and moves no
	// cluster; `syncer rotate` moves them when the platform chooses.
	PolicyGateway = "gateway"

	// RotationIDAnnotation is the rotation number raysync writes into a RayService's head pod template:
	// changing it makes KubeRay start a new cluster (a rotation number, never the token or its hash).
	RotationIDAnnotation = "raysync.dev/rotation-id"
	// RotationStartedAnnotation marks a replacement (on the RayService) or a restart (on the RayCluster)
	// in flight since that time; RotationTargetAnnotation names the rotation it moves to.
	RotationStartedAnnotation = "raysync.dev/rotation-started"
	RotationTargetAnnotation  = "raysync.dev/rotation-target"
	// RotationBlockedAnnotation records when raysync reported the rotation in flight as blocked.
	RotationBlockedAnnotation = "raysync.dev/rotation-blocked"
	// RotateAnnotation is set by `syncer rotate`: rotate this cluster now, whatever its policy. Any value
	// is a request but "false", which asks for nothing: read as no request and reported (Event
	// InvalidAnnotation, raysync_invalid_annotations, syncer status).
	RotateAnnotation = "raysync.dev/rotate"
	// RotationAbandonedAnnotation names the rotation whose restart raysync gave up on a cluster (it
	// resumed the cluster on the token it had): its policy does not restart it again for that rotation.
	RotationAbandonedAnnotation = "raysync.dev/rotation-abandoned"

	// TokenRotationAnnotation on a RayCluster: the rotation whose token raysync wrote into the cluster's
	// auth Secret, and TokenWrittenAtAnnotation when (RFC 3339): containers started after that hold it.
	// A rotation number and a time, never the token or its hash (more people read RayClusters than
	// Secrets). It outlives the Secret, so a Secret deleted or re-created under running containers
	// can be given back the token they hold.
	TokenRotationAnnotation  = "raysync.dev/token-rotation"
	TokenWrittenAtAnnotation = "raysync.dev/token-written-at"

	// KindRotationLedger marks the Secret that numbers the canonical tokens raysync has seen.
	KindRotationLedger = "rotation_ledger"
	// KindWebhookCertificate marks the Secret holding the webhook's CA and serving certificate.
	KindWebhookCertificate = "webhook_certificate"
	// KindGatewayTable marks the Secret raysync publishes for the gateway; KindGatewayAddress the
	// ExternalName Services <name>-gw pointing at the gateway.
	KindGatewayTable   = "gateway_table"
	KindGatewayAddress = "gateway_address"
	// PreviousRevokedAnnotation on the ledger: the rotation whose previous token the gateway no longer
	// accepts (`syncer revoke-previous`).
	PreviousRevokedAnnotation = "raysync.dev/previous-revoked"
)

// Adoption and the emergency stop: what an operator sets to let raysync move clusters that ran before
// it, or to stop it moving any (docs/guides/running-fleet.md).
const (
	// AdoptAnnotation ("true") on a RayService, RayJob or RayCluster, set by a user or `syncer adopt`:
	// raysync may move its clusters by their policy, although they run on a token raysync did not write.
	AdoptAnnotation = "raysync.dev/adopt"
	// AdoptedAnnotation (RFC 3339) on a RayService: when raysync adopted it (by AdoptAnnotation, the
	// control ConfigMap, or because it had written the token of one of its clusters). Its later
	// clusters, born on KubeRay's token while raysync was down, then move by its policy.
	AdoptedAnnotation = "raysync.dev/adopted"

	// Keys of the control ConfigMap (--control), which raysync reads and never writes.
	// ControlPausedKey "true": no replacement or restart starts (those in flight finish); anything but
	// "", "false" or "true" counts as "true". ControlReasonKey and ControlPausedAtKey say why and
	// since when (`syncer pause` writes them).
	ControlPausedKey   = "paused"
	ControlReasonKey   = "reason"
	ControlPausedAtKey = "paused-at"
	// ControlAdoptKey: "all", or the namespaces (separated by commas or spaces) whose clusters raysync adopts.
	ControlAdoptKey = "adopt"
)

// Token rotation states: raysync_rotation_clusters{state} and `syncer status`.
const (
	TokenCurrent = "current"
	TokenBehind  = "behind"
	// TokenNotAdopted: behind, on a token raysync did not write (the cluster ran before raysync, or was
	// born while it was down), and not adopted: raysync moves nothing of it.
	TokenNotAdopted = "not_adopted"
	TokenRotating   = "rotating"
	TokenBlocked    = "blocked"
)

// TokenStates lists every token rotation state.
var TokenStates = []string{TokenCurrent, TokenBehind, TokenNotAdopted, TokenRotating, TokenBlocked}

// OwnerKind is the kind of the KubeRay resource a RayCluster belongs to: the RayService or RayJob that
// generated it (KubeRay's ray.io/originated-from-crd label), or RayCluster for a standalone cluster.
// It is also the kind of the object a rotation patches, and the label value of
// raysync_rotation_clusters{kind}. Not a Kind, which is what a target holds.
type OwnerKind string

const (
	OwnerRayService OwnerKind = "RayService"
	OwnerRayJob     OwnerKind = "RayJob"
	// OwnerRayCluster: a standalone RayCluster, which is its own owner.
	OwnerRayCluster OwnerKind = "RayCluster"
)

// OwnerKinds lists every OwnerKind, so raysync_rotation_clusters reports zeros instead of missing series.
var OwnerKinds = []OwnerKind{OwnerRayService, OwnerRayJob, OwnerRayCluster}

// Kind is what a target holds: the label value of raysync_targets{kind} and raysync_target_in_sync{kind},
// and the value of KindAnnotation on managed copies.
type Kind string

const (
	KindAuthToken     Kind = "auth_token"
	KindPullSecret    Kind = "pull_secret"
	KindAutoscalerTLS Kind = "autoscaler_tls"
)

// Kinds lists every Kind.
var Kinds = []Kind{KindAuthToken, KindPullSecret, KindAutoscalerTLS}

// ParseKind reads KindAnnotation, accepting the spelling raysync 0.1 wrote ("pull-secret", …).
func ParseKind(v string) (Kind, bool) {
	switch v {
	case string(KindAuthToken), "auth-token":
		return KindAuthToken, true
	case string(KindPullSecret), "pull-secret":
		return KindPullSecret, true
	case string(KindAutoscalerTLS), "autoscaler-tls":
		return KindAutoscalerTLS, true
	}
	return "", false
}

// Target states: raysync_targets{state}, and `syncer status` (with "-" for "_").
const (
	StateInSync        = "in_sync"
	StateOutOfSync     = "out_of_sync"
	StateNotOwned      = "not_owned"
	StateSourceInvalid = "source_invalid"
	// StateMissing: the token target was deleted under running containers whose token raysync cannot
	// tell, so it cannot re-create it; new pods cannot start on the cluster's token.
	StateMissing = "missing"
	// StateFrozen: the token target holds the token the cluster's running containers started with,
	// not the canonical one, and stays so until the cluster's rotation policy moves it as a whole
	// (raysync_rotation_clusters says behind or blocked). It is as raysync wants it.
	StateFrozen = "frozen"
)

// AsWanted says whether a target in state st is as raysync wants it (raysync_target_in_sync 1).
func AsWanted(st string) bool { return st == StateInSync || st == StateFrozen }

// States lists every target state, so raysync_targets reports zeros instead of missing series.
var States = []string{StateInSync, StateFrozen, StateOutOfSync, StateNotOwned, StateSourceInvalid, StateMissing}

// Sync results: raysync_sync_total{result}.
const (
	ResultCreated   = "created"
	ResultUpdated   = "updated"
	ResultUnchanged = "unchanged"
	ResultRefused   = "refused"
	ResultError     = "error"
)

// Results lists every sync result.
var Results = []string{ResultCreated, ResultUpdated, ResultUnchanged, ResultRefused, ResultError}

// Why a pod is stale or was recycled: raysync_stale_pods{reason}, raysync_pods_recycled_total{reason}.
const (
	StalePullSecret    = string(KindPullSecret)
	StaleAutoscalerTLS = string(KindAutoscalerTLS)
	// RecycledAuthToken: a pod whose containers started around raysync's write of its auth Secret
	// and may hold the value it held before (recycled only, never stale).
	RecycledAuthToken = string(KindAuthToken)
)

// Event reasons (on the RayCluster, except SourceInvalid, which is on the source Secret).
const (
	ReasonTokenProjected        = "TokenProjected"
	ReasonTokenRotated          = "TokenRotated"
	ReasonTargetNotOwned        = "TargetNotOwned"
	ReasonTargetMissing         = "TargetMissing"
	ReasonSourceInvalid         = "SourceInvalid"
	ReasonSourceKeyMismatch     = "SourceKeyMismatch"
	ReasonInvalidSpec           = "InvalidSpec"
	ReasonTemplatePatched       = "TemplatePatched"
	ReasonTemplatePatchDeferred = "TemplatePatchDeferred"
	ReasonPodRecycled           = "PodRecycled"
	ReasonStalePodConfig        = "StalePodConfig"
	ReasonRotationStarted       = "RotationStarted"
	ReasonRotationCompleted     = "RotationCompleted"
	ReasonRotationBlocked       = "RotationBlocked"
	ReasonRotationRetried       = "RotationRetried"
	ReasonRotationHeld          = "RotationHeld"
	ReasonRotationNotNeeded     = "RotationNotNeeded"
	ReasonTokenRestored         = "TokenRestored"
	// ReasonLedgerInvalid (on the rotation ledger Secret): raysync cannot read its ledger and leaves
	// it as it is; it numbers no rotation until the ledger is fixed.
	ReasonLedgerInvalid     = "LedgerInvalid"
	ReasonRotationAbandoned = "RotationAbandoned"
	// ReasonNotAdopted (on the RayCluster): it runs on a token raysync did not write, and raysync will
	// not replace or restart it until it is adopted.
	ReasonNotAdopted = "NotAdopted"
	// ReasonInvalidAnnotation (Warning, on the RayCluster): a raysync annotation has a value raysync
	// does not know; it applies the safest reading, which the message names.
	ReasonInvalidAnnotation = "InvalidAnnotation"
	// ReasonControlInvalid (Warning, on the control ConfigMap): a value raysync cannot read; the message
	// says which, and the safe reading applied (paused, or the namespace not adopted).
	ReasonControlInvalid = "ControlInvalid"
	// ReasonWriteFailed (Warning, on the RayCluster): an API write raysync planned was refused (a policy
	// engine, a quota, RBAC); what depends on it waits, the rest of the cluster's plan went on.
	ReasonWriteFailed = "WriteFailed"
)

// Why raysync gave up a restart and resumed the cluster: raysync_rotations_abandoned_total{reason}.
const (
	// AbandonCannotMove: every pod is gone, but the cluster's Secret cannot take the new token (other
	// clusters run on it, or it is not raysync's).
	AbandonCannotMove = "cannot_move"
	// AbandonTimeout: still suspended after --rotation-timeout (its pods did not go, or the source stayed unusable).
	AbandonTimeout = "timeout"
	// AbandonUnmanaged: raysync no longer manages the cluster (out of scope, skipped, no token auth).
	AbandonUnmanaged = "unmanaged"
	// AbandonNoNewCluster: a replacement whose RayService started no new cluster (KubeRay's zero-downtime
	// upgrade is off: ENABLE_ZERO_DOWNTIME=false, the incremental upgrade's gate, the RayService suspended).
	AbandonNoNewCluster = "no_new_cluster"
)

// AbandonReasons lists every reason a replacement or restart is abandoned.
var AbandonReasons = []string{AbandonCannotMove, AbandonTimeout, AbandonUnmanaged, AbandonNoNewCluster}

// TLSVolumeName is the head pod volume raysync adds for the autoscaler's client certificate.
const TLSVolumeName = "raysync-autoscaler-tls"

// FieldManager is raysync's field manager on every write.
const FieldManager = "raysync"

// Admission outcomes: raysync_admission_requests_total{result} and the webhook's logs.
const (
	AdmitMutated   = "mutated"   // raysync's entries added to a pod
	AdmitCreated   = "created"   // raysync created the cluster's auth Secret itself, with the canonical token (KubeRay's create then fails with AlreadyExists)
	AdmitUnchanged = "unchanged" // it already carries them, the Secret exists already, or raysync has nothing to add
	AdmitSkipped   = "skipped"   // not raysync's to change now (the reason says why)
	AdmitInvalid   = "invalid"   // the request or its object could not be read, or is over the webhook's limits
	AdmitBusy      = "busy"      // answered 503: the reviews in hand held the webhook's memory budget for longer than it waits
)

// AdmitResults lists every admission outcome.
var AdmitResults = []string{AdmitMutated, AdmitCreated, AdmitUnchanged, AdmitSkipped, AdmitInvalid, AdmitBusy}
