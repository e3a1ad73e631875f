// Package ledger is raysync's rotation ledger.
//
// The rotation ledger numbers the canonical tokens raysync has seen: rotation 1, 2, 3… A rotation's
// number is what raysync writes where many people can read (a RayService's template, a RayCluster's
// annotations); the token's digest, which ties a number to a token, stays in the ledger, a Secret in
// raysync's own namespace. The ledger survives restarts and leader changes: a wave started before a
// crash resumes with the same numbers.
package ledger

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
)

// key is the ledger Secret's data key.
const key = "rotations.json"

// depth is how many rotations the ledger keeps (enough to name what any running cluster holds).
const depth = 32

// Rotation is one canonical token raysync has seen.
type Rotation struct {
	ID        int       `json:"id"`
	Digest    string    `json:"digest"` // the token's digest as raysync marks its Secrets; never leaves Secrets
	FirstSeen time.Time `json:"firstSeen"`
	// Accept is the token's full SHA-256 (hex), what the gateway compares a client's token with: the
	// previous rotation's is how it accepts the previous token without raysync keeping the token.
	Accept string `json:"accept,omitempty"`
}

// Name is how users see a rotation ("" for none).
func (r Rotation) Name() string {
	if r.ID == 0 {
		return ""
	}
	return strconv.Itoa(r.ID)
}

// Ledger is every recent rotation, oldest first.
type Ledger []Rotation

// ErrNotOwned: the Secret named as the ledger does not carry raysync's marks of a rotation ledger.
var ErrNotOwned = errors.New("not raysync's rotation ledger")

// Owned reports whether s carries raysync's marks of a rotation ledger (label
// raysync.dev/managed-by=raysync and annotation raysync.dev/kind=rotation_ledger): only such a Secret
// is ever written as the ledger.
func Owned(s *corev1.Secret) bool {
	return s.Labels[names.ManagedByLabel] == names.ManagedByValue && s.Annotations[names.KindAnnotation] == names.KindRotationLedger
}

// Read parses the ledger Secret (nil: none yet, an empty ledger). A Secret that is not raysync's
// ledger (ErrNotOwned), or whose rotations cannot be read, is an error, never an empty ledger: starting
// afresh would overwrite it, renumber the rotations and end the previous token's grace.
func Read(s *corev1.Secret) (Ledger, error) {
	if s == nil {
		return nil, nil
	}
	if !Owned(s) {
		return nil, fmt.Errorf("Secret %s/%s is %w (label %s=%s and annotation %s=%s)", s.Namespace, s.Name, ErrNotOwned,
			names.ManagedByLabel, names.ManagedByValue, names.KindAnnotation, names.KindRotationLedger)
	}
	b, ok := s.Data[key]
	if !ok {
		return nil, fmt.Errorf("rotation ledger %s/%s holds no key %s", s.Namespace, s.Name, key)
	}
	var l Ledger
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("rotation ledger %s/%s: key %s is not a list of rotations: %v", s.Namespace, s.Name, key, err)
	}
	for i, r := range l {
		if r.ID < 1 || r.Digest == "" || r.FirstSeen.IsZero() || (i > 0 && r.ID <= l[i-1].ID) {
			return nil, fmt.Errorf("rotation ledger %s/%s: entry %d is not a rotation after the one before it", s.Namespace, s.Name, i+1)
		}
	}
	return l, nil
}

// Current is the newest rotation, if its token is the one given.
func (l Ledger) Current(digest string) (Rotation, bool) {
	if len(l) == 0 || l[len(l)-1].Digest != digest {
		return Rotation{}, false
	}
	return l[len(l)-1], true
}

// Holds reports whether the ledger numbers digest in any of its rotations.
func (l Ledger) Holds(digest string) bool {
	for _, r := range l {
		if r.Digest == digest {
			return true
		}
	}
	return false
}

// Observed returns the ledger with digest as its newest rotation (appended when it is not already),
// carrying accept (a rotation recorded before raysync kept it gets it now).
func (l Ledger) Observed(digest, accept string, now time.Time) (Ledger, bool) {
	if cur, ok := l.Current(digest); ok {
		if cur.Accept != "" || accept == "" {
			return l, false
		}
		out := append(Ledger{}, l...)
		out[len(out)-1].Accept = accept
		return out, true
	}
	next := 1
	if len(l) > 0 {
		next = l[len(l)-1].ID + 1
	}
	out := append(append(Ledger{}, l...), Rotation{ID: next, Digest: digest, FirstSeen: now.UTC().Truncate(time.Second), Accept: accept})
	if len(out) > depth {
		out = out[len(out)-depth:]
	}
	return out, true
}

// Desired is the ledger Secret holding l; cur is the Secret as it is (nil: absent).
func Desired(name types.NamespacedName, cur *corev1.Secret, l Ledger) *corev1.Secret {
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
	s.Data = map[string][]byte{key: b}
	return s
}

// Previous is the rotation before the newest one (false when there is none).
func (l Ledger) Previous() (Rotation, bool) {
	if len(l) < 2 {
		return Rotation{}, false
	}
	return l[len(l)-2], true
}
