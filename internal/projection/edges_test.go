package projection

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
	"github.com/raysync/raysync/internal/validate"
)

// The rotation invariant and the webhook at their edges: Secrets several clusters read, restarts a
// newer rotation overtakes, requests for clusters that are not behind, how long a cluster has been
// behind, deleted Secrets, suspended clusters, and the exact read window.

const midToken = "an-intermediate-canonical-token"

func sharing(name, secretName string) *unstructured.Unstructured {
	return rayCluster(name, withAuth(map[string]any{"mode": "token", "secretName": secretName}))
}

func managedCopy(name, value string) *corev1.Secret {
	return secret(ns, name, map[string]string{"auth_token": value}, managed, withSecretAnnotation(names.TokenSHA256Annotation, tokenDigest([]byte(value))))
}

func statusOf(t *testing.T, h *harness, name string) ClusterStatus {
	t.Helper()
	_, all := h.ctrl.reporter.Status()
	for _, st := range all {
		if st.RayCluster == name {
			return st
		}
	}
	t.Fatalf("no status for %s", name)
	return ClusterStatus{}
}

// Whether a Secret may have been read is decided over every pod of every cluster that reads it, not
// only the cluster being reconciled: a new cluster naming a copy its sharers run on starts on that
// copy's token and is behind with them.
func TestSharedSecretIsNotRewrittenUnderARunningSharer(t *testing.T) {
	tests := map[string]struct {
		sharers []runtime.Object
		write   bool
	}{
		"a sharer runs on the copy's token: held":                   {sharers: []runtime.Object{startedPod("a-head", "a", time.Now().Add(-time.Hour), headPod, onNode)}},
		"a sharer's pod is on a node, its kubelet said nothing yet": {sharers: []runtime.Object{rayPod("a-head", "a", onNode)}},
		"the sharer has no pod on a node: written":                  {sharers: []runtime.Object{rayPod("a-head", "a")}, write: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			objs := append([]runtime.Object{sourceSecret(token), managedCopy("x", oldToken)}, tc.sharers...)
			h := newHarness(t, false, []*unstructured.Unstructured{sharing("a", "x"), sharing("c", "x")}, objs...)
			h.syncUntilQuiet(t, "c")
			h.syncUntilQuiet(t, "a")
			got := string(h.secret(t, "x").Data["auth_token"])
			if tc.write != (got == token) {
				t.Fatalf("copy holds the canonical token: %v, want %v (writes %v)", got == token, tc.write, h.writes())
			}
			if tc.write {
				return
			}
			for _, c := range []string{"a", "c"} {
				if st := statusOf(t, h, c); st.Rotation == nil || st.Rotation.State != names.TokenBehind {
					t.Errorf("%s: rotation %+v, want behind", c, st.Rotation)
				}
			}
		})
	}
}

// The webhook decides a Secret being created by the same rule: a cluster naming it runs.
func TestWebhookLeavesASecretOtherClustersRunOn(t *testing.T) {
	a := admissionHarness(t, []*unstructured.Unstructured{rayCluster("c1"), sharing("b", "c1")},
		sourceSecret(token), startedPod("b-head", "b", time.Now().Add(-time.Hour), headPod, onNode))
	raw, _ := json.Marshal(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1")))
	if result, reason := a.Secret(context.Background(), ns, raw, false); result != names.AdmitSkipped {
		t.Errorf("gave the canonical token to a Secret whose other reader runs (%s %q)", result, reason)
	}
}

// A restart completes once the cluster runs on new pods with its head Ready, whatever token it got:
// when a newer rotation overtook it, the cluster is behind again and frees its slot.
func TestRestartOvertakenByANewerRotationFreesItsSlot(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 1, Timeout: time.Hour}}.withDefaults()
	started := annotated(names.RotationStartedAnnotation, planNow.Add(-time.Minute).Format(time.RFC3339))
	c1 := view(t, cfg, restartCluster("c1", started, annotated(names.RotationTargetAnnotation, "6")), false,
		pods(startedPod("c1-head", "c1", planNow.Add(-30*time.Second), headPod)))
	w := planWave([]clusterView{c1, view(t, cfg, restartCluster("c2"), false)}, cfg, planNow, nil)
	want := []string{"patch RayCluster c1", "event RotationRetried c1", "start RayCluster c2", "event RotationStarted c2"}
	if diff := cmp.Diff(want, kinds(w.Actions)); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
	if w.InFlight != 1 {
		t.Errorf("in flight %d, want 1 (c2 only)", w.InFlight)
	}
}

