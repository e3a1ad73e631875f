package app

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

// A fleet that ran before raysync: three clusters not adopted (a RayService's, a standalone one held,
// one of another namespace) and one raysync adopted.
func adoptFixture() (*statusReport, *fake.Clientset, *dynamicfake.FakeDynamicClient) {
	notAdopted := func(policy string) *projection.RotationStatus {
		return &projection.RotationStatus{State: names.TokenNotAdopted, Policy: policy}
	}
	report := &statusReport{Clusters: []projection.ClusterStatus{
		{Namespace: "ml", RayCluster: "svc-x", Owner: "svc", OwnerKind: names.OwnerRayService, Rotation: notAdopted(names.PolicyReplace)},
		{Namespace: "ml", RayCluster: "c1", Rotation: notAdopted(names.PolicyHold)},
		{Namespace: "batch", RayCluster: "c2", Rotation: notAdopted(names.PolicyRestart)},
		{Namespace: "ml", RayCluster: "c3", Rotation: &projection.RotationStatus{State: names.TokenBehind, Policy: names.PolicyHold}},
	}}
	obj := func(kind, name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ray.io/v1", "kind": kind, "metadata": map[string]any{"name": name, "namespace": "ml"}}}
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), kuberay.ListKinds, obj("RayService", "svc"), obj("RayCluster", "c1"))
	kube := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "raysync", Name: "raysync-control"}})
	return report, kube, dyn
}

// syncer adopt says, for each cluster, what adopting it does and what capacity that needs, before it
// changes anything; --dry-run changes nothing; a unit is annotated (a RayService's on the RayService),
// a namespace or --all goes into the control ConfigMap; a cluster already adopted is not adopted again.
func TestAdoptSaysFirstThenAdopts(t *testing.T) {
	for name, tc := range map[string]struct {
		targets     []string
		extra       []string
		wantOut     []string
		wantWrites  string
		wantControl string
		wantCode    int
	}{
		"--all --dry-run: everything said, nothing changed": {extra: []string{"--all", "--dry-run"},
			wantOut: []string{"ml/svc-x (RayService ml/svc): would be replaced", "ml/c1: would be held", "batch/c2: would be restarted",
				"adopting 3 cluster(s): 1 replaced (1 at a time: the capacity of 1 more cluster(s)", "(dry run: nothing changed)"}},
		"--all": {extra: []string{"--all"}, wantOut: []string{"ml/svc-x (RayService ml/svc): will be replaced"}, wantWrites: "update configmaps", wantControl: "all"},
		"a namespace": {targets: []string{"namespace/batch"}, wantOut: []string{"batch/c2: will be restarted", "adopting 1 cluster(s)"},
			wantWrites: "update configmaps", wantControl: "batch"},
		"a RayService: annotated on the RayService": {targets: []string{"rayservice/ml/svc"}, wantOut: []string{"annotated rayservices/ml/svc raysync.dev/adopt=true"},
			wantWrites: "patch rayservices"},
		"a standalone cluster": {targets: []string{"ml/c1"}, wantOut: []string{"ml/c1: will be held"}, wantWrites: "patch rayclusters"},
		"a cluster raysync adopted already: nothing, exit 1": {targets: []string{"ml/c3"}, wantOut: []string{"ml/c3: nothing to adopt: it is behind"},
			wantCode: statusOutOfSync},
	} {
		t.Run(name, func(t *testing.T) {
			report, kube, dyn := adoptFixture()
			cfg := commandConfig(t, adoptCommand, tc.extra...)
			var units []string
			for _, t := range tc.targets {
				if ns, ok := strings.CutPrefix(t, "namespace/"); ok {
					cfg.adoptNamespaces = append(cfg.adoptNamespaces, ns)
				} else {
					units = append(units, t)
				}
			}
			var out bytes.Buffer
			code, err := adoptClusters(context.Background(), cfg, report, units, kube, dyn, &out)
			if err != nil || code != tc.wantCode {
				t.Fatalf("exit %d, %v; want %d: %s", code, err, tc.wantCode, out.String())
			}
			for _, w := range tc.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if got := strings.Join(writesOf(kube, dyn), ", "); got != tc.wantWrites {
				t.Errorf("writes %q, want %q", got, tc.wantWrites)
			}
			cm, _ := kube.CoreV1().ConfigMaps("raysync").Get(context.Background(), "raysync-control", metav1.GetOptions{})
			if got := cm.Data[names.ControlAdoptKey]; got != tc.wantControl {
				t.Errorf("control adopt %q, want %q", got, tc.wantControl)
			}
		})
	}
}

// syncer pause and resume write only the control ConfigMap, say what they did, and exit 1 when it was
// so already; --dry-run writes nothing.
func TestPauseAndResume(t *testing.T) {
	_, kube, _ := adoptFixture()
	ctx := context.Background()
	run := func(paused bool, extra ...string) (int, string) {
		t.Helper()
		var out bytes.Buffer
		cmd := pauseCommand
		if !paused {
			cmd = resumeCommand
		}
		code, err := pause(ctx, commandConfig(t, cmd, extra...), kube, paused, &out)
		if err != nil {
			t.Fatal(err)
		}
		return code, out.String()
	}
	data := func() map[string]string {
		cm, _ := kube.CoreV1().ConfigMaps("raysync").Get(ctx, "raysync-control", metav1.GetOptions{})
		return cm.Data
	}
	if code, out := run(true, "--dry-run"); code != 0 || !strings.Contains(out, "would be paused") || data()["paused"] != "" {
		t.Errorf("pause --dry-run: %d %q, data %v", code, out, data())
	}
	if code, out := run(true, "--reason=wrong token"); code != 0 || !strings.Contains(out, "paused:") || data()["paused"] != "true" ||
		data()["reason"] != "wrong token" || data()["paused-at"] == "" {
		t.Errorf("pause: %d %q, data %v", code, out, data())
	}
	if code, _ := run(true); code != statusOutOfSync {
		t.Errorf("pause twice: exit %d, want 1", code)
	}
	if code, out := run(false); code != 0 || !strings.Contains(out, "resumed") || data()["paused"] != "false" || data()["reason"] != "" {
		t.Errorf("resume: %d %q, data %v", code, out, data())
	}
	if code, _ := run(false); code != statusOutOfSync {
		t.Errorf("resume twice: exit %d, want 1", code)
	}
	if got := strings.Join(writesOf(kube), ", "); got != "update configmaps, update configmaps" {
		t.Errorf("writes %q", got)
	}
}
