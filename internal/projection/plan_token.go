package projection

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// Mode is how KubeRay finds a cluster's token Secret.
type Mode string

const (
	// Generated: KubeRay generates (or adopts) a Secret named CheckName(<cluster>), owned by the cluster.
	Generated Mode = "generated"
	// Referenced: KubeRay v1.6+ reads spec.authOptions.secretName and creates nothing.
	Referenced Mode = "referenced"
)

// TokenTarget is the Secret a RayCluster's pods read RAY_AUTH_TOKEN from.
type TokenTarget struct {
	Mode      Mode
	Namespace string
	Name      string
	// IsSource: referenced mode naming the canonical source itself; nothing to write.
	IsSource bool
}

// TokenTargetFor says where rc's token lives. ok is false for clusters without token auth or with
// Kubernetes token auth; err reports a malformed spec.authOptions.
func TokenTargetFor(rc *unstructured.Unstructured, source types.NamespacedName) (t TokenTarget, ok bool, err error) {
	auth := kuberay.ReadAuthOptions(rc)
	if auth.Err != nil {
		return t, false, auth.Err
	}
	if !auth.TokenAuth() {
		return t, false, nil
	}
	if auth.SecretName != "" {
		return TokenTarget{
			Mode: Referenced, Namespace: rc.GetNamespace(), Name: auth.SecretName,
			IsSource: rc.GetNamespace() == source.Namespace && auth.SecretName == source.Name,
		}, true, nil
	}
	return TokenTarget{Mode: Generated, Namespace: rc.GetNamespace(), Name: kuberay.CheckName(rc.GetName())}, true, nil
}

// planToken decides rc's token target: create it in KubeRay's shape (or as a managed copy), write
// the canonical token into it while no container that reads it can have started, or refuse a Secret
// raysync does not own. Once a container may have read it, the target keeps the token it holds: the
// clusters reading it move to a new token only as a whole (plan_rotation.go).
// It returns what it read of the target (nil without one), for the RayCluster's record (recordToken).
func planToken(in *ClusterInput, cfg Config, p *ClusterPlan) *tokenFacts {
	t, ok, err := TokenTargetFor(in.Cluster, cfg.Source)
	if err != nil {
		p.warnOnce(in, names.ReasonInvalidSpec, fmt.Sprintf("raysync cannot read spec.authOptions: %v; leaving this cluster alone", err))
		return nil
	}
	if !ok {
		return nil
	}
	p.Status.Mode = t.Mode
	f := tokenFactsOf(in, cfg, t)
	c := classifyTokenTarget(f)
	p.TokenCase = string(c)
	if p.actOnToken(f, c, cfg) {
		return f
	}
	return nil
}

// tokenCase is what raysync makes of a cluster's token target: the first of tokenChecks that holds.
type tokenCase string

const (
	// tokenSourceInvalid: the canonical source is unusable; every target keeps its token.
	tokenSourceInvalid tokenCase = "source_invalid"
	// tokenSourceKeyMismatch: spec.authOptions.secretName names the source, which keeps its token
	// under another key than the one KubeRay reads.
	tokenSourceKeyMismatch tokenCase = "source_key_mismatch"
	// tokenIsSource: the cluster reads the source itself; raysync writes nothing.
	tokenIsSource tokenCase = "is_source"
	// tokenNotOwned: a Secret raysync may not write holds the target's name.
	tokenNotOwned tokenCase = "not_owned"
	// tokenMissing: deleted under running containers whose token raysync cannot tell.
	tokenMissing tokenCase = "missing"
	// tokenLeftToKubeRay: absent, and KubeRay creates it (--no-precreate).
	tokenLeftToKubeRay tokenCase = "left_to_kuberay"
	// tokenCreate: absent, and nothing runs on a token other than the current one: raysync creates it.
	tokenCreate tokenCase = "create"
	// tokenRelabel: a managed copy holding the current token, annotated for an earlier source.
	tokenRelabel tokenCase = "relabel"
	// tokenInSync: holds the current token.
	tokenInSync tokenCase = "in_sync"
	// tokenRestore: changed under containers known to run on the current token: put back.
	tokenRestore tokenCase = "restore"
	// tokenFrozen: containers run on the token it holds: it keeps that token.
	tokenFrozen tokenCase = "frozen"
	// tokenMayHaveBeenRead: no container says it started, but one may have read the target: it keeps its token.
	tokenMayHaveBeenRead tokenCase = "may_have_been_read"
	// tokenWrite: no container can have read it yet: raysync writes the current token.
	tokenWrite tokenCase = "write"
)

