package projection

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// raysync's own Secrets (the rotation ledger, the gateway's table) decided from the objects as they
// are, in whatever order their changes reach the caches and their keys the queue.

// watchGates holds back, per Secret name, the watch events of the informer watching that Secret by
// name, until released: the test decides when a write reaches a cache.
type watchGates struct {
	mu       sync.Mutex
	closed   map[string]bool
	held     map[string][]watch.Event
	watchers map[string][]*watch.RaceFreeFakeWatcher
}

// gate installs the gates on kube for the Secrets named in names (open until hold is called).
func gate(kube *fake.Clientset, names ...string) *watchGates {
	g := &watchGates{closed: map[string]bool{}, held: map[string][]watch.Event{}, watchers: map[string][]*watch.RaceFreeFakeWatcher{}}
	gated := map[string]bool{}
	for _, n := range names {
		gated[n] = true
	}
	kube.PrependWatchReactor("secrets", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, ok := a.(clienttesting.WatchActionImpl)
		if !ok {
			return false, nil, nil
		}
		sel, err := fields.ParseSelector(w.ListOptions.FieldSelector)
		if err != nil {
			return false, nil, nil
		}
		name, ok := sel.RequiresExactMatch("metadata.name")
		if !ok || !gated[name] {
			return false, nil, nil
		}
		real, err := kube.Tracker().Watch(a.GetResource(), a.GetNamespace(), w.ListOptions)
		if err != nil {
			return true, nil, err
		}
		out := watch.NewRaceFreeFake()
		g.mu.Lock()
		g.watchers[name] = append(g.watchers[name], out)
		g.mu.Unlock()
		go func() {
			for ev := range real.ResultChan() {
				if m, ok := ev.Object.(metav1.Object); ok && m.GetName() == name {
					g.event(name, ev)
				}
			}
		}()
		return true, out, nil
	})
	return g
}

func (g *watchGates) event(name string, ev watch.Event) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed[name] {
		g.held[name] = append(g.held[name], ev)
		return
	}
	g.send(name, ev)
}

func (g *watchGates) send(name string, ev watch.Event) {
	for _, w := range g.watchers[name] {
		w.Action(ev.Type, ev.Object)
	}
}

// hold keeps the Secret's next events from its cache until release.
func (g *watchGates) hold(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closed[name] = true
}

// release delivers the events held so far and lets the next through until hold.
func (g *watchGates) release(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, ev := range g.held[name] {
		g.send(name, ev)
	}
	g.held[name], g.closed[name] = nil, false
}

// deliver lets the Secret's cache catch up with the API, and holds its next events again.
func (h *harness) deliver(t *testing.T, g *watchGates, n types.NamespacedName) {
	t.Helper()
	g.release(n.Name)
	h.cachedAsStored(t, n)
	g.hold(n.Name)
}

// cachedAsStored waits until the cache shows the Secret as the API holds it.
func (h *harness) cachedAsStored(t *testing.T, n types.NamespacedName) {
	t.Helper()
	waitFor(t, func() bool {
		live, err := h.kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), n.Namespace, n.Name)
		cached, ok := h.ctrl.caches.Source(n)
		if apierrors.IsNotFound(err) {
			return !ok
		}
		return err == nil && ok && cached.ResourceVersion == live.(*corev1.Secret).ResourceVersion
	})
}

