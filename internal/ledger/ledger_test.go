package ledger

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
)

func TestLedger(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	var l Ledger
	l, changed := l.Observed("aaaa", "", now)
	if !changed || len(l) != 1 || l[0].ID != 1 {
		t.Fatalf("first token: %+v", l)
	}
	if _, changed = l.Observed("aaaa", "", now.Add(time.Hour)); changed {
		t.Fatal("the same token numbered twice")
	}
	for i := 0; i < depth+5; i++ {
		l, _ = l.Observed(string(rune('b'+i%2))+"x", "", now)
	}
	if len(l) != depth || l[len(l)-1].ID != depth+6 {
		t.Fatalf("ledger of %d ending at %d, want %d ending at %d", len(l), l[len(l)-1].ID, depth, depth+6)
	}
	s := Desired(types.NamespacedName{Namespace: "raysync", Name: "raysync-rotations"}, nil, l)
	if back, err := Read(s); err != nil || len(back) != len(l) || back[len(back)-1] != l[len(l)-1] {
		t.Fatalf("round trip lost rotations")
	}
	var raw []map[string]any
	_ = json.Unmarshal(s.Data[key], &raw)
	if len(raw[0]) != 3 {
		t.Errorf("a ledger entry holds %v: only a number, a digest and a time", raw[0])
	}
}

// TestLedgerKeepsWhatTheGatewayAccepts: each rotation carries its token's SHA-256, an entry written
// before raysync kept it gets it when next observed, and the previous rotation is the one before.
func TestLedgerKeepsWhatTheGatewayAccepts(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	l := Ledger{{ID: 4, Digest: "aaaa", FirstSeen: now}}
	if _, ok := l.Previous(); ok {
		t.Fatal("a previous rotation in a ledger of one")
	}
	l, changed := l.Observed("aaaa", "sha-a", now)
	if !changed || l[0].Accept != "sha-a" || l[0].ID != 4 {
		t.Fatalf("an entry without its SHA-256 was not completed: %+v", l)
	}
	if _, changed = l.Observed("aaaa", "sha-a", now); changed {
		t.Fatal("a complete entry rewritten")
	}
	l, _ = l.Observed("bbbb", "sha-b", now.Add(time.Hour))
	if p, ok := l.Previous(); !ok || p.ID != 4 || p.Accept != "sha-a" {
		t.Fatalf("previous %+v, %v", p, ok)
	}
}

// TestReadNeverStartsAfresh: a Secret that is not raysync's ledger, or whose rotations cannot be read,
// is an error, never an empty ledger (raysync would overwrite it and renumber from 1).
func TestReadNeverStartsAfresh(t *testing.T) {
	name := types.NamespacedName{Namespace: "raysync", Name: "raysync-rotations"}
	now := time.Now().UTC().Truncate(time.Second)
	good := Desired(name, nil, Ledger{{ID: 3, Digest: "aaaa", FirstSeen: now}, {ID: 4, Digest: "bbbb", FirstSeen: now}})
	with := func(f func(*corev1.Secret)) *corev1.Secret { s := good.DeepCopy(); f(s); return s }
	for what, tc := range map[string]struct {
		s       *corev1.Secret
		want    int
		wantErr string
	}{
		"none yet":  {s: nil},
		"raysync's": {s: good, want: 2},
		"empty":     {s: Desired(name, nil, nil)},
		"the canonical source": {s: &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token", Namespace: "raysync"},
			Data: map[string][]byte{"auth_token": []byte("t")}}, wantErr: "not raysync's rotation ledger"},
		"a copy of raysync's, not a ledger": {s: with(func(s *corev1.Secret) { s.Annotations[names.KindAnnotation] = "pull_secret" }), wantErr: "not raysync's"},
		"unmarked":                          {s: with(func(s *corev1.Secret) { s.Labels = nil }), wantErr: "not raysync's"},
		"no rotations key":                  {s: with(func(s *corev1.Secret) { s.Data = map[string][]byte{"x": nil} }), wantErr: "holds no key"},
		"not JSON":                          {s: with(func(s *corev1.Secret) { s.Data[key] = []byte("{") }), wantErr: "not a list of rotations"},
		"numbers going back": {s: with(func(s *corev1.Secret) {
			s.Data[key] = []byte(`[{"id":4,"digest":"a","firstSeen":"2026-01-01T00:00:00Z"},{"id":3,"digest":"b","firstSeen":"2026-01-01T00:00:00Z"}]`)
		}), wantErr: "entry 2"},
		"an entry without digest": {s: with(func(s *corev1.Secret) { s.Data[key] = []byte(`[{"id":1,"firstSeen":"2026-01-01T00:00:00Z"}]`) }), wantErr: "entry 1"},
	} {
		l, err := Read(tc.s)
		switch {
		case tc.wantErr == "" && (err != nil || len(l) != tc.want):
			t.Errorf("%s: %d rotations, %v; want %d", what, len(l), err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || l != nil):
			t.Errorf("%s: %v (%d rotations), want an error with %q", what, err, len(l), tc.wantErr)
		}
		if (strings.Contains(what, "source") || strings.Contains(what, "not a ledger") || what == "unmarked") && !errors.Is(err, ErrNotOwned) {
			t.Errorf("%s: %v is not ErrNotOwned", what, err)
		}
	}
}