// tokenFacts is what the token checks read about one cluster's target.
type tokenFacts struct {
	in *ClusterInput
	// source, noPrecreate and ledger are what the checks read of the Config (not a copy of it: the
	// facts are built for every cluster on every scrape).
	source      types.NamespacedName
	noPrecreate bool
	ledger      bool
	t           TokenTarget
	src         *source        // the token source, shared by every cluster of a scrape (read only)
	cur         *corev1.Secret // the target as cached; nil when absent
	// readers are every pod that reads the target: this cluster's, and those of other clusters naming it.
	readers []*corev1.Pod
	// started: a container of a reader has started. onCurrent: every one that started can only hold
	// the current token (startedOnCurrent).
	started, onCurrent bool
	// recorded: the target is gone or carries no mark of raysync's, and the RayClusters' records say
	// that every container started among the readers holds the current token, written at recordedAt
	// (recordedOnCurrent).
	recorded   bool
	recordedAt time.Time
}

func tokenFactsOf(in *ClusterInput, cfg Config, t TokenTarget) *tokenFacts {
	f := &tokenFacts{in: in, source: cfg.Source, noPrecreate: cfg.NoPrecreate, ledger: cfg.Ledger.Name != "", t: t,
		src: &in.Sources.token, cur: in.Target, readers: in.Pods}
	if len(in.Readers) > 0 {
		f.readers = append(slices.Clip(in.Pods), in.Readers...)
	}
	f.started = anyStarted(f.readers)
	f.onCurrent = startedOnCurrent(f.readers, in.Target, f.src.digest)
	if f.src.valid() {
		f.recordedAt, f.recorded = recordedOnCurrent(in, f.readers, in.Target, f.src.digest)
	}
	return f
}

// tokenChecks decide a token target's case, cert-manager's policy-chain way: the first that holds
// wins, so each may take every earlier one as not holding. None holding: tokenWrite.
var tokenChecks = []struct {
	is    tokenCase
	holds func(*tokenFacts) bool
}{
	{tokenSourceInvalid, sourceUnusable},
	{tokenSourceKeyMismatch, readsSourceUnderAnotherKey},
	{tokenIsSource, readsSource},
	{tokenNotOwned, foreignUnderTargetName},
	{tokenMissing, deletedUnderUnknownToken},
	{tokenLeftToKubeRay, kubeRayCreatesIt},
	{tokenCreate, absent},
	{tokenNotOwned, notOurs},
	{tokenRelabel, holdsTokenForEarlierSource},
	{tokenInSync, holdsCurrentToken},
	{tokenRestore, changedUnderCurrentContainers},
	{tokenFrozen, readByStartedContainers},
	{tokenMayHaveBeenRead, mayBeRead},
}

// classifyTokenTarget is the case of a cluster's token target.
func classifyTokenTarget(f *tokenFacts) tokenCase {
	for _, c := range tokenChecks {
		if c.holds(f) {
			return c.is
		}
	}
	return tokenWrite
}

func sourceUnusable(f *tokenFacts) bool { return !f.src.valid() }

// readsSourceUnderAnotherKey: Ray pods would fail to start; raysync can only say so.
func readsSourceUnderAnotherKey(f *tokenFacts) bool {
	return f.t.IsSource && f.src.secret != nil && !holdsToken(f.src.secret, f.src.value)
}

func readsSource(f *tokenFacts) bool { return f.t.IsSource }