// published is the table as the API holds it (nil: none).
func (h *harness) published(t *testing.T, cfg Config) *gateway.Table {
	t.Helper()
	s, err := h.kube.CoreV1().Secrets(cfg.Gateway.Table.Namespace).Get(context.Background(), cfg.Gateway.Table.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	tab, err := gateway.Decode(s.Data[gateway.TableKey])
	if err != nil {
		t.Fatalf("published table: %v", err)
	}
	return tab
}

func accepts(t *gateway.Table, token string) bool {
	for _, a := range t.Accept {
		if a.SHA256 == gateway.Digest([]byte(token)) {
			return true
		}
	}
	return false
}

// ownedConfig: the gateway on, its table and the ledger in the source's namespace.
func ownedConfig() Config {
	return Config{Source: tokenSrc, Ledger: ledgerName, Prune: true,
		Gateway: GatewayOptions{Table: gatewayTableName, Grace: time.Hour}}
}

// permutations lists every order of steps.
func permutations(steps []string) [][]string {
	if len(steps) <= 1 {
		return [][]string{steps}
	}
	var out [][]string
	for i, s := range steps {
		rest := append(append([]string{}, steps[:i]...), steps[i+1:]...)
		for _, p := range permutations(rest) {
			out = append(out, append([]string{s}, p...))
		}
	}
	return out
}

// TestPreviousTokenFromTheFirstTableAcceptingTheNewOne: the canonical token rotates; the source's
// change reaching the cache, its source key, the ledger's write reaching the cache and the wave key
// (which publishes the table) happen in every order. Every table published that accepts
// the new token accepts the old one too, and once everything is seen the table accepts both.
func TestPreviousTokenFromTheFirstTableAcceptingTheNewOne(t *testing.T) {
	cfg := ownedConfig()
	steps := []string{"source reaches the cache", "source key", "ledger write reaches the cache", "wave key"}
	for _, order := range permutations(steps) {
		t.Run(strings.Join(order, ", "), func(t *testing.T) {
			var g *watchGates
			h := buildHarness(t, false, cfg, nil, func(kube *fake.Clientset) { g = gate(kube, tokenSrc.Name, ledgerName.Name) }, sourceSecret(oldToken))
			ctx := context.Background()
			if err := h.ctrl.syncSource(ctx, tokenSrc); err != nil {
				t.Fatal(err)
			}
			h.cachedAsStored(t, ledgerName)
			if err := h.ctrl.syncWave(ctx); err != nil {
				t.Fatal(err)
			}
			if tab := h.published(t, cfg); tab == nil || !accepts(tab, oldToken) {
				t.Fatal("no table accepting the first token")
			}
			g.hold(tokenSrc.Name)
			g.hold(ledgerName.Name)
			if err := h.updateSource(sourceSecret(token)); err != nil {
				t.Fatal(err)
			}
			check := func(when string) {
				t.Helper()
				if tab := h.published(t, cfg); tab != nil && accepts(tab, token) && !accepts(tab, oldToken) {
					t.Fatalf("%s: the table accepts the new token and refuses the old one", when)
				}
			}
			for _, step := range order {
				switch step {
				case "source reaches the cache":
					h.deliver(t, g, tokenSrc)
				case "source key":
					if err := h.ctrl.syncSource(ctx, tokenSrc); err != nil && !apierrors.IsConflict(err) {
						t.Fatal(err)
					}
				case "ledger write reaches the cache":
					h.deliver(t, g, ledgerName)
				case "wave key":
					if err := h.ctrl.syncWave(ctx); err != nil && !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
						t.Fatal(err)
					}
				}
				check("after " + step)
			}
			// What the queue does next: every key once more, with everything in the caches.
			h.deliver(t, g, tokenSrc)
			if err := h.ctrl.syncSource(ctx, tokenSrc); err != nil && !apierrors.IsConflict(err) {
				t.Fatal(err)
			}
			h.deliver(t, g, ledgerName)
			if err := h.ctrl.syncSource(ctx, tokenSrc); err != nil { // a conflict above: the write again
				t.Fatal(err)
			}
			h.deliver(t, g, ledgerName)
			h.cachedAsStored(t, gatewayTableName)
			if err := h.ctrl.syncWave(ctx); err != nil {
				t.Fatal(err)
			}
			if tab := h.published(t, cfg); tab == nil || !accepts(tab, token) || !accepts(tab, oldToken) {
				t.Fatalf("in the end: %+v, want the new token and the previous one", tab)
			}
		})
	}
}

