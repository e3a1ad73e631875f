package ledger

import (
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
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
	if back := Read(s); len(back) != len(l) || back[len(back)-1] != l[len(l)-1] {
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
