package projection

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	gotoken "go/token"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// unknownAction is an action no applier case handles.
type unknownAction struct{}

func (unknownAction) isAction() {}

// Like sample-controller's "uncaptured action": an action the applier does not know fails the
// reconcile instead of passing as done.
func TestApplierRefusesAnUnknownAction(t *testing.T) {
	a := &applier{log: zap.NewNop()}
	err := a.do(context.Background(), informer.Key{}, nil, unknownAction{}, a.log)
	if err == nil || err.Error() != "unhandled action projection.unknownAction" {
		t.Fatalf("do(unknownAction) = %v, want unhandled action projection.unknownAction", err)
	}
	err = a.cluster(context.Background(), informer.Key{}, &ClusterInput{Cluster: rayCluster("c1")}, ClusterPlan{Actions: []Action{unknownAction{}}})
	if err == nil || !strings.Contains(err.Error(), "unhandled action") {
		t.Fatalf("cluster(plan with unknownAction) = %v, want the unhandled action error", err)
	}
}

// Every action type is declared in plan.go, and applier.do has a case for each.
func TestEveryActionIsDeclaredInPlanAndApplied(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := gotoken.NewFileSet()
	var declared, handled []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil {
				continue
			}
			if fn.Name.Name == "isAction" {
				typ := identName(fn.Recv.List[0].Type)
				if name != "plan.go" {
					t.Errorf("action %s is declared in %s, want plan.go", typ, name)
				}
				declared = append(declared, typ)
			}
			if fn.Name.Name == "do" && name == "apply.go" {
				ast.Inspect(fn.Body, func(n ast.Node) bool {
					if cc, ok := n.(*ast.CaseClause); ok {
						for _, e := range cc.List {
							handled = append(handled, identName(e))
						}
					}
					return true
				})
			}
		}
	}
	if len(declared) == 0 {
		t.Fatal("found no action types")
	}
	for _, d := range declared {
		if !slices.Contains(handled, d) {
			t.Errorf("applier.do has no case for %s", d)
		}
	}
}

func identName(e ast.Expr) string {
	if id, ok := e.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}

// namespaceTerminating is the API server's answer to a create in a namespace being deleted.
func namespaceTerminating() error {
	err := apierrors.NewForbidden(corev1.Resource("secrets"), "c1", fmt.Errorf("unable to create new content in namespace %s because it is being terminated", ns))
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: corev1.NamespaceTerminatingCause}}
	return err
}

func TestClassifyWrite(t *testing.T) {
	secrets := corev1.Resource("secrets")
	tests := map[string]struct {
		err  error
		want writeResult
	}{
		"no error":                        {nil, writeDone},
		"not found":                       {apierrors.NewNotFound(secrets, "c1"), writeGone},
		"namespace terminating":           {namespaceTerminating(), writeGone},
		"namespace terminating, wrapped":  {fmt.Errorf("create Secret ray/c1: %w", namespaceTerminating()), writeGone},
		"conflict":                        {apierrors.NewConflict(secrets, "c1", errors.New("the object has been modified")), writeStale},
		"already exists":                  {apierrors.NewAlreadyExists(secrets, "c1"), writeStale},
		"forbidden without a cause":       {apierrors.NewForbidden(secrets, "c1", errors.New("RBAC")), writeFailed},
		"server timeout":                  {apierrors.NewServerTimeout(secrets, "update", 1), writeFailed},
		"timeout":                         {apierrors.NewTimeoutError("request timed out", 1), writeFailed},
		"not an API error":                {errors.New("connection refused"), writeFailed},
		"conflict wrapped by the applier": {fmt.Errorf("update Secret ray/c1: %w", apierrors.NewConflict(secrets, "c1", errors.New("modified"))), writeStale},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := classifyWrite(tc.err); got != tc.want {
				t.Errorf("classifyWrite(%v) = %s, want %s", tc.err, got, tc.want)
			}
		})
	}
}