// foreignUnderTargetName: the caches hold no target, but a Secret that is not raysync's has its name.
func foreignUnderTargetName(f *tokenFacts) bool { return f.cur == nil && f.in.Foreign[f.t.Name] }

// deletedUnderUnknownToken: writing any token would split the cluster. Pods created now cannot start
// (or, generated, get KubeRay's next random token): the cluster is behind and its policy moves it.
// (onCurrent needs a target, so a deleted one leaves every started container's token unknown.)
func deletedUnderUnknownToken(f *tokenFacts) bool { return f.cur == nil && f.started && !f.recorded }

// kubeRayCreatesIt: the admission webhook gives it the token; else raysync writes it as it arrives.
func kubeRayCreatesIt(f *tokenFacts) bool {
	return f.cur == nil && f.t.Mode == Generated && f.noPrecreate && !f.started
}

// absent: a new cluster, or one whose containers hold the current token, as its record says (its
// Secret was deleted).
func absent(f *tokenFacts) bool { return f.cur == nil }

func notOurs(f *tokenFacts) bool { return f.cur != nil && !ownsTokenTarget(f.t, f.in.Cluster, f.cur) }

// holdsTokenForEarlierSource: a copy of an earlier source already holding the token: only raysync's
// annotations change.
func holdsTokenForEarlierSource(f *tokenFacts) bool {
	return holdsCurrentToken(f) && f.t.Mode == Referenced && !copyMetaCurrent(f.cur, f.source, names.KindAuthToken)
}

func holdsCurrentToken(f *tokenFacts) bool { return f.cur != nil && holdsToken(f.cur, f.src.value) }

// changedUnderCurrentContainers: someone changed the Secret under containers raysync saw start on
// the current token (its mark says so, or, when KubeRay re-created it without one, the RayCluster's
// record); left so, the operator and every new pod would use a token the cluster refuses.
func changedUnderCurrentContainers(f *tokenFacts) bool {
	return f.cur != nil && (f.onCurrent || f.recorded)
}

// readByStartedContainers: running containers hold the token the target holds, and it is what raysync
// wants there until a replacement or restart moves the cluster.
func readByStartedContainers(f *tokenFacts) bool { return f.cur != nil && f.started }

// mayBeRead: a kubelet that has a reader pod may have started a container on this token before the
// pod's status says so (raysync was down when KubeRay created it, or the cluster was starting when
// the source rotated): writing now could split the cluster, which its policy moves as a whole.
func mayBeRead(f *tokenFacts) bool {
	return f.cur != nil && mayHaveBeenRead(f.cur, f.readers, f.in.Now, f.in.WatchingSince)
}

// tokenStates is the target state each case reports.
var tokenStates = map[tokenCase]string{
	tokenSourceInvalid:     names.StateSourceInvalid, // the source's own key reports why
	tokenSourceKeyMismatch: names.StateOutOfSync,
	tokenIsSource:          names.StateInSync,
	tokenNotOwned:          names.StateNotOwned,
	tokenMissing:           names.StateMissing,
	tokenLeftToKubeRay:     names.StateOutOfSync,
	tokenCreate:            names.StateOutOfSync,
	tokenRelabel:           names.StateOutOfSync,
	tokenInSync:            names.StateInSync,
	tokenRestore:           names.StateOutOfSync,
	tokenFrozen:            names.StateFrozen, // behind: kept on the token its containers run on
	tokenMayHaveBeenRead:   names.StateFrozen,
	tokenWrite:             names.StateOutOfSync,
}

