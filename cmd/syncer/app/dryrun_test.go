package app

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

// The one-shot commands' --dry-run: they say what they would do and nothing reaches the API but reads.

func commandConfig(t *testing.T, cmd string, extra ...string) *config {
	t.Helper()
	c, _, err := parseCommand(cmd, append([]string{"--auth-source=raysync/ray-token", "--namespaces=ml", "-n", "raysync"}, extra...), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writesOf lists the actions of fakes that are not reads.
func writesOf(fakes ...interface{ Actions() []clienttesting.Action }) []string {
	var out []string
	for _, f := range fakes {
		for _, a := range f.Actions() {
			switch a.GetVerb() {
			case "get", "list", "watch":
			default:
				out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
			}
		}
	}
	return out
}

func ledgerOf(rotations int) *corev1.Secret {
	var l ledger.Ledger
	for i := 1; i <= rotations; i++ {
		l = append(l, ledger.Rotation{ID: i, Digest: fmt.Sprintf("%016d", i), FirstSeen: time.Now().UTC().Truncate(time.Second)})
	}
	s := ledger.Desired(types.NamespacedName{Namespace: "raysync", Name: "raysync-rotations"}, nil, l)
	s.ResourceVersion = "5"
	return s
}

func TestRevokePrevious(t *testing.T) {
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "raysync-rotations", Namespace: "raysync"}, Data: map[string][]byte{"auth_token": []byte("x")}}
	broken := ledgerOf(2)
	broken.Data["rotations.json"] = []byte("{")
	for name, tc := range map[string]struct {
		ledger     *corev1.Secret
		dryRun     bool
		wantCode   int
		wantOut    string
		wantWrites string
	}{
		"revoked":                       {ledger: ledgerOf(2), wantCode: 0, wantOut: "revoked the token of rotation 1", wantWrites: "update secrets"},
		"--dry-run: said, not done":     {ledger: ledgerOf(2), dryRun: true, wantCode: 0, wantOut: "would revoke the token of rotation 1"},
		"one rotation: nothing to do":   {ledger: ledgerOf(1), wantCode: 1, wantOut: "no previous token"},
		"someone else's Secret: error":  {ledger: foreign, wantCode: 2, wantOut: "not raysync's rotation ledger"},
		"an unreadable ledger: error":   {ledger: broken, wantCode: 2, wantOut: "not a list of rotations"},
		"no ledger: error":              {wantCode: 2, wantOut: "not found"},
		"--dry-run, no ledger: error":   {dryRun: true, wantCode: 2, wantOut: "not found"},
		"--dry-run, already revoked: 0": {ledger: revoked(ledgerOf(2), "2"), dryRun: true, wantCode: 0, wantOut: "already revoked"},
	} {
		t.Run(name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.ledger != nil {
				objs = append(objs, tc.ledger)
			}
			kube := fake.NewClientset(objs...)
			extra := []string{}
			if tc.dryRun {
				extra = append(extra, "--dry-run")
			}
			var out bytes.Buffer
			code := revokePrevious(context.Background(), commandConfig(t, revokeCommand, extra...), kube, &out, &out)
			if code != tc.wantCode || !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("exit %d: %q; want %d with %q", code, out.String(), tc.wantCode, tc.wantOut)
			}
			if got := strings.Join(writesOf(kube), ", "); got != tc.wantWrites {
				t.Errorf("writes %q, want %q", got, tc.wantWrites)
			}
		})
	}
}

func revoked(s *corev1.Secret, id string) *corev1.Secret {
	s.Annotations[names.PreviousRevokedAnnotation] = id
	return s
}