// settle turns the class into what the caller sees: gone is errVanished, stale goes back to the
// queue as a conflict, only a failure counts as an error.
func TestSettleCountsOnlyFailures(t *testing.T) {
	secrets := corev1.Resource("secrets")
	tests := map[string]struct {
		err          error
		wantVanish   bool
		wantConflict bool
		wantCounted  float64
	}{
		"done":      {err: nil},
		"gone":      {err: apierrors.NewNotFound(secrets, "c1"), wantVanish: true},
		"stale":     {err: apierrors.NewConflict(secrets, "c1", errors.New("modified")), wantConflict: true},
		"forbidden": {err: apierrors.NewForbidden(secrets, "c1", errors.New("RBAC")), wantCounted: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a := &applier{metrics: metrics.New(func() metrics.Snapshot { return metrics.Snapshot{} })}
			err := a.settle("update Secret ray/c1", tc.err)
			if (tc.err == nil) != (err == nil) {
				t.Fatalf("settle(%v) = %v", tc.err, err)
			}
			if errors.Is(err, errVanished) != tc.wantVanish || apierrors.IsConflict(err) != tc.wantConflict {
				t.Errorf("settle(%v) = %v", tc.err, err)
			}
			if err != nil && !tc.wantVanish && !strings.HasPrefix(err.Error(), "update Secret ray/c1: ") {
				t.Errorf("settle(%v) = %q, want the write named", tc.err, err)
			}
			if v := testutilValue(a.metrics.Syncs.WithLabelValues(names.ResultError)); v != tc.wantCounted {
				t.Errorf("raysync_sync_total{result=error} = %v, want %v", v, tc.wantCounted)
			}
		})
	}
}

// A delete decided on stale data (its preconditions fail) goes back to the queue like any other
// conflict: not dropped as done, not counted as an error.
func TestConflictingDeletesGoBackToTheQueue(t *testing.T) {
	conflict := func(resource string) clienttesting.ReactionFunc {
		return func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewConflict(corev1.Resource(resource), "x", errors.New("precondition failed"))
		}
	}
	t.Run("pruning a managed copy", func(t *testing.T) {
		h := newHarness(t, false, nil, sourceSecret(token), secret(ns, "shared", map[string]string{"auth_token": token}, managed))
		h.kube.PrependReactor("delete", "secrets", conflict("secrets"))
		if err := h.ctrl.syncNamespace(context.Background(), ns); !apierrors.IsConflict(err) {
			t.Errorf("syncNamespace = %v, want a conflict", err)
		}
		if v := testutilValue(h.metrics.Syncs.WithLabelValues(names.ResultError)); v != 0 {
			t.Errorf("counted as error: %v", v)
		}
	})
	t.Run("recycling a pending pod", func(t *testing.T) {
		fixed, _, _ := podtemplate.Desired(templatedCluster("c1"), podtemplate.Config{PullSecrets: []string{"regcred"}})
		h := newPodHarness(t, fixed, PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: true},
			pullSecretSource(), pullCopy(), rayPod("p1", "c1", podOwnedBy("c1")))
		h.kube.PrependReactor("delete", "pods", conflict("pods"))
		err := h.ctrl.syncCluster(context.Background(), clusterKey(ns, "c1"))
		if !apierrors.IsConflict(err) {
			t.Errorf("syncCluster = %v, want a conflict", err)
		}
		if v := testutilValue(h.metrics.PodsRecycled.WithLabelValues(names.StalePullSecret)); v != 0 {
			t.Errorf("raysync_pods_recycled_total = %v, want 0", v)
		}
	})
}

