package projection

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// Which token a cluster's containers hold is known from raysync's mark on the Secret they read (the
// token's digest, and when raysync wrote it). That mark goes with the Secret: deleted, or re-created
// by KubeRay with a random token, nothing would say any more. So raysync also records it on the
// RayCluster, which outlives its Secret: the rotation number whose token it wrote, and when
// (names.TokenRotationAnnotation, TokenWrittenAtAnnotation). A number and a time, never the token or
// a digest of it: more people may read RayClusters than Secrets, and the ledger ties the number to the
// token. The record follows the mark and is written after the Secret it describes, so it never runs
// ahead of it; it carries the write's time, so when it lands does not matter: containers that started
// after that time hold that token.

// tokenRecord is raysync's record of the token it wrote into a cluster's Secret: the rotation's number
// and when (RFC 3339, UTC); both "" for none.
type tokenRecord struct {
	rotation, writtenAt string
}

func (r tokenRecord) at() time.Time {
	if r.writtenAt == "" {
		return time.Time{} // most clusters carry no record: parsing "" would allocate an error each scrape
	}
	t, _ := time.Parse(time.RFC3339Nano, r.writtenAt)
	return t
}

// recordOf reads a RayCluster's record.
func recordOf(rc *unstructured.Unstructured) tokenRecord {
	return tokenRecord{rotation: metaString(rc, "annotations", names.TokenRotationAnnotation),
		writtenAt: metaString(rc, "annotations", names.TokenWrittenAtAnnotation)}
}

// markedRecord is the record raysync's mark on s amounts to: the rotation the ledger numbers its
// digest with, and when raysync wrote it. ok is false when s carries no mark of raysync's; the record
// is zero when the mark names a token the ledger does not (or no longer) number.
func markedRecord(s *corev1.Secret, src *sourceView) (r tokenRecord, ok bool) {
	digest := s.Annotations[names.TokenSHA256Annotation]
	if digest == "" {
		return r, false
	}
	at := syncedAt(s)
	if at.IsZero() {
		return r, true
	}
	id := 0
	if src.rotation.ID != 0 && src.rotation.Digest == digest {
		id = src.rotation.ID
	} else {
		for _, ro := range slices.Backward(src.ledger) {
			if ro.Digest == digest {
				id = ro.ID
				break
			}
		}
	}
	if id == 0 {
		return r, true
	}
	return tokenRecord{rotation: strconv.Itoa(id), writtenAt: at.UTC().Format(time.RFC3339Nano)}, true
}

// holdsDigest says whether the rotation a record names had the token of digest. A number is the
// ledger's, and a ledger started again (deleted) numbers from 1 anew: a record written before the
// rotation of that number was first seen names an earlier ledger's, and says nothing.
func (r tokenRecord) holdsDigest(src *sourceView, digest string) bool {
	if r.rotation == "" {
		return false
	}
	id, err := strconv.Atoi(r.rotation)
	if err != nil || id == 0 || r.at().IsZero() {
		return false
	}
	ro := src.rotation
	if ro.ID != id {
		i := slices.IndexFunc(src.ledger, func(ro ledger.Rotation) bool { return ro.ID == id })
		if i < 0 {
			return false
		}
		ro = src.ledger[i]
	}
	return ro.Digest == digest && !r.at().Before(ro.FirstSeen.Add(-ledgerLag))
}

// vouchesBefore is when the record stops vouching for the containers of its cluster: the first sight of
// the rotation after the one it names (less ledgerLag), when raysync may have written that rotation's
// token into the Secret without having recorded it yet (killed in between). A record of rotation N (A)
// then says nothing of a container started after N+1 (B) came, even when A was put back as N+2: it may
// hold B. Zero: no later rotation, the record vouches for every container started after it.
func (r tokenRecord) vouchesBefore(src *sourceView) time.Time {
	id, err := strconv.Atoi(r.rotation)
	if err != nil {
		return time.Time{}
	}
	for _, ro := range src.ledger {
		if ro.ID > id {
			return ro.FirstSeen.Add(-ledgerLag)
		}
	}
	if ro := src.rotation; ro.ID > id {
		return ro.FirstSeen.Add(-ledgerLag)
	}
	return time.Time{}
}