func TestRotateDryRunMarksNothing(t *testing.T) {
	behind := &projection.RotationStatus{State: names.TokenBehind, Policy: names.PolicyHold}
	report := &statusReport{Clusters: []projection.ClusterStatus{{Namespace: "ml", RayCluster: "c1", Rotation: behind}}}
	rc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": "c1", "namespace": "ml"}}}
	for _, dry := range []bool{true, false} {
		dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kuberay.ListKinds, rc.DeepCopy())
		extra := []string{"--all"}
		if dry {
			extra = append(extra, "--dry-run")
		}
		var out bytes.Buffer
		refused, err := requestRotations(context.Background(), commandConfig(t, rotateCommand, extra...), report, nil, dyn, &out)
		if err != nil || refused != 0 {
			t.Fatalf("dry run %v: %v, %d refused", dry, err, refused)
		}
		writes := writesOf(dyn)
		switch {
		case dry && (len(writes) != 0 || !strings.Contains(out.String(), "ml/c1: would be restarted")):
			t.Errorf("--dry-run: writes %v, output %q", writes, out.String())
		case !dry && (strings.Join(writes, ",") != "patch rayclusters" || !strings.Contains(out.String(), "ml/c1: will be restarted")):
			t.Errorf("without --dry-run: writes %v, output %q", writes, out.String())
		}
	}
}

// uninstallFixture is what raysync leaves behind: a cluster it suspended mid-restart, a copy no
// cluster names, its ledger and its Lease.
func uninstallFixture() (*fake.Clientset, *dynamicfake.FakeDynamicClient) {
	rc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": "c1", "namespace": "ml", "resourceVersion": "3",
			"annotations": map[string]any{names.RotationStartedAnnotation: "2026-01-01T00:00:00Z"}},
		"spec": map[string]any{"suspend": true}}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kuberay.ListKinds, rc)
	copyOf := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: "ml", UID: "u1", ResourceVersion: "1",
		Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
		Annotations: map[string]string{names.KindAnnotation: string(names.KindPullSecret)}}}
	holder := "raysync-7d9f-abcde_0b6c4c2e-8f0e-4c5e-9a56-6f2f8f0d1a2b"
	old := time.Now().Add(-time.Hour)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "raysync", Namespace: "raysync", UID: "l1", ResourceVersion: "9"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, RenewTime: &metav1.MicroTime{Time: old}}}
	return fake.NewClientset(copyOf, ledgerOf(2), lease), dyn
}

func TestUninstallDryRunChangesNothing(t *testing.T) {
	for _, extra := range [][]string{nil, {"--dry-run"}, {"--dry-run", "--yes"}} {
		kube, dyn := uninstallFixture()
		var out bytes.Buffer
		if _, err := uninstallWith(context.Background(), commandConfig(t, uninstallCommand, extra...), kube, dyn, &out); err != nil {
			t.Fatal(err)
		}
		if w := writesOf(kube, dyn); len(w) != 0 || !strings.Contains(out.String(), "would delete Secret raysync/raysync-rotations") {
			t.Errorf("uninstall %v: writes %v\n%s", extra, w, out.String())
		}
	}
	kube, dyn := uninstallFixture()
	var out bytes.Buffer
	if _, err := uninstallWith(context.Background(), commandConfig(t, uninstallCommand, "--yes"), kube, dyn, &out); err != nil {
		t.Fatal(err)
	}
	if w := strings.Join(writesOf(kube, dyn), ", "); w != "delete secrets, delete secrets, delete leases, patch rayclusters" &&
		w != "patch rayclusters, delete secrets, delete secrets, delete leases" {
		t.Errorf("uninstall --yes: %s\n%s", w, out.String())
	}
}