// actOnToken plans what case c of the token target means: its writes and Events, its state, and
// where the cluster stands. It returns false when raysync leaves the target alone altogether.
func (p *ClusterPlan) actOnToken(f *tokenFacts, c tokenCase, cfg Config) bool {
	in, t, cur, token := f.in, f.t, f.cur, f.src.value
	p.Status.Token = tokenStates[c]
	switch c {
	case tokenSourceInvalid:
		return false
	case tokenNotOwned:
		p.Refused++
		p.warnOnce(in, names.ReasonTargetNotOwned, fmt.Sprintf(
			"Secret %s already exists and is not managed by raysync for this RayCluster; leaving it untouched", t.Name))
		return false
	case tokenSourceKeyMismatch:
		p.TargetHoldsCurrent = true
		p.warnOnce(in, names.ReasonSourceKeyMismatch, fmt.Sprintf(
			"spec.authOptions.secretName names the canonical source %s, but KubeRay reads key %q and the source keeps its token in %q: Ray pods will fail to start",
			cfg.Source, kuberay.AuthTokenKey, cfg.SourceKey))
	case tokenIsSource:
		p.TargetHoldsCurrent = true
	case tokenMissing:
		p.warnOnce(in, names.ReasonTargetMissing, missingMessage(t))
	case tokenCreate:
		at := bornAt(in.Now)
		if f.recorded {
			at = f.recordedAt // the containers hold what raysync wrote then: the mark says so again
		}
		desired := desiredManagedCopy(t.Namespace, t.Name, token, cfg.Source, at)
		if t.Mode == Generated {
			desired = desiredGeneratedSecret(in.Cluster, t.Name, token, cfg.Source, at)
		}
		if f.recorded {
			p.Actions = append(p.Actions, CreateSecret{Secret: desired})
			p.event(in, corev1.EventTypeWarning, names.ReasonTokenRestored, restoredFromRecordMessage(t, in, cfg.Source))
			break
		}
		p.Actions = append(p.Actions, CreateSecret{Secret: desired, Propagates: true})
		p.event(in, corev1.EventTypeNormal, names.ReasonTokenProjected, projectedMessage(cfg.Source))
	case tokenRelabel:
		p.TargetHoldsCurrent = true
		p.Actions = append(p.Actions, UpdateSecret{Secret: withCopyMeta(cur, cfg.Source, names.KindAuthToken)})
	case tokenInSync:
		p.Unchanged, p.TargetHoldsCurrent = true, true
		p.recycleRacedPods(f)
	case tokenRestore:
		if !f.onCurrent {
			// Over KubeRay's re-created Secret: a pod may have read its random token meanwhile, so the
			// restore carries the raced-reader mark as any write over a token does.
			desired := withToken(cur, token, cfg.Source, f.recordedAt)
			markRace(desired, cur, in.Now)
			p.Actions = append(p.Actions, UpdateSecret{Secret: desired, MarksRace: true})
			p.event(in, corev1.EventTypeWarning, names.ReasonTokenRestored, restoredFromRecordMessage(t, in, cfg.Source))
			break
		}
		p.Actions = append(p.Actions, UpdateSecret{Secret: withToken(cur, token, cfg.Source, syncedAtOr(cur, in.Now))})
		p.event(in, corev1.EventTypeWarning, names.ReasonTokenRestored,
			"auth Secret was changed under running Ray containers; restored the token they run on, from "+cfg.Source.String())
	case tokenFrozen:
		p.Unchanged = true
	case tokenWrite:
		reason, message := names.ReasonTokenProjected, projectedMessage(cfg.Source)
		if cur.Annotations[names.TokenSHA256Annotation] != "" {
			reason, message = names.ReasonTokenRotated, "auth Secret updated to the rotated canonical token from "+cfg.Source.String()
		}
		desired := withToken(cur, token, cfg.Source, in.Now)
		marks := !provablyUnread(f) && markRace(desired, cur, in.Now)
		p.Actions = append(p.Actions, UpdateSecret{Secret: desired, Propagates: true, MarksRace: marks})
		p.event(in, corev1.EventTypeNormal, reason, message)
	}
	p.recordStanding(in, cfg, t, runsOnCurrent(f, c))
	return true
}

func restoredFromRecordMessage(t TokenTarget, in *ClusterInput, source types.NamespacedName) string {
	return fmt.Sprintf("auth Secret %s was deleted or re-created under Ray containers that run on the current canonical token (rotation %s, "+
		"as recorded on the RayCluster); put that token back, from %s", t.Name, in.Sources.rotation.Name(), source)
}