// A persistent refusal of one write (a policy engine forbidding ExternalName Services, a quota, a
// rejected template patch) stops only what depends on it: the RayCluster's token record is written all
// the same, and the refusal is reported (a Warning Event, raysync_sync_total{result="error"}). A failed
// token write still keeps the record from running ahead of the Secret it describes. Before, apply
// stopped at the first error and the record after it was never written.
func TestAFailingWriteStopsOnlyWhatDependsOnIt(t *testing.T) {
	forbidden := func(resource string) clienttesting.ReactionFunc {
		return func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(corev1.Resource(resource), "x", errors.New("denied by policy"))
		}
	}
	rc := rayCluster("c1")
	record := RecordToken{Namespace: ns, Name: "c1", Patch: []byte(`{"metadata":{"annotations":{"raysync.dev/token-rotation":"7"}}}`)}
	gw := CreateService{Service: &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c1-gw"}}}
	patch := PatchCluster{Namespace: ns, Name: "c1", Patch: []byte(`{"spec":{}}`)}
	tokenWrite := UpdateSecret{Secret: secret(ns, "c1", map[string]string{"auth_token": token}, ownedBy("c1"))}
	for name, tc := range map[string]struct {
		actions  []Action
		recorded bool
		errors   float64
	}{
		"the gateway address and the template patch refused: the record written": {
			actions: []Action{patch, gw, record}, recorded: true, errors: 2},
		"the token write refused: no record ahead of it, the gateway address created": {
			actions: []Action{tokenWrite, gw, record}, errors: 1},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, false, []*unstructured.Unstructured{rc}, sourceSecret(token), secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1")))
			h.kube.PrependReactor("update", "secrets", forbidden("secrets"))
			if name[4:11] == "gateway" {
				h.kube.PrependReactor("create", "services", forbidden("services"))
				h.dyn.PrependReactor("patch", "rayclusters", func(a clienttesting.Action) (bool, runtime.Object, error) {
					if strings.Contains(string(a.(clienttesting.PatchAction).GetPatch()), "token-rotation") {
						return false, nil, nil
					}
					return forbidden("rayclusters")(a)
				})
			}
			in := h.ctrl.gather.cluster(rc, h.ctrl.gather.sources(planNow), planNow)
			err := h.ctrl.apply.cluster(context.Background(), clusterKey(ns, "c1"), in, ClusterPlan{Actions: tc.actions})
			if err == nil {
				t.Error("a refused write was not returned for a retry")
			}
			recorded := slices.ContainsFunc(h.dyn.Actions(), func(a clienttesting.Action) bool {
				p, ok := a.(clienttesting.PatchAction)
				return ok && strings.Contains(string(p.GetPatch()), "token-rotation")
			})
			if recorded != tc.recorded {
				t.Errorf("record written: %v, want %v", recorded, tc.recorded)
			}
			if v := testutilValue(h.metrics.Syncs.WithLabelValues(names.ResultError)); v != tc.errors {
				t.Errorf("raysync_sync_total{result=error} = %v, want %v", v, tc.errors)
			}
			var warned int
			for len(h.recorder.Events) > 0 {
				if ev := <-h.recorder.Events; strings.Contains(ev, names.ReasonWriteFailed) {
					warned++
				}
			}
			if float64(warned) != tc.errors {
				t.Errorf("%d WriteFailed Events, want %v", warned, tc.errors)
			}
		})
	}
}

// TestALateAcknowledgementReStampsTheRaceMark: a token write marked as raced carries the time it was
// sent; when the API server acknowledges it more than writeAckSlack later, a second write carries the
// acknowledgement's time (kubelets could first see the token then, not when it was sent), and an
// acknowledgement in time writes once.
func TestALateAcknowledgementReStampsTheRaceMark(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for name, ack := range map[string]time.Duration{
		"acknowledged in time: one write, the time sent":           writeAckSlack / 2,
		"acknowledged late: a second write, the acknowledgement's": 2 * time.Second,
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")}, sourceSecret(token),
				secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1")))
			var mu sync.Mutex
			now := t0
			h.ctrl.apply.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			first := true
			h.kube.PrependReactor("update", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				if first { // the API server answers the first write after ack
					now, first = now.Add(ack), false
				}
				return false, nil, nil
			})
			cur, err := h.kube.CoreV1().Secrets(ns).Get(context.Background(), "c1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			cur = cur.DeepCopy()
			cur.Data["auth_token"] = []byte(token)
			cur.Annotations = map[string]string{names.SourceAnnotation: tokenSrc.String()}
			h.kube.ClearActions()
			if err := h.ctrl.apply.update(context.Background(), UpdateSecret{Secret: cur, MarksRace: true}, zap.NewNop()); err != nil {
				t.Fatal(err)
			}
			updates := 0
			for _, a := range h.kube.Actions() {
				if a.GetVerb() == "update" {
					updates++
				}
			}
			want, wantUpdates := t0, 1
			if ack > writeAckSlack {
				want, wantUpdates = t0.Add(ack), 2
			}
			got, _ := h.kube.CoreV1().Secrets(ns).Get(context.Background(), "c1", metav1.GetOptions{})
			if mark := got.Annotations[names.WrittenUnderPodsAnnotation]; mark != want.Format(time.RFC3339Nano) || updates != wantUpdates {
				t.Errorf("mark %s after %d update(s), want %s after %d", mark, updates, want.Format(time.RFC3339Nano), wantUpdates)
			}
		})
	}
}