// `raysync.dev/rotate` on a cluster that is not behind is consumed at once, never parked for the
// next rotation.
func TestRotateRequestForACurrentClusterIsDropped(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 2, Timeout: time.Hour}}.withDefaults()
	w := planWave([]clusterView{view(t, cfg, rayCluster("cur", annotated(names.RotateAnnotation, "now"), resourceVersion("3")), true)}, cfg, planNow, nil)
	if diff := cmp.Diff([]string{"patch RayCluster cur", "event RotationNotNeeded cur"}, kinds(w.Actions)); diff != "" {
		t.Fatalf("actions (-want +got):\n%s", diff)
	}
	checkPlan(t, ClusterPlan{Actions: w.Actions[:1]}, []Action{PatchRotation{Kind: "RayCluster", Namespace: ns, Name: "cur",
		Patch: []byte(`{"metadata":{"resourceVersion":"3","annotations":{"raysync.dev/rotate":null}}}`)}})
}

// The ledger: rotation 5 (oldToken) 30 days ago, 6 (midToken) 10 days ago, 7 (token) 3 hours ago.
var history = ledger.Ledger{
	{ID: 5, Digest: tokenDigest([]byte(oldToken)), FirstSeen: planNow.Add(-30 * 24 * time.Hour)},
	{ID: 6, Digest: tokenDigest([]byte(midToken)), FirstSeen: planNow.Add(-10 * 24 * time.Hour)},
	rotated,
}

func withHistory(in *ClusterInput) { in.Sources.ledger, in.Sources.rotation = history, rotated }

// A cluster is behind since the first rotation it missed, not since the newest.
func TestBehindSinceTheFirstRotationMissed(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	kuberays := func(value string) *corev1.Secret {
		return secret(ns, "c1", map[string]string{"auth_token": value}, ownedBy("c1"))
	}
	tests := map[string]struct {
		rc    *unstructured.Unstructured
		opts  []func(*ClusterInput)
		since time.Time
	}{
		"on rotation 5: behind since rotation 6": {rc: rayCluster("c1"),
			opts: []func(*ClusterInput){target(kuberays(oldToken)), pods(startedPod("c1-head", "c1", planNow.Add(-40*24*time.Hour), headPod))}, since: history[1].FirstSeen},
		"on rotation 6: behind since rotation 7": {rc: rayCluster("c1"),
			opts: []func(*ClusterInput){target(kuberays(midToken)), pods(startedPod("c1-head", "c1", planNow.Add(-9*24*time.Hour), headPod))}, since: history[2].FirstSeen},
		"on a token the ledger never numbered, started 20 days ago: since rotation 6": {rc: rayCluster("c1"),
			opts: []func(*ClusterInput){target(kuberays("random")), pods(startedPod("c1-head", "c1", planNow.Add(-20*24*time.Hour), headPod))}, since: history[1].FirstSeen},
		"on a token the ledger never numbered, started after the newest rotation: since it started": {rc: rayCluster("c1"),
			opts: []func(*ClusterInput){target(kuberays("random")), pods(startedPod("c1-head", "c1", planNow.Add(-time.Hour), headPod))}, since: planNow.Add(-time.Hour)},
		"reading the source itself, started 20 days ago: since rotation 6": {
			rc:   rayCluster("c1", withAuth(map[string]any{"mode": "token", "secretName": "ray-token"}), func(u *unstructured.Unstructured) { u.SetNamespace(tokenSrc.Namespace) }),
			opts: []func(*ClusterInput){pods(startedPod("c1-head", "c1", planNow.Add(-20*24*time.Hour), headPod))}, since: history[1].FirstSeen},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := input(cfg, tc.rc, []*corev1.Secret{sourceSecret(token)}, append(tc.opts, withHistory)...)
			r := planCluster(in, cfg).Status.Rotation
			if r == nil || r.State != names.TokenBehind || r.Since == nil || !r.Since.Equal(tc.since) {
				t.Fatalf("rotation %+v, want behind since %v", r, tc.since)
			}
		})
	}
}