// runsOnCurrent says whether, in case c, the cluster's containers hold (or will start with) the
// current token.
func runsOnCurrent(f *tokenFacts, c tokenCase) bool {
	switch c {
	case tokenIsSource, tokenSourceKeyMismatch:
		// containers started before the source last changed hold its old token
		return !startedBefore(f.in.Pods, f.in.Sources.rotation.FirstSeen)
	case tokenMissing, tokenFrozen, tokenMayHaveBeenRead:
		return false
	}
	return true
}

func missingMessage(t TokenTarget) string {
	if t.Mode == Generated {
		return fmt.Sprintf("auth Secret %s was deleted while Ray containers run on a token raysync cannot tell: KubeRay re-creates it with "+
			"a random token those containers refuse, and new pods start on it; restart or replace the cluster to move it to the canonical token", t.Name)
	}
	return fmt.Sprintf("auth Secret %s was deleted while Ray containers of the clusters naming it run on a token raysync cannot tell: "+
		"new Ray pods cannot start (CreateContainerConfigError) until it exists again; restart those clusters together, or re-create it "+
		"with the token they run on", t.Name)
}

// bornAt is the synced-at of a Secret raysync creates holding the token: the second before it is
// created. Nothing can have read it earlier, so a container started in the very second it was created
// counts as holding its token (startedOnCurrent counts from the second after synced-at), which a write
// into an existing Secret cannot claim: a container may have read the earlier value in that second.
// raysync creates one only while no container that reads it has started.
func bornAt(now time.Time) time.Time { return now.Truncate(time.Second).Add(-time.Second) }

// readWindow: KubeRay creates a cluster's Secret and pods in one pass, and raysync, watching, replaces
// its token within milliseconds; a kubelet takes longer than this to start a container of a pod it was
// just given. (creationTimestamp has whole seconds, so the window is 1-2 s of real age.)
const readWindow = 2 * time.Second

// mayHaveBeenRead reports whether a container of any of the reader pods may have started on s, which
// none of them reports started: the kubelet reads the env when it creates a container, before it
// says the container started. A pod is known unread only when no kubelet has it, or when its kubelet
// says that every one of its containers waits for something that comes before the env is read (the
// image, the env itself, or an init container that does). A pod on a node whose kubelet has said
// nothing yet is taken as unread only for a Secret of KubeRay's that raysync saw arrive (created after
// watchingSince) less than readWindow ago: the one heuristic, a kubelet's start latency.
func mayHaveBeenRead(s *corev1.Secret, readers []*corev1.Pod, now, watchingSince time.Time) bool {
	created := s.CreationTimestamp.Time
	young := s.Annotations[names.TokenSHA256Annotation] == "" && !created.Before(watchingSince) && now.Sub(created) < readWindow
	return slices.ContainsFunc(readers, func(p *corev1.Pod) bool { return podMayHaveRead(p, young) })
}

// A write over a token races the kubelets that read it: a container may have read the earlier value
// until every kubelet sees the write, and start a little later. raysync marks such a write with its
// time (names.WrittenUnderPodsAnnotation) and recycles the cluster's pods with a container that
// started in the window where it may hold the earlier value (recycleRacedPods). The window's margins:
const (
	// writeAckSlack: the mark's time is when raysync sent the write; the applier stamps it again with
	// the acknowledgement when that came later than this (markRace's UpdateSecret.MarksRace).
	writeAckSlack = 500 * time.Millisecond
	// kubeletWatchLag: how long after the acknowledgement a kubelet's Secret cache (a watch) may still
	// hand out the earlier value (kubernetes#129645; 0 of 16 stale starts measured on the real node,
	// docs/contributing/real-node.md).
	kubeletWatchLag = time.Second
	// createLatency bounds how long a kubelet that read a container's env takes to start it; meanwhile its
	// status may still show the last attempt's waiting reason (ImagePullBackOff, CreateContainerConfigError:
	// 21 ms on the real node, docs/contributing/standin.md). The margin leaves room for a loaded node.
	createLatency = time.Second
	// clockSkew: how far a node's clock may run ahead of raysync's (the container start times are the
	// node's). NTP keeps nodes within milliseconds; docs/concepts/token-projection.md says this bound.
	clockSkew = 500 * time.Millisecond
	// raceWindow is how long after a marked write a container may start holding the earlier value.
	raceWindow = writeAckSlack + kubeletWatchLag + createLatency + clockSkew
)

