package projection

import (
	"encoding/json"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
)

// The rotation ledger numbers the canonical tokens raysync has seen: rotation 1, 2, 3… A rotation's
// number is what raysync writes where many people can read (a RayService's template, a RayCluster's
// annotations); the token's digest, which ties a number to a token, stays in the ledger, a Secret in
// raysync's own namespace. The ledger survives restarts and leader changes: a wave started before a
// crash resumes with the same numbers.

// ledgerKey is the ledger Secret's data key.
const ledgerKey = "rotations.json"

// ledgerDepth is how many rotations the ledger keeps (enough to name what any running cluster holds).
const ledgerDepth = 32

// rotation is one canonical token raysync has seen.
type rotation struct {
	ID        int       `json:"id"`
	Digest    string    `json:"digest"` // tokenDigest of the token; never leaves Secrets
	FirstSeen time.Time `json:"firstSeen"`
}

// Name is how users see a rotation ("" for none).
func (r rotation) Name() string {
	if r.ID == 0 {
		return ""
	}
	return strconv.Itoa(r.ID)
}

// ledger is every recent rotation, oldest first.
type ledger []rotation

// readLedger parses the ledger Secret (nil or malformed: empty, and raysync starts numbering afresh).
func readLedger(s *corev1.Secret) ledger {
	var l ledger
	if s != nil {
		_ = json.Unmarshal(s.Data[ledgerKey], &l)
	}
	return l
}

// current is the newest rotation, if its token is the one given.
func (l ledger) current(digest string) (rotation, bool) {
	if len(l) == 0 || l[len(l)-1].Digest != digest {
		return rotation{}, false
	}
	return l[len(l)-1], true
}

// observed returns the ledger with digest as its newest rotation (appended when it is not already).
func (l ledger) observed(digest string, now time.Time) (ledger, bool) {
	if _, ok := l.current(digest); ok {
		return l, false
	}
	next := 1
	if len(l) > 0 {
		next = l[len(l)-1].ID + 1
	}
	out := append(append(ledger{}, l...), rotation{ID: next, Digest: digest, FirstSeen: now.UTC().Truncate(time.Second)})
	if len(out) > ledgerDepth {
		out = out[len(out)-ledgerDepth:]
	}
	return out, true
}

// desiredLedger is the ledger Secret holding l; cur is the Secret as it is (nil: absent).
func desiredLedger(name types.NamespacedName, cur *corev1.Secret, l ledger) *corev1.Secret {
	b, _ := json.Marshal(l)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name.Name, Namespace: name.Namespace,
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.KindAnnotation: names.KindRotationLedger}},
		Type: corev1.SecretTypeOpaque,
	}
	if cur != nil {
		s = cur.DeepCopy()
	}
	s.Data = map[string][]byte{ledgerKey: b}
	return s
}
