package projection

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/ledger"
)

// The ledger numbers each token once: a token it numbered before its newest (A in [1: A, 2: B]) is
// either a rollback, numbered anew, or a source cache that lags the ledger's (two watches, even in one
// namespace: never one snapshot). Only the source read live tells them apart. Before, a lagging cache
// appended A as 3 and B again as 4: the wave moved clusters toward A, and a revocation compared by
// number stopped matching.
func TestPlanLedgerNumbersATokenItHeldOnlyFromALiveRead(t *testing.T) {
	const a, b, c = "token-a-0123456789abcdef0123456789", "token-b-0123456789abcdef0123456789", "token-c-0123456789abcdef0123456789"
	rot := func(id int, v string) ledger.Rotation {
		return ledger.Rotation{ID: id, Digest: tokenDigest([]byte(v)), FirstSeen: planNow.Add(time.Duration(id-10) * time.Minute), Accept: gateway.Digest([]byte(v))}
	}
	cfg := ownedConfig()
	for name, tc := range map[string]struct {
		held   ledger.Ledger
		source string
		live   bool
		want   []int // the ledger's numbers after the write (nil: no write)
		verify bool
	}{
		"empty ledger, A: numbered 1":                    {source: a, want: []int{1}},
		"[1: A], A: nothing":                             {held: ledger.Ledger{rot(1, a)}, source: a},
		"[1: A], B: numbered 2":                          {held: ledger.Ledger{rot(1, a)}, source: b, want: []int{1, 2}},
		"[1: A, 2: B], B: nothing":                       {held: ledger.Ledger{rot(1, a), rot(2, b)}, source: b},
		"[1: A, 2: B], C: numbered 3":                    {held: ledger.Ledger{rot(1, a), rot(2, b)}, source: c, want: []int{1, 2, 3}},
		"[1: A, 2: B], A as cached: read the source":     {held: ledger.Ledger{rot(1, a), rot(2, b)}, source: a, verify: true},
		"[1: A, 2: B], A read live: a rollback, 3":       {held: ledger.Ledger{rot(1, a), rot(2, b)}, source: a, live: true, want: []int{1, 2, 3}},
		"[1: A, 2: B, 3: A], B as cached: read it":       {held: ledger.Ledger{rot(1, a), rot(2, b), rot(3, a)}, source: b, verify: true},
		"[1: A, 2: B, 3: A], A: nothing":                 {held: ledger.Ledger{rot(1, a), rot(2, b), rot(3, a)}, source: a},
		"[1: A, 2: B, 3: A], B read live: a rollback, 4": {held: ledger.Ledger{rot(1, a), rot(2, b), rot(3, a)}, source: b, live: true, want: []int{1, 2, 3, 4}},
	} {
		t.Run(name, func(t *testing.T) {
			objs := []*corev1.Secret{sourceSecret(tc.source)}
			if tc.held != nil {
				l := ledger.Desired(cfg.Ledger, nil, tc.held)
				l.ResourceVersion = "1"
				objs = append(objs, l)
			}
			src := readSources(cfg.withDefaults(), func(n types.NamespacedName) *corev1.Secret {
				for _, s := range objs {
					if s.Namespace == n.Namespace && s.Name == n.Name {
						return s
					}
				}
				return nil
			}, planNow)
			p := planLedger(cfg.withDefaults(), src, planNow, tc.live)
			if p.Verify != tc.verify {
				t.Errorf("Verify = %v, want %v", p.Verify, tc.verify)
			}
			var got []int
			var w *corev1.Secret
			switch a := p.Write.(type) {
			case CreateSecret:
				w = a.Secret
			case UpdateSecret:
				w = a.Secret
			}
			if w != nil {
				l, err := ledger.Read(w)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range l {
					got = append(got, r.ID)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("ledger written %v, want %v", got, tc.want)
			}
		})
	}
}

// The controller reads the source live when its cache shows a token the ledger held before its newest:
// a new leader whose source cache still shows A while its ledger cache shows [1: A, 2: B] (a source in
// another namespace than the ledger, or simply the two watches apart) writes nothing, and a real
// rollback to A is numbered 3.
func TestANewLeaderWithALaggingSourceCacheNumbersNothing(t *testing.T) {
	const a, b = "token-a-0123456789abcdef0123456789", "token-b-0123456789abcdef0123456789"
	cfg := ownedConfig()
	held := ledger.Desired(cfg.Ledger, nil, ledger.Ledger{
		{ID: 1, Digest: tokenDigest([]byte(a)), FirstSeen: planNow.Add(-time.Hour), Accept: gateway.Digest([]byte(a))},
		{ID: 2, Digest: tokenDigest([]byte(b)), FirstSeen: planNow.Add(-time.Minute), Accept: gateway.Digest([]byte(b))}})
	held.ResourceVersion = "1"
	for name, live := range map[string]string{"the source holds B (the cache lags)": b, "the source was put back to A": a} {
		t.Run(name, func(t *testing.T) {
			h := newHarnessWith(t, cfg, nil, []runtime.Object{held, sourceSecret(a)}...)
			// The API server now holds live; the cache still shows A (a GET answers live, the watch says nothing).
			s := sourceSecret(live)
			s.ResourceVersion = "2"
			h.kube.PrependReactor("get", "secrets", func(act clienttesting.Action) (bool, runtime.Object, error) {
				if act.(clienttesting.GetAction).GetName() == tokenSrc.Name {
					return true, s, nil
				}
				return false, nil, nil
			})
			h.kube.ClearActions()
			if err := h.ctrl.syncSource(context.Background(), tokenSrc); err != nil {
				t.Fatal(err)
			}
			stored, _ := h.kube.CoreV1().Secrets(cfg.Ledger.Namespace).Get(context.Background(), cfg.Ledger.Name, metav1.GetOptions{})
			l, err := ledger.Read(stored)
			if err != nil {
				t.Fatal(err)
			}
			want := 2
			if live == a {
				want = 3
			}
			if len(l) != want {
				t.Errorf("the ledger holds %d rotations, want %d", len(l), want)
			}
		})
	}
}