// TestGatewayTableIsPutBack: the published table is decided from the Secret as it is, not from what
// this process last wrote: deleted, it is created again; edited, put back; someone else's Secret of
// that name is never written (a Warning Event on it, raysync_sync_total{result="refused"}, once).
func TestGatewayTableIsPutBack(t *testing.T) {
	cfg := ownedConfig()
	ctx := context.Background()
	h := newHarnessWith(t, cfg, nil, sourceSecret(token))
	if err := h.ctrl.syncWave(ctx); err != nil {
		t.Fatal(err)
	}
	want := h.published(t, cfg)
	if want == nil || !accepts(want, token) {
		t.Fatal("no table")
	}
	tables := h.kube.CoreV1().Secrets(gatewayTableName.Namespace)
	wave := func(what string) {
		t.Helper()
		h.cachedAsStored(t, gatewayTableName)
		if err := h.ctrl.syncWave(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		h.cachedAsStored(t, gatewayTableName)
	}
	wave("nothing changed")
	h.kube.ClearActions()
	wave("again")
	if w := h.writes(); len(w) != 0 {
		t.Errorf("a table as it should be rewritten: %v", w)
	}

	if err := tables.Delete(ctx, gatewayTableName.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wave("deleted")
	if got := h.published(t, cfg); got == nil || !equalJSON(got, want) {
		t.Errorf("a deleted table: %+v, want it back", got)
	}

	cur, _ := tables.Get(ctx, gatewayTableName.Name, metav1.GetOptions{})
	cur.Data[gateway.TableKey] = []byte(`{"accept":[],"routes":{}}`)
	if _, err := tables.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wave("edited")
	if got := h.published(t, cfg); got == nil || !equalJSON(got, want) {
		t.Errorf("an edited table: %+v, want it put back", got)
	}

	cur, _ = tables.Get(ctx, gatewayTableName.Name, metav1.GetOptions{})
	cur.Labels, cur.Data = nil, map[string][]byte{"theirs": []byte("x")}
	if _, err := tables.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.cachedAsStored(t, gatewayTableName)
	h.kube.ClearActions()
	h.events()
	for range 2 {
		if err := h.ctrl.syncWave(ctx); err != nil {
			t.Fatalf("someone else's Secret: %v (an error retries for ever)", err)
		}
	}
	if w := h.writes(); len(w) != 0 {
		t.Errorf("someone else's Secret under the table's name written: %v", w)
	}
	if ev := h.events(); len(ev) != 1 || !strings.Contains(ev[0], "Warning "+names.ReasonTargetNotOwned) || !strings.Contains(ev[0], "not raysync's gateway table") {
		t.Errorf("events %q, want one Warning %s", ev, names.ReasonTargetNotOwned)
	}
	if v := testutilValue(h.metrics.Syncs.WithLabelValues(names.ResultRefused)); v != 1 {
		t.Errorf("raysync_sync_total{result=refused} %v, want 1", v)
	}
}

// TestLedgerIsWrittenOnlyWhenItIsRaysyncs: --rotation-ledger naming someone else's Secret (the
// black-box case: the canonical source) or a ledger raysync cannot read: nothing is written, a
// Warning Event on the Secret says why (once), and the gateway's table stays as published.
func TestLedgerIsWrittenOnlyWhenItIsRaysyncs(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	valid := ledger.Desired(ledgerName, nil, ledger.Ledger{{ID: 4, Digest: tokenDigest([]byte(oldToken)), FirstSeen: now.Add(-time.Hour), Accept: gateway.Digest([]byte(oldToken))}})
	valid.ResourceVersion = "1"
	broken := valid.DeepCopy()
	broken.Data["rotations.json"] = []byte("[{")
	foreign := secret(ledgerName.Namespace, ledgerName.Name, map[string]string{"auth_token": "someone-elses"})
	for name, tc := range map[string]struct {
		cfg        func(Config) Config
		objs       []runtime.Object
		wantWrites string
		wantEvent  string
	}{
		"absent: created":                  {wantWrites: "create raysync-rotations"},
		"raysync's: the rotation appended": {objs: []runtime.Object{valid}, wantWrites: "update raysync-rotations"},
		"the canonical source itself (flags refuse it; here the cache is all there is)": {
			cfg: func(c Config) Config { c.Ledger = tokenSrc; return c }, wantEvent: names.ReasonTargetNotOwned},
		"someone else's Secret": {objs: []runtime.Object{foreign}, wantEvent: names.ReasonTargetNotOwned},
		"unreadable: kept":      {objs: []runtime.Object{broken}, wantEvent: names.ReasonLedgerInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := ownedConfig()
			if tc.cfg != nil {
				cfg = tc.cfg(cfg)
			}
			h := newHarnessWith(t, cfg, nil, append(tc.objs, sourceSecret(token))...)
			before, _ := h.kube.CoreV1().Secrets(cfg.Ledger.Namespace).Get(context.Background(), cfg.Ledger.Name, metav1.GetOptions{})
			for range 2 {
				for _, key := range []types.NamespacedName{tokenSrc, cfg.Ledger} {
					if err := h.ctrl.syncSource(context.Background(), key); err != nil {
						t.Fatal(err)
					}
					h.cachedAsStored(t, cfg.Ledger)
				}
			}
			if got := strings.Join(h.writes(), ", "); got != tc.wantWrites {
				t.Errorf("writes %q, want %q", got, tc.wantWrites)
			}
			ev := h.events()
			switch {
			case tc.wantEvent == "" && len(ev) != 0:
				t.Errorf("events %q", ev)
			case tc.wantEvent != "" && (len(ev) != 1 || !strings.Contains(ev[0], "Warning "+tc.wantEvent) || strings.Contains(ev[0], token)):
				t.Errorf("events %q, want one Warning %s (without the token)", ev, tc.wantEvent)
			}
			if tc.wantEvent == "" {
				return
			}
			after, _ := h.kube.CoreV1().Secrets(cfg.Ledger.Namespace).Get(context.Background(), cfg.Ledger.Name, metav1.GetOptions{})
			if !equalJSON(before, after) {
				t.Error("the Secret changed")
			}
			if err := h.ctrl.syncWave(context.Background()); err != nil {
				t.Fatal(err)
			}
			if tab := h.published(t, cfg); tab != nil {
				t.Errorf("a table published from a ledger raysync cannot use: %+v", tab.Accept)
			}
		})
	}
}