// provablyUnread: no kubelet can read the target now, from the objects alone: the cluster is suspended
// (KubeRay creates no pod) and no pod of any cluster reading the target is left, as in a restart. Any
// other write over a token is marked: a cache that lags the API server (raysync just restarted, or is
// busy) may show a pod unbound that a kubelet already runs.
func provablyUnread(f *tokenFacts) bool { return suspended(f.in.Cluster) && len(f.readers) == 0 }

// markRace marks desired, the write over cur, as raced by kubelets that may have read cur's token (at
// now: the applier stamps the time the write is sent). A Secret that held no token is not marked:
// there was nothing to read. It reports whether it marked.
func markRace(desired, cur *corev1.Secret, now time.Time) bool {
	if len(cur.Data[kuberay.AuthTokenKey]) == 0 {
		return false
	}
	desired.Annotations[names.WrittenUnderPodsAnnotation] = now.UTC().Format(time.RFC3339Nano)
	return true
}

// raced is the window of container start times (whole seconds, the node's clock) in which a container
// may hold the token s held before raysync's marked write: from the second s was created (nothing read
// it earlier) to raceWindow after the write. visible is when every kubelet sees the write: a pod created
// later reads the written token. ok is false when s carries no mark. A mark of raysync 0.2 ("true") took
// its time from the synced-at annotation.
func raced(s *corev1.Secret) (from, until, visible time.Time, ok bool) {
	v := s.Annotations[names.WrittenUnderPodsAnnotation]
	if v == "" {
		return from, until, visible, false
	}
	at, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		if at = syncedAt(s); at.IsZero() {
			return from, until, visible, false
		}
	}
	return s.CreationTimestamp.Truncate(time.Second), at.Add(raceWindow), at.Add(writeAckSlack + kubeletWatchLag + clockSkew), true
}

// startedIn reports whether a container started (whole seconds) in [from, until).
func startedIn(cs corev1.ContainerStatus, from, until time.Time) bool {
	s := containerStartedAt(cs)
	return !s.IsZero() && !s.Before(from) && s.Before(until)
}

// recycleRacedPods deletes the cluster's pods that may hold the token its target held before raysync's
// marked write of the current one: a pod created before every kubelet could see the write, with a
// container (init containers included) that started in the raced window. Creation and start times are
// durable, so every replica and every restart decides alike, whenever the caches show them; KubeRay
// recreates the pod, and the new one reads the current token. A pod younger than RecycleGrace is
// deleted once it is that old (KubeRay stalls the recreation of a pod it has not seen yet).
func (p *ClusterPlan) recycleRacedPods(f *tokenFacts) {
	cur := f.cur
	from, until, visible, ok := raced(cur)
	if !ok || cur.Annotations[names.TokenSHA256Annotation] != f.src.digest {
		return
	}
	early := func(cs corev1.ContainerStatus) bool { return startedIn(cs, from, until) }
	for _, pod := range f.in.Pods {
		if pod.DeletionTimestamp != nil || !controlledBy(pod, f.in.Cluster.GetUID()) || !pod.CreationTimestamp.Time.Before(visible) ||
			!slices.ContainsFunc(pod.Status.InitContainerStatuses, early) && !slices.ContainsFunc(pod.Status.ContainerStatuses, early) {
			continue
		}
		if age := f.in.Now.Sub(pod.CreationTimestamp.Time); age < RecycleGrace {
			if wait := RecycleGrace - age; p.RequeueAfter == 0 || wait < p.RequeueAfter {
				p.RequeueAfter = wait
			}
			continue
		}
		p.Actions = append(p.Actions, DeletePod{Pod: pod, Missing: []string{names.RecycledAuthToken}})
		p.event(f.in, corev1.EventTypeNormal, names.ReasonPodRecycled, fmt.Sprintf(
			"deleted pod %s: a container started before %s, within %s of raysync's write of the canonical token into Secret %s, and may hold the "+
				"token the Secret held before; KubeRay recreates it on the canonical token", pod.Name, until.UTC().Format(time.RFC3339), raceWindow, f.t.Name))
	}
}

