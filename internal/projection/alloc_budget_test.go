package projection

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"

	corev1 "k8s.io/api/core/v1"
)

// Allocation budgets. Allocation counts, unlike times, are the same on every run and machine, so
// these hold the hot paths to committed numbers: a change that allocates more fails here and must
// raise the budget on purpose, in the same commit, saying why. Times stay in the benchmarks.
//
// A budget is per cluster plus a constant, checked at two fleet sizes so that neither part can grow
// unnoticed. The fleets are scrapeFleet's shape (BenchmarkScrape1000WithPodSources).
type allocBudget struct{ perCluster, constant float64 }

func (b allocBudget) at(n int) float64 { return b.perCluster*float64(n) + b.constant }

// The budgets hold what was measured when they were set (2026-12-02, issue 28), with half an
// allocation per cluster of room for rounding: one more allocation per cluster fails at 200 clusters.
// Before issue 28 the scrape took 34 per cluster + ~223, the exposition 119 per cluster, a
// reconcile 233 (the client certificate was parsed on every pass), an admission 152.
var (
	// scrapeBudget: Snapshot, what the metrics collector reads on every scrape, leader or standby
	// (16 per cluster: 9 are the informer's index and key lookups, the rest the input, the plan's
	// status and its stale-pod map, the token facts, the copies).
	scrapeBudget = allocBudget{perCluster: 16.5, constant: 60}
	// statusBudget: Status, what `syncer status` and the scrape compute.
	statusBudget = allocBudget{perCluster: 16.5, constant: 60}
	// exposeBudget: a gather of the state collector's series from the registry, Snapshot included
	// (26 per cluster; client_golang's Gather makes ~10 of them, one dto per series).
	exposeBudget = allocBudget{perCluster: 26.5, constant: 200}
)

const (
	// reconcileBudget: one syncCluster of an in-sync cluster with pod sources (gather, plan, no write): 50.
	reconcileBudget = 52
	// admitBudget: one webhook decision for an autoscaling head (BenchmarkAdmitPod's request): 165, of
	// which 14 decode the pod's metadata typed before its spec (issue 35: a hostile review is refused on
	// its metadata before anything it sends is decoded into maps).
	admitBudget = 170
)

func fleetSizes(t *testing.T) []int {
	if testing.Short() {
		return []int{20}
	}
	return []int{20, 200}
}

func checkBudget(t *testing.T, what string, n int, got float64, budget float64) {
	t.Helper()
	if raceEnabled {
		t.Skip("the race detector's own allocations are not the code's")
	}
	t.Logf("%s at %d cluster(s): %.0f allocations (budget %.0f)", what, n, got, budget)
	if got > budget {
		t.Errorf("%s at %d clusters allocates %.0f times, over its budget of %.0f: find what allocates more "+
			"(go test -bench Scrape1000 -memprofile), or raise the budget in this file on purpose, saying why", what, n, got, budget)
	}
}

func TestScrapeAllocationBudget(t *testing.T) {
	for _, n := range fleetSizes(t) {
		h := fleetOf(t, n, nil)
		h.ctrl.Snapshot() // the template memo fills on the first scrape
		checkBudget(t, "Snapshot", n, testing.AllocsPerRun(5, func() { h.ctrl.Snapshot() }), scrapeBudget.at(n))
		checkBudget(t, "Status", n, testing.AllocsPerRun(5, func() { h.ctrl.reporter.Status() }), statusBudget.at(n))
		gather := func() {
			if _, err := h.metrics.Registry.Gather(); err != nil {
				t.Fatal(err)
			}
		}
		base := testing.AllocsPerRun(5, func() { stateOff(h); gather() })
		stateOn(h)
		all := testing.AllocsPerRun(5, gather)
		checkBudget(t, "exposition", n, all-base, exposeBudget.at(n))
	}
}

// stateOff and stateOn switch the state collector to a standby's empty answer and back, so the
// exposition budget counts only raysync's per-cluster series, not the Go and process collectors.
func stateOff(h *harness) { h.standby = true }
func stateOn(h *harness)  { h.standby = false }

func TestReconcileAllocationBudget(t *testing.T) {
	h := fleetOf(t, 3, nil)
	ctx := context.Background()
	key := clusterKey(ns, "c0001")
	if err := h.ctrl.syncCluster(ctx, key); err != nil {
		t.Fatal(err)
	}
	if w := h.writes(); len(w) != 0 {
		t.Fatalf("an in-sync cluster was written: %v", w)
	}
	got := testing.AllocsPerRun(20, func() { _ = h.ctrl.syncCluster(ctx, key) })
	checkBudget(t, "syncCluster", 1, got, reconcileBudget)
}

func TestAdmissionAllocationBudget(t *testing.T) {
	crt, key := testCert(t)
	tlsSrc := types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "client-tls"}
	tlsSecret := &corev1.Secret{Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": crt, "tls.key": key}}
	tlsSecret.Name, tlsSecret.Namespace = tlsSrc.Name, tlsSrc.Namespace
	cfg := Config{Source: tokenSrc, Pods: PodOptions{PullSecrets: []types.NamespacedName{pullSource}, AutoscalerTLS: &tlsSrc, MountPath: podtemplate.DefaultTLSMountPath}}
	h := newDryRunHarness(t, false, cfg, []*unstructured.Unstructured{rayCluster("c1", autoscaling)}, sourceSecret(token), pullSecretSource(), tlsSecret)
	a := h.ctrl.Admitter()
	ctx := context.Background()
	decide := func() {
		if ops, result, _ := a.Pod(ctx, ns, admitPodRequest); result != names.AdmitMutated || len(ops) != 4 {
			t.Fatalf("%s %v", result, ops)
		}
	}
	decide()
	checkBudget(t, "admission of a pod", 1, testing.AllocsPerRun(20, decide), admitBudget)
}
