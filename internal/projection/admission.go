package projection

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Admission: what a Ray pod, or a new cluster's auth Secret, carries when it is created. The webhook
// (internal/admission) asks on every replica; the answers come from the caches and the same pure code
// as the template patch, with no API call, and never reject: what raysync cannot decide is admitted
// as it is, and the controller repairs it as it would without the webhook.

// Admitter answers admission requests from a controller's caches.
type Admitter struct {
	gather *gatherer
	now    func() time.Time
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

// Admitter returns the controller's admission decisions (they need no leadership: they write nothing).
func (c *Controller) Admitter() *Admitter {
	return &Admitter{gather: c.gather, now: c.now, Wait: 500 * time.Millisecond}
}

// cluster finds the in-scope RayCluster name in ns, waiting up to a.Wait for the caches to show it.
func (a *Admitter) cluster(ctx context.Context, ns, name string) (*unstructured.Unstructured, string) {
	if name == "" {
		return nil, "no ray.io/cluster label"
	}
	deadline := time.Now().Add(a.Wait)
	for {
		if rc, ok := a.gather.caches.RayCluster(ns, name); ok {
			if !a.gather.cfg.InScope(rc) {
				return nil, "RayCluster not in scope"
			}
			return rc, ""
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, "RayCluster not in raysync's cache"
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Pod decides the patch for a Ray pod being created in ns (raw is the pod's JSON).
func (a *Admitter) Pod(ctx context.Context, ns string, raw []byte) (ops []podtemplate.PatchOp, result, reason string) {
	var pod map[string]any
	if err := json.Unmarshal(raw, &pod); err != nil {
		return nil, names.AdmitInvalid, "pod is not a JSON object"
	}
	meta := &unstructured.Unstructured{Object: pod} // reads metadata in place; wrong types read as absent
	rc, why := a.cluster(ctx, ns, meta.GetLabels()[kuberay.ClusterLabel])
	if rc == nil {
		return nil, names.AdmitSkipped, why
	}
	if owner := metav1.GetControllerOf(meta); owner == nil || owner.UID != rc.GetUID() {
		return nil, names.AdmitSkipped, "pod not controlled by its RayCluster"
	}
	now := a.now()
	in := a.gather.cluster(rc, a.sources(now), now)
	tc, _, _ := podTemplateConfig(in, &ClusterPlan{})
	ops, err := podtemplate.PodPatch(pod, tc, podtemplate.Autoscaling(rc))
	switch {
	case err != nil:
		return nil, names.AdmitInvalid, err.Error()
	case len(ops) == 0:
		return nil, names.AdmitUnchanged, ""
	}
	return ops, names.AdmitMutated, ""
}

// Secret decides the patch for a Secret being created in ns: KubeRay's generated auth Secret of an
// in-scope cluster is born with the canonical token, unless containers of that cluster may already
// run on another token (KubeRay re-creating a deleted Secret).
func (a *Admitter) Secret(ctx context.Context, ns string, raw []byte) (ops []podtemplate.PatchOp, result, reason string) {
	var s corev1.Secret
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, names.AdmitInvalid, "Secret unreadable"
	}
	owner := metav1.GetControllerOf(&s)
	if owner == nil || owner.Kind != kuberay.RayClusterGVK.Kind {
		return nil, names.AdmitSkipped, "not controlled by a RayCluster"
	}
	rc, why := a.cluster(ctx, ns, owner.Name)
	if rc == nil {
		return nil, names.AdmitSkipped, why
	}
	t, ok, err := TokenTargetFor(rc, a.gather.cfg.Source)
	if err != nil || !ok || t.Mode != Generated || t.Name != s.Name || rc.GetUID() != owner.UID {
		return nil, names.AdmitSkipped, "not the cluster's generated auth Secret"
	}
	now := a.now()
	in := a.gather.cluster(rc, a.sources(now), now)
	src := in.Sources.token
	switch {
	case !src.valid():
		return nil, names.AdmitSkipped, "canonical source invalid"
	case holdsToken(&s, src.value):
		return nil, names.AdmitUnchanged, ""
	case slices.ContainsFunc(append(slices.Clip(in.Pods), in.Readers...), func(p *corev1.Pod) bool { return p.Spec.NodeName != "" || podStarted(p) }):
		// Containers of a cluster reading it may run on a token raysync cannot tell (the Secret they
		// read is gone, and with it raysync's mark): the controller does not write it either.
		return nil, names.AdmitSkipped, "pods reading this Secret may run on another token"
	}
	want := withToken(&s, src.value, a.gather.cfg.Source, now)
	if s.Data == nil {
		ops = append(ops, podtemplate.PatchOp{Op: "add", Path: "/data", Value: map[string][]byte{}})
	}
	ops = append(ops, podtemplate.PatchOp{Op: "add", Path: "/data/" + kuberay.AuthTokenKey, Value: want.Data[kuberay.AuthTokenKey]},
		podtemplate.PatchOp{Op: "add", Path: "/metadata/annotations", Value: want.Annotations})
	return ops, names.AdmitMutated, ""
}