// Oldest-behind first: a RayService ten days behind goes before a restart three hours behind.
func TestWaveMovesTheOldestBehindFirst(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 1, Timeout: time.Hour}}.withDefaults()
	mid := secret(ns, "a-restart", map[string]string{"auth_token": midToken}, ownedBy("a-restart"))
	w := planWave([]clusterView{
		view(t, cfg, restartCluster("a-restart"), false, target(mid), withHistory),
		view(t, cfg, rayCluster("z-svc-x", ofRayService("z-svc")), false, owner(rayService("z-svc")), withHistory),
	}, cfg, planNow, nil)
	if diff := cmp.Diff([]string{"start RayService z-svc", "event RotationStarted z-svc", "event RotationStarted z-svc-x"}, kinds(w.Actions)); diff != "" {
		t.Errorf("actions (-want +got):\n%s", diff)
	}
}

// A deleted Secret raysync cannot recreate (it does not know the token the containers hold) is
// reported missing, with a Warning: new pods of the cluster cannot start.
func TestDeletedSecretUnderABehindClusterIsReportedMissing(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	running := startedPod("c1-head", "c1", planNow.Add(-5*time.Hour), headPod)
	for name, rc := range map[string]*unstructured.Unstructured{
		"generated":                   rayCluster("c1"),
		"a raysync copy (secretName)": sharing("c1", "x"),
	} {
		t.Run(name, func(t *testing.T) {
			p := planCluster(input(cfg, rc, []*corev1.Secret{sourceSecret(token)}, pods(running), withRotation), cfg)
			if p.Status.Token != "missing" || p.Status.InSync() {
				t.Errorf("token state %q (in sync %v), want missing", p.Status.Token, p.Status.InSync())
			}
			var reasons []string
			for _, a := range p.Actions {
				if e, ok := a.(RecordEvent); ok && e.Type == corev1.EventTypeWarning {
					reasons = append(reasons, e.Reason)
				}
				if _, ok := a.(CreateSecret); ok {
					t.Error("recreated a Secret under containers on a token raysync cannot tell")
				}
			}
			if diff := cmp.Diff([]string{"TargetMissing"}, reasons); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

// A cluster its owner suspended is not restarted: raysync's restart would end with suspend: false.
// Once its pods are gone, its Secret takes the new token as a stopped cluster's does.
func TestSuspendedClusterIsNotRestarted(t *testing.T) {
	cfg := Config{Source: tokenSrc, Rotation: RotationOptions{MaxConcurrent: 2, Timeout: time.Hour}}.withDefaults()
	w := planWave([]clusterView{view(t, cfg, restartCluster("c1", setPath(true, "spec", "suspend")), false)}, cfg, planNow, nil)
	if len(w.Actions) != 0 || w.InFlight != 0 {
		t.Errorf("actions %v, in flight %d: want none", kinds(w.Actions), w.InFlight)
	}
	in := input(cfg, restartCluster("c1", setPath(true, "spec", "suspend")), []*corev1.Secret{sourceSecret(token)},
		target(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1"))), withRotation)
	if p := planCluster(in, cfg); p.Status.Rotation == nil || p.Status.Rotation.State != names.TokenCurrent {
		t.Errorf("suspended with no pod left: %+v, want the new token written (current)", p.Status.Rotation)
	}
}

func withStatuses(init []corev1.ContainerStatus, containers ...corev1.ContainerStatus) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.NodeName = "node-1"
		p.Status.InitContainerStatuses, p.Status.ContainerStatuses = init, containers
	}
}

func waitingOn(name, reason string) corev1.ContainerStatus {
	return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
}

// Once any container of any pod that reads the Secret may have started, raysync does not write it.
func TestReadWindowIsStrict(t *testing.T) {
	cfg := Config{Source: tokenSrc}.withDefaults()
	seen := watchingSince(planNow.Add(-time.Hour))
	tests := map[string]struct {
		secret *corev1.Secret
		pod    *corev1.Pod
		write  bool
	}{
		"one container pulls its image, another is being created: may have been read": {secret: kuberaysOld(),
			pod: rayPod("c1-head", "c1", withStatuses(nil, waitingOn("ray-head", "ImagePullBackOff"), waitingOn("sidecar", "ContainerCreating")))},
		"every container pulls its image: written": {secret: kuberaysOld(), write: true,
			pod: rayPod("c1-head", "c1", withStatuses(nil, waitingOn("ray-head", "ImagePullBackOff"), waitingOn("sidecar", "ErrImagePull")))},
		"the init container pulls its image, the others wait for it: written": {secret: kuberaysOld(), write: true,
			pod: rayPod("c1-head", "c1", withStatuses([]corev1.ContainerStatus{waitingOn("wait-gcs-ready", "ImagePullBackOff")}, waitingOn("ray-head", "PodInitializing")))},
		// A real kubelet shows PodInitializing on the init container it is creating, its env read.
		"the first init container in PodInitializing (the kubelet may be creating it): may have been read": {secret: kuberaysOld(),
			pod: rayPod("c1-head", "c1", withStatuses([]corev1.ContainerStatus{waitingOn("wait-gcs-ready", "PodInitializing")}, waitingOn("ray-head", "PodInitializing")))},
		"the second init container waits for the first, which pulls its image: written": {secret: kuberaysOld(), write: true,
			pod: rayPod("c1-head", "c1", withStatuses([]corev1.ContainerStatus{waitingOn("wait-gcs-ready", "ImagePullBackOff"), waitingOn("fetch", "PodInitializing")},
				waitingOn("ray-head", "PodInitializing")))},
		"a young Secret raysync saw created, a container being created: may have been read": {secret: kuberaysNew(),
			pod: rayPod("c1-head", "c1", withStatuses(nil, waitingOn("ray-head", "ContainerCreating")))},
		"a young Secret raysync saw created, the kubelet said nothing yet: written (kubelet start latency)": {secret: kuberaysNew(), write: true,
			pod: rayPod("c1-head", "c1", onNode)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := planCluster(input(cfg, rayCluster("c1"), []*corev1.Secret{sourceSecret(token)}, target(tc.secret), pods(tc.pod), seen, withRotation), cfg)
			wrote := false
			for _, a := range p.Actions {
				if _, ok := a.(UpdateSecret); ok {
					wrote = true
				}
			}
			if wrote != tc.write {
				t.Errorf("wrote %v, want %v", wrote, tc.write)
			}
		})
	}
}

// A Secret in the cluster's namespace with a pod source's name that raysync does not manage is never
// referenced, whichever replica answers and whether or not it ever tried to create the copy.
func TestWebhookNeverReferencesASecretRaysyncDoesNotManage(t *testing.T) {
	theirs := secret(ns, "regcred", map[string]string{".dockerconfigjson": `{"auths":{}}`}, func(s *corev1.Secret) { s.Type = corev1.SecretTypeDockerConfigJson })
	a := admissionHarness(t, []*unstructured.Unstructured{rayCluster("c1")}, sourceSecret(token), theirs)
	ops, result, _ := a.Pod(context.Background(), ns, podJSON(t, "c1", map[string]any{"name": "ray-worker"}))
	for _, op := range ops {
		if op.Path == "/spec/imagePullSecrets" {
			t.Fatalf("pod given %v, a reference to a Secret raysync does not manage (%s)", op.Value, result)
		}
	}
}

// A pod arriving with a stale raysync entry is corrected, not answered "unchanged".
func TestWebhookCorrectsStaleEntries(t *testing.T) {
	a := admissionHarness(t, []*unstructured.Unstructured{rayCluster("c1", autoscaling)}, sourceSecret(token))
	auto := map[string]any{"name": "autoscaler", "image": "registry.example/ray:1",
		"env":          []any{map[string]any{"name": podtemplate.EnvClientCertPath, "value": "/old/tls.crt"}, map[string]any{"name": podtemplate.EnvClientKeyPath, "value": "/old/tls.key"}},
		"volumeMounts": []any{map[string]any{"name": names.TLSVolumeName, "mountPath": "/old", "readOnly": true}}}
	raw := podJSON(t, "c1", map[string]any{"name": "ray-head"}, auto)
	var pod map[string]any
	_ = json.Unmarshal(raw, &pod)
	spec := pod["spec"].(map[string]any)
	spec["imagePullSecrets"] = []any{map[string]any{"name": "regcred"}}
	spec["volumes"] = []any{map[string]any{"name": names.TLSVolumeName, "secret": map[string]any{"secretName": "renamed-away"}}}
	raw, _ = json.Marshal(pod)
	ops, result, _ := a.Pod(context.Background(), ns, raw)
	want := []podtemplate.PatchOp{
		{Op: "add", Path: "/spec/containers/1/env", Value: []any{map[string]any{"name": podtemplate.EnvClientCertPath, "value": podtemplate.DefaultTLSMountPath + "/tls.crt"},
			map[string]any{"name": podtemplate.EnvClientKeyPath, "value": podtemplate.DefaultTLSMountPath + "/tls.key"}}},
		{Op: "add", Path: "/spec/containers/1/volumeMounts", Value: []any{map[string]any{"name": names.TLSVolumeName, "mountPath": podtemplate.DefaultTLSMountPath, "readOnly": true}}},
		{Op: "add", Path: "/spec/volumes", Value: []any{map[string]any{"name": names.TLSVolumeName, "secret": map[string]any{"secretName": "client-tls"}}}},
	}
	if diff := cmp.Diff(want, ops); diff != "" || result != names.AdmitMutated {
		t.Errorf("result %s, patch (-want +got):\n%s", result, diff)
	}
}

// A running pod counts as stale when any entry raysync owns is wrong, not only the cert path.
func TestRunningPodWithAStaleAutoscalerEntryIsReported(t *testing.T) {
	srv := &validate.APIServer{Host: "https://proxy.example", Port: 6443}
	tlsT := podtemplate.TLS{SecretName: "client-tls", MountPath: podtemplate.DefaultTLSMountPath, APIServer: srv}.Prepared()
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Volumes: []corev1.Volume{{Name: names.TLSVolumeName, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "client-tls"}}}},
		Containers: []corev1.Container{{Name: podtemplate.AutoscalerContainer,
			VolumeMounts: []corev1.VolumeMount{{Name: names.TLSVolumeName, MountPath: podtemplate.DefaultTLSMountPath, ReadOnly: true}},
			Env: []corev1.EnvVar{{Name: podtemplate.EnvClientCertPath, Value: podtemplate.DefaultTLSMountPath + "/tls.crt"}, {Name: podtemplate.EnvClientKeyPath, Value: podtemplate.DefaultTLSMountPath + "/tls.key"},
				{Name: podtemplate.EnvServiceHost, Value: "https://old-proxy.example"}, {Name: podtemplate.EnvServicePortHTTPS, Value: "6443"}}}}}}
	if got := podMissing(pod, podtemplate.Config{TLS: tlsT}, true).reasons(); !cmp.Equal(got, []string{names.StaleAutoscalerTLS}) {
		t.Errorf("missing %v, want autoscaler_tls (KUBERNETES_SERVICE_HOST is stale)", got)
	}
	pod.Spec.Containers[0].Env[2].Value = srv.Host
	if got := podMissing(pod, podtemplate.Config{TLS: tlsT}, true); got != 0 {
		t.Errorf("missing %v for a pod with every entry right", got)
	}
}

