package projection

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Admission: what a Ray pod carries when it is created, and a new cluster's auth Secret created by
// raysync before KubeRay's. The webhook (internal/admission) asks on every replica; the answers come
// from the caches and the same pure code as the template patch and the token plan, never reject, and
// never carry a token: what raysync cannot decide is admitted as it is, and the controller repairs it
// as it would without the webhook.

// Admitter answers admission requests from a controller's caches.
type Admitter struct {
	gather *gatherer
	now    func() time.Time
	// kube creates a new cluster's auth Secret (the only write the webhook makes); recorder says when
	// that puts a running cluster's token back.
	kube     kubernetes.Interface
	recorder record.EventRecorder
	// Wait bounds how long a request waits for the caches to show the RayCluster: KubeRay creates a
	// cluster's Secret and pods moments after the cluster itself.
	Wait time.Duration

	mu       sync.Mutex
	memoKey  string
	memoAt   time.Time
	memoView *sourceView
}

// sources is the validated sources, reused for up to a second while no source Secret changed: a
// burst of pods would otherwise parse the client certificate once per pod.
func (a *Admitter) sources(now time.Time) *sourceView {
	var key strings.Builder
	for _, n := range a.gather.cfg.Watched() {
		if s, ok := a.gather.caches.Source(n); ok {
			key.WriteString(string(s.UID) + "/" + s.ResourceVersion)
		}
		key.WriteByte(',')
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.memoView == nil || a.memoKey != key.String() || now.Sub(a.memoAt) > time.Second || now.Before(a.memoAt) {
		a.memoView, a.memoKey, a.memoAt = a.gather.sources(now), key.String(), now
	}
	return a.memoView
}

// Admitter returns the controller's admission decisions. They need no leadership: the one write they
// make, creating a cluster's auth Secret as raysync's pre-creation would, is the same on every replica
// (AlreadyExists: another was first).
func (c *Controller) Admitter() *Admitter {
	return &Admitter{gather: c.gather, now: c.now, Wait: 500 * time.Millisecond, kube: c.apply.kube, recorder: c.recorder}
}

// cluster finds the in-scope RayCluster name in ns whose UID is uid, waiting up to a.Wait for the
// caches to show it: KubeRay creates a cluster's Secret and pods moments after the cluster itself. A
// request naming a cluster the caches hold under another UID waits as long as one naming no cluster,
// so that an unauthenticated caller learns nothing from the answer's timing about which names exist.
// uid "" takes the cluster of that name whatever its UID (a RayJob's, named by the RayJob's status).
func (a *Admitter) cluster(ctx context.Context, ns, name string, uid types.UID) (*unstructured.Unstructured, string) {
	if name == "" {
		return nil, "no ray.io/cluster label"
	}
	deadline := time.Now().Add(a.Wait)
	for {
		if rc, ok := a.gather.caches.RayCluster(ns, name); ok && (rc.GetUID() == uid || uid == "") {
			if !a.gather.cfg.InScope(rc) {
				return nil, "RayCluster not in scope"
			}
			return rc, ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, "not controlled by a RayCluster in raysync's cache"
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// objectHead is what a decision reads of an object before anything else: its metadata, typed. The
// rest (a pod's spec) is decoded only for a pod of an in-scope cluster.
type objectHead struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

// Pod decides the patch for a Ray pod being created in ns (raw is the pod's JSON).
func (a *Admitter) Pod(ctx context.Context, ns string, raw []byte) (ops []podtemplate.PatchOp, result, reason string) {
	var head objectHead
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, names.AdmitInvalid, "pod is not a JSON object with readable metadata"
	}
	owner := metav1.GetControllerOfNoCopy(&head.Metadata)
	if owner != nil && owner.Kind == "Job" && strings.HasPrefix(owner.APIVersion, "batch/") {
		return a.submitter(ctx, ns, owner.Name, raw)
	}
	if owner == nil || owner.Kind != kuberay.RayClusterGVK.Kind {
		return nil, names.AdmitSkipped, "pod not controlled by a RayCluster"
	}
	name := head.Metadata.Labels[kuberay.ClusterLabel]
	if owner.Name != name {
		return nil, names.AdmitSkipped, "pod not controlled by its RayCluster"
	}
	rc, why := a.cluster(ctx, ns, name, owner.UID)
	if rc == nil {
		return nil, names.AdmitSkipped, why
	}
	var pod map[string]any
	if err := json.Unmarshal(raw, &pod); err != nil {
		return nil, names.AdmitInvalid, "pod is not a JSON object"
	}
	now := a.now()
	in := a.gather.cluster(rc, a.sources(now), now)
	tc, _, _ := podTemplateConfig(in, &ClusterPlan{}, nil)
	ops, err := podtemplate.PodPatch(pod, tc, podtemplate.Autoscaling(rc))
	switch {
	case err != nil:
		return nil, names.AdmitInvalid, err.Error()
	case len(ops) == 0:
		return nil, names.AdmitUnchanged, ""
	}
	return ops, names.AdmitMutated, ""
}

// submitter decides the patch for a pod of a Job named job: a RayJob's submitter in K8sJobMode (the
// default) runs the Ray image in a Job's pod that KubeRay names after the RayJob and gives no pull
// secret (its default template has none, whatever the head's). It gets the pull secrets of the
// RayJob's cluster (the autoscaler's certificate is the head's alone). A Job that is no in-scope
// RayJob's is left alone.
func (a *Admitter) submitter(ctx context.Context, ns, job string, raw []byte) ([]podtemplate.PatchOp, string, string) {
	rj, ok := a.gather.caches.RayJob(ns, job)
	if !ok {
		return nil, names.AdmitSkipped, "Job pod of no RayJob in raysync's cache"
	}
	if mode, _, _ := unstructured.NestedString(rj.Object, "spec", "submissionMode"); mode != "" && mode != "K8sJobMode" {
		return nil, names.AdmitSkipped, "RayJob not in K8sJobMode: it has no submitter pod"
	}
	cluster, _, _ := unstructured.NestedString(rj.Object, "status", "rayClusterName")
	rc, why := a.cluster(ctx, ns, cluster, "")
	if rc == nil {
		return nil, names.AdmitSkipped, "submitter: " + why
	}
	var pod map[string]any
	if err := json.Unmarshal(raw, &pod); err != nil {
		return nil, names.AdmitInvalid, "pod is not a JSON object"
	}
	now := a.now()
	in := a.gather.cluster(rc, a.sources(now), now)
	tc, _, _ := podTemplateConfig(in, &ClusterPlan{}, nil)
	tc.TLS = nil
	ops, err := podtemplate.PodPatch(pod, tc, false)
	switch {
	case err != nil:
		return nil, names.AdmitInvalid, err.Error()
	case len(ops) == 0:
		return nil, names.AdmitUnchanged, ""
	}
	return ops, names.AdmitMutated, ""
}

// Secret acts on a Secret being created in ns. For KubeRay's generated auth Secret of an in-scope
// cluster it creates raysync's own, in KubeRay's shape and with the canonical token, through the API
// (as the controller's pre-creation does), before KubeRay's create goes on: that create then fails
// with AlreadyExists, and KubeRay, which creates its pods only after its Secret exists (reconcileAuthSecret
// returns the error first, v1.5.1 and v1.6.1 alike), uses raysync's on its next pass. So no pod can
// start on KubeRay's random token, and the answer carries no token: the request is admitted unchanged.
// A Secret KubeRay re-creates under pods already on a node gets the canonical token only when the
// RayClusters' records say their started containers hold it (plan_token_record.go); else it keeps
// KubeRay's, and the cluster is behind.
func (a *Admitter) Secret(ctx context.Context, ns string, raw []byte, dryRun bool) (result, reason string) {
	var s corev1.Secret
	if err := json.Unmarshal(raw, &s); err != nil {
		return names.AdmitInvalid, "Secret unreadable"
	}
	owner := metav1.GetControllerOf(&s)
	if owner == nil || owner.Kind != kuberay.RayClusterGVK.Kind {
		return names.AdmitSkipped, "not controlled by a RayCluster"
	}
	if s.Annotations[names.TokenSHA256Annotation] != "" {
		// raysync's own create (the controller's pre-creation, or this webhook's) passes through here
		// too: creating it again would call the webhook again, without end.
		return names.AdmitUnchanged, "raysync's own Secret"
	}
	rc, why := a.cluster(ctx, ns, owner.Name, owner.UID)
	if rc == nil {
		return names.AdmitSkipped, why
	}
	t, ok, err := TokenTargetFor(rc, a.gather.cfg.Source)
	if err != nil || !ok || t.Mode != Generated || t.Name != s.Name {
		return names.AdmitSkipped, "not the cluster's generated auth Secret"
	}
	now := a.now()
	in := a.gather.cluster(rc, a.sources(now), now)
	src := in.Sources.token
	if !src.valid() {
		return names.AdmitSkipped, "canonical source invalid"
	}
	at, restores := bornAt(now), false
	readers := append(slices.Clip(in.Pods), in.Readers...)
	if slices.ContainsFunc(readers, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" || podStarted(p) }) {
		// Containers of a cluster reading it may run on a token raysync cannot tell (the Secret they
		// read is gone, and with it raysync's mark), unless the RayClusters' records tell it.
		if at, restores = recordedOnCurrent(in, readers, nil, src.digest); !restores {
			return names.AdmitSkipped, "pods reading this Secret may run on another token"
		}
	}
	if dryRun {
		return names.AdmitSkipped, "dry run: raysync creates nothing"
	}
	want := desiredGeneratedSecret(rc, t.Name, src.value, a.gather.cfg.Source, at)
	if _, err := a.kube.CoreV1().Secrets(ns).Create(ctx, want, metav1.CreateOptions{FieldManager: names.FieldManager}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return names.AdmitUnchanged, "the Secret exists already" // raysync's pre-creation or another replica was first
		}
		// Admitted as it is: KubeRay's Secret is created, and the controller writes the token into it
		// as it does when the webhook is bypassed.
		return names.AdmitSkipped, "could not create raysync's Secret: " + err.Error()
	}
	if restores && a.recorder != nil {
		a.recorder.Event(rc, corev1.EventTypeWarning, names.ReasonTokenRestored, restoredFromRecordMessage(t, in, a.gather.cfg.Source))
	}
	return names.AdmitCreated, ""
}