// TestUninstallDeletesOnlyRaysyncsLease: the Lease is deleted with its UID and resourceVersion as
// preconditions, and only when it is raysync's: its mark, or (an earlier raysync's) a holder named
// as raysync names its replicas.
func TestUninstallDeletesOnlyRaysyncsLease(t *testing.T) {
	str := func(s string) *string { return &s }
	for name, tc := range map[string]struct {
		labels map[string]string
		holder *string
		want   bool
	}{
		"marked":                             {labels: map[string]string{names.ManagedByLabel: names.ManagedByValue}, want: true},
		"marked, released":                   {labels: map[string]string{names.ManagedByLabel: names.ManagedByValue}, holder: str(""), want: true},
		"an earlier raysync's holder":        {holder: str("raysync-5c4d-x2k_0b6c4c2e-8f0e-4c5e-9a56-6f2f8f0d1a2b"), want: true},
		"another controller's holder":        {holder: str("kube-controller-manager")},
		"unmarked, released":                 {holder: str("")},
		"unmarked, no holder":                {},
		"a holder that only looks like ours": {holder: str("x_0b6c4c2e-8f0e-4c5e-9a56-6f2f8f0d1a2b-extra")},
	} {
		t.Run(name, func(t *testing.T) {
			lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "raysync", Namespace: "raysync", UID: "l1", ResourceVersion: "9", Labels: tc.labels},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: tc.holder}}
			kube := fake.NewClientset(lease)
			steps, kept := ownSteps(context.Background(), kube, commandConfig(t, uninstallCommand), "raysync")
			var leaseStep *uninstallStep
			for i := range steps {
				if strings.Contains(steps[i].what, "Lease") {
					leaseStep = &steps[i]
				}
			}
			if (leaseStep != nil) != tc.want || (len(kept) == 0) != tc.want {
				t.Fatalf("delete step %v, kept %q; want delete %v", leaseStep != nil, kept, tc.want)
			}
			if leaseStep == nil {
				return
			}
			if err := leaseStep.do(context.Background()); err != nil {
				t.Fatal(err)
			}
			for _, a := range kube.Actions() {
				if d, ok := a.(clienttesting.DeleteAction); ok {
					p := d.GetDeleteOptions().Preconditions
					if p == nil || p.UID == nil || *p.UID != "l1" || p.ResourceVersion == nil || *p.ResourceVersion != "9" {
						t.Errorf("the Lease deleted without its UID and resourceVersion as preconditions: %+v", p)
					}
				}
			}
		})
	}
}

// TestDryRunClientCannotWrite: with --dry-run every command's client refuses, before it leaves the
// process, any request but a read: whatever path a dry run takes, no write reaches the API server.
func TestDryRunClientCannotWrite(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Secret","apiVersion":"v1","metadata":{"name":"x","namespace":"ml"}}`))
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`, srv.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dry := range []bool{true, false} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		extra := []string{"--kubeconfig=" + kubeconfig}
		if dry {
			extra = append(extra, "--dry-run")
		}
		kube, err := kubeClient(commandConfig(t, uninstallCommand, extra...))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := kube.CoreV1().Secrets("ml").Get(ctx, "x", metav1.GetOptions{}); err != nil {
			t.Fatalf("a read: %v", err)
		}
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: "ml"}}
		_, cerr := kube.CoreV1().Secrets("ml").Create(ctx, s, metav1.CreateOptions{})
		_, uerr := kube.CoreV1().Secrets("ml").Update(ctx, s, metav1.UpdateOptions{})
		derr := kube.CoreV1().Secrets("ml").Delete(ctx, "x", metav1.DeleteOptions{})
		mu.Lock()
		got := strings.Join(seen, ",")
		mu.Unlock()
		switch {
		case dry && (got != "GET" || cerr == nil || uerr == nil || derr == nil || !strings.Contains(cerr.Error(), "dry run writes nothing")):
			t.Errorf("--dry-run: the server saw %q; errors %v / %v / %v", got, cerr, uerr, derr)
		case !dry && got != "GET,POST,PUT,DELETE":
			t.Errorf("without --dry-run the server saw %q", got)
		}
	}
}

// The controller watches the gateway's table (to put it back); a report reads no cluster token.
func TestOnlyTheControllerWatchesTheTable(t *testing.T) {
	args := []string{"--auth-source=raysync/ray-token", "--namespaces=ml", "--leader-elect=false", "--gateway-table=raysync/raysync-gateway"}
	c, err := parseFlags(args, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if w := c.informer(); w.Table.Name != "raysync-gateway" || w.Ledger.Name != "raysync-rotations" {
		t.Errorf("the controller watches %+v", w)
	}
	args = slices.Delete(args, 2, 3) // a one-shot command never leads, and takes no --leader-elect
	for _, cmd := range []string{statusCommand, rotateCommand, uninstallCommand, revokeCommand} {
		c, _, err := parseCommand(cmd, append(args, "--all"), func(string) string { return "" })
		if cmd != rotateCommand {
			c, _, err = parseCommand(cmd, args, func(string) string { return "" })
		}
		if err != nil {
			t.Fatal(err)
		}
		if w := c.informer(); w.Table.Name != "" || w.Ledger.Name == "" {
			t.Errorf("syncer %s watches %+v", cmd, w)
		}
	}
}