// The admitter's memo of validated sources never outlives a change of a source, even within its
// second: a fixed clock leaves only the source's UID and resourceVersion to notice it.
func TestAdmitterSeesSourceChangesAtOnce(t *testing.T) {
	h := newHarness(t, false, []*unstructured.Unstructured{rayCluster("c1")}, sourceSecret(token))
	a := h.ctrl.Admitter()
	frozen := time.Now()
	a.now = func() time.Time { return frozen }
	raw, _ := json.Marshal(secret(ns, "c1", map[string]string{"auth_token": oldToken}, ownedBy("c1")))
	// the token of the Secret the admission creates (each time anew)
	tokenIn := func() string {
		_ = h.kube.CoreV1().Secrets(ns).Delete(context.Background(), "c1", metav1.DeleteOptions{})
		if result, _ := a.Secret(context.Background(), ns, raw, false); result != names.AdmitCreated {
			return ""
		}
		s, err := h.kube.CoreV1().Secrets(ns).Get(context.Background(), "c1", metav1.GetOptions{})
		if err != nil {
			return ""
		}
		return string(s.Data["auth_token"])
	}
	if got := tokenIn(); got != token {
		t.Fatal("first admission does not create the Secret with the canonical token")
	}
	const updated, recreated = "rotated-token-value-0123456789abcdef", "recreated-token-value-0123456789abcd"
	if err := h.updateSource(sourceSecret(updated)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return tokenIn() == updated }) // a new resourceVersion
	ctx := context.Background()
	cur, err := h.kube.CoreV1().Secrets(tokenSrc.Namespace).Get(ctx, tokenSrc.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.kube.CoreV1().Secrets(tokenSrc.Namespace).Delete(ctx, tokenSrc.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again := sourceSecret(recreated)
	again.UID, again.ResourceVersion = "s-recreated", cur.ResourceVersion // only the UID tells it apart
	waitFor(t, func() bool { _, ok := h.ctrl.caches.Source(tokenSrc); return !ok })
	if _, err := h.kube.CoreV1().Secrets(tokenSrc.Namespace).Create(ctx, again, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return tokenIn() == recreated }) // a new UID, maybe the same resourceVersion
}