// startedOnCurrent reports, from durable state alone (so every replica and every restart plans the
// same), whether the containers that have started among readers can only hold the current canonical
// token: the target carries raysync's mark of having written that token (at its synced-at time), and
// every started container started after that write (and outside the window of a raced write,
// recycleRacedPods). Nothing else tells which token a running
// container holds: a Secret KubeRay wrote while raysync was down carries no mark, and a deleted one
// leaves nothing, so raysync writes no token under such containers (the cluster is behind, or its
// target missing, and its policy moves it as a whole). A foreign write between raysync's and a
// container's start is not seen (the mark stays); containers then hold that writer's token.
func startedOnCurrent(readers []*corev1.Pod, target *corev1.Secret, digest string) bool {
	if target == nil || target.Annotations[names.TokenSHA256Annotation] != digest || !anyStarted(readers) {
		return false
	}
	written, err := time.Parse(time.RFC3339Nano, target.Annotations[names.SyncedAtAnnotation])
	if err != nil {
		return false
	}
	after := written.Truncate(time.Second).Add(time.Second) // container start times are in whole seconds
	from, until, visible, marked := raced(target)
	return !slices.ContainsFunc(readers, func(p *corev1.Pod) bool {
		racedPod := marked && p.CreationTimestamp.Time.Before(visible)
		late := func(cs corev1.ContainerStatus) bool {
			s := containerStartedAt(cs)
			return s.IsZero() || !s.Before(after) && !(racedPod && startedIn(cs, from, until))
		}
		return podStarted(p) && (!allOf(p.Status.InitContainerStatuses, late) || !allOf(p.Status.ContainerStatuses, late))
	})
}

func allOf[T any](s []T, f func(T) bool) bool {
	return !slices.ContainsFunc(s, func(v T) bool { return !f(v) })
}

// beforeEnv are the waiting reasons of a container whose env the kubelet has not resolved yet.
var beforeEnv = []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"}

func podMayHaveRead(p *corev1.Pod, young bool) bool {
	if podStarted(p) {
		return true
	}
	if p.Spec.NodeName == "" {
		return false
	}
	all := append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...)
	if len(all) == 0 {
		return !young
	}
	first := firstInitContainer(p)
	return slices.ContainsFunc(all, func(cs corev1.ContainerStatus) bool { return !waitsBeforeEnv(cs, first) })
}

// waitsBeforeEnv reports whether a container of a pod where nothing has started waits for something
// that comes before the kubelet reads its env. PodInitializing is no such reason by itself: it is the
// kubelet's default state in a pod with init containers, shown for every container until it runs, so
// also while the kubelet creates it, its env read (seen on a real kubelet, TestStandInMatchesRealKubelet).
// It says "not read" only behind the first init container: the kubelet creates init containers in
// order and the containers after all of them, and in a pod where nothing has started none completed.
func waitsBeforeEnv(cs corev1.ContainerStatus, firstInit string) bool {
	switch w := cs.State.Waiting; {
	case w == nil:
		return false
	case w.Reason == "PodInitializing":
		return cs.Name != firstInit
	default:
		return slices.Contains(beforeEnv, w.Reason)
	}
}

// firstInitContainer names the init container the kubelet creates first ("" if the pod has none).
func firstInitContainer(p *corev1.Pod) string {
	switch {
	case len(p.Spec.InitContainers) > 0:
		return p.Spec.InitContainers[0].Name
	case len(p.Status.InitContainerStatuses) > 0:
		return p.Status.InitContainerStatuses[0].Name
	}
	return ""
}