// ledgerLag bounds how much earlier than the ledger's first sight of a token raysync can have written it
// (the ledger and the clusters are written by different workers; first sight has whole seconds).
const ledgerLag = time.Minute

// recordedOnCurrent reports whether the RayClusters' records say that every container started among
// the readers holds the current token (digest), when the target is gone or carries no mark of
// raysync's (KubeRay re-created it): each started container started after its cluster's recorded
// write (whole seconds, as startedOnCurrent), before the next rotation came (vouchesBefore: the record
// is matched by its rotation and the token together), and before the target now there was created (a
// later one read that). It returns the earliest recorded write, which the restored Secret's mark carries.
func recordedOnCurrent(in *ClusterInput, readers []*corev1.Pod, target *corev1.Secret, digest string) (time.Time, bool) {
	if target != nil && target.Annotations[names.TokenSHA256Annotation] != "" {
		return time.Time{}, false // raysync's mark says what it wrote: startedOnCurrent decides
	}
	records := map[string]tokenRecord{in.Cluster.GetName(): recordOf(in.Cluster)}
	for name, r := range in.sharedRecords {
		records[name] = r
	}
	var earliest time.Time
	started := false
	for _, p := range readers {
		if !podStarted(p) {
			continue
		}
		started = true
		r, ok := records[p.Labels[kuberay.ClusterLabel]]
		if !ok || !r.holdsDigest(in.Sources, digest) {
			return time.Time{}, false
		}
		after := r.at().Truncate(time.Second).Add(time.Second) // container start times are in whole seconds
		before := r.vouchesBefore(in.Sources)
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			s := containerStartedAt(cs)
			if s.IsZero() {
				continue
			}
			if s.Before(after) || (target != nil && !s.Before(target.CreationTimestamp.Time)) || (!before.IsZero() && !s.Before(before)) {
				return time.Time{}, false
			}
		}
		if earliest.IsZero() || r.at().Before(earliest) {
			earliest = r.at()
		}
	}
	return earliest, started
}

// recordToken plans the RayCluster's record after this plan's token writes: it follows raysync's mark
// on the target (a Secret without one leaves it as it is), and only with a ledger to number tokens.
// A write that delivers the canonical token is recorded on the next pass, which the write's own watch
// event brings: a rotation then writes every target before any RayCluster's record, instead of making
// each target wait behind the record patches of the clusters before it (issue 28: the patches doubled
// a 1,000-target fan-out's writes on its critical path).
func (p *ClusterPlan) recordToken(f *tokenFacts) {
	if !f.ledger || f.t.IsSource {
		return
	}
	s := f.cur
	for _, a := range p.Actions {
		switch a := a.(type) {
		case CreateSecret:
			if a.Propagates {
				return
			}
			s = a.Secret
		case UpdateSecret:
			if a.Propagates {
				return
			}
			s = a.Secret
		}
	}
	if s == nil {
		return
	}
	want, ok := markedRecord(s, f.in.Sources)
	if have := recordOf(f.in.Cluster); !ok || want == have {
		return
	}
	p.Actions = append(p.Actions, RecordToken{Namespace: f.in.Cluster.GetNamespace(), Name: f.in.Cluster.GetName(), Patch: recordPatchOf(f.in.Cluster, want)})
}

// recordPatchOf is the merge patch that makes rc's record r (zero: none), with rc's UID as precondition.
func recordPatchOf(rc *unstructured.Unstructured, r tokenRecord) []byte {
	a := map[string]any{names.TokenRotationAnnotation: nil, names.TokenWrittenAtAnnotation: nil}
	if r.rotation != "" {
		a = map[string]any{names.TokenRotationAnnotation: r.rotation, names.TokenWrittenAtAnnotation: r.writtenAt}
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": string(rc.GetUID()), "annotations": a}})
	return b
}