func projectedMessage(source types.NamespacedName) string {
	return "auth Secret now holds the canonical token from " + source.String()
}

// ownsTokenTarget reports whether raysync may write secret as rc's token target: generated mode
// needs the RayCluster as controller (KubeRay's shape, whoever created it); referenced mode needs a
// raysync-managed copy of a token, whichever source it was copied from.
func ownsTokenTarget(t TokenTarget, rc *unstructured.Unstructured, secret *corev1.Secret) bool {
	if t.Mode == Generated {
		uid, ok := controllerUID(secret.OwnerReferences)
		return ok && uid == rc.GetUID()
	}
	return managedCopyOf(secret, names.KindAuthToken)
}

// desiredGeneratedSecret is the Secret KubeRay would create for rc, holding the canonical token, so
// that KubeRay adopts it and the head pod starts with the right token.
func desiredGeneratedSecret(rc *unstructured.Unstructured, name string, token []byte, source types.NamespacedName, now time.Time) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       rc.GetNamespace(),
			Labels:          map[string]string{kuberay.ClusterLabel: rc.GetName()},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(rc, kuberay.RayClusterGVK)},
		},
		Type: corev1.SecretTypeOpaque,
	}
	return withToken(s, token, source, now)
}

// desiredManagedCopy is a raysync-owned copy of the token for referenced mode. It has no owner:
// blue-green clusters share it, and raysync prunes it when no cluster references it.
func desiredManagedCopy(ns, name string, token []byte, source types.NamespacedName, now time.Time) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{names.ManagedByLabel: names.ManagedByValue}},
		Type:       corev1.SecretTypeOpaque,
	}
	s = withToken(s, token, source, now)
	s.Annotations[names.KindAnnotation] = string(names.KindAuthToken)
	return s
}

// withToken sets the token and raysync's annotations on a copy of s, leaving everything else as is.
func withToken(s *corev1.Secret, token []byte, source types.NamespacedName, now time.Time) *corev1.Secret {
	s = s.DeepCopy()
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	s.Data[kuberay.AuthTokenKey] = bytes.Clone(token)
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[names.SourceAnnotation] = source.String()
	s.Annotations[names.TokenSHA256Annotation] = tokenDigest(token)
	s.Annotations[names.SyncedAtAnnotation] = now.UTC().Format(time.RFC3339Nano)
	delete(s.Annotations, names.WrittenUnderPodsAnnotation)
	if _, ok := s.Annotations[names.KindAnnotation]; ok {
		s.Annotations[names.KindAnnotation] = string(names.KindAuthToken)
	}
	return s
}

// tokenDigest is the short digest stored on the target Secret itself (which holds the token anyway).
// Never log it or put it in an Event or metric.
func tokenDigest(token []byte) string {
	sum := sha256.Sum256(token)
	return hex.EncodeToString(sum[:8])
}

// holdsToken reports whether the Secret's auth_token equals the token (content, not resourceVersion).
func holdsToken(s *corev1.Secret, token []byte) bool {
	v, ok := s.Data[kuberay.AuthTokenKey]
	return ok && bytes.Equal(v, token)
}

func containerStartedAt(cs corev1.ContainerStatus) time.Time {
	switch {
	case cs.State.Running != nil:
		return cs.State.Running.StartedAt.Time
	case cs.State.Terminated != nil:
		return cs.State.Terminated.StartedAt.Time
	}
	return time.Time{}
}

// syncedAtOr is s's synced-at time, or now when it has none.
func syncedAtOr(s *corev1.Secret, now time.Time) time.Time {
	if t := syncedAt(s); !t.IsZero() {
		return t
	}
	return now
}

// syncedAt reads when raysync last wrote the token into s (zero if never or unparsable).
func syncedAt(s *corev1.Secret) time.Time {
	if s == nil || s.Annotations[names.SyncedAtAnnotation] == "" {
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s.Annotations[names.SyncedAtAnnotation])
	if err != nil {
		return time.Time{}
	}
	return t
}
