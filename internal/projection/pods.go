package projection

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
)

// Event reasons of the pod-template concern.
const (
	ReasonTemplatePatched       = "TemplatePatched"
	ReasonTemplatePatchDeferred = "TemplatePatchDeferred"
	ReasonPodRecycled           = "PodRecycled"
	ReasonStalePodConfig        = "StalePodConfig"
)

// Managed-copy kinds (annotation raysync.dev/kind).
const (
	KindPullSecret    = "pull-secret"
	KindAutoscalerTLS = "autoscaler-tls"
)

// RecycleGrace is the minimum age of a pod raysync recycles (creation timestamps have 1 s resolution).
var RecycleGrace = 5 * time.Second

// PodOptions configure registry pull secrets and the autoscaler's client TLS. Zero value: both off.
type PodOptions struct {
	PullSecrets    []types.NamespacedName
	AutoscalerTLS  *types.NamespacedName
	APIServer      *APIServer
	MountPath      string
	RecyclePending bool
	AllowRecreate  bool
}

func (o PodOptions) enabled() bool { return len(o.PullSecrets) > 0 || o.AutoscalerTLS != nil }

// templateConfigFor computes what rc's templates must carry from the cached sources, ensuring the
// managed copies in rc's namespace exist. Sources that are invalid or whose copy name is taken by a
// foreign Secret are left out (reported elsewhere); nothing is written for them.
func (c *Controller) templateConfigFor(ctx context.Context, rc *unstructured.Unstructured, write bool) (TemplateConfig, error) {
	var cfg TemplateConfig
	for _, src := range c.opts.Pods.PullSecrets {
		s, _ := c.caches.Source(src)
		if ValidatePullSecret(s) != nil {
			continue
		}
		owned, err := c.ensureCopy(ctx, rc, s, KindPullSecret, write)
		if err != nil {
			return cfg, err
		}
		if owned {
			cfg.PullSecrets = append(cfg.PullSecrets, src.Name)
		}
	}
	if src := c.opts.Pods.AutoscalerTLS; src != nil && Autoscaling(rc) {
		s, _ := c.caches.Source(*src)
		info, err := ValidateAutoscalerTLS(s, c.now())
		if err == nil {
			owned, err := c.ensureCopy(ctx, rc, s, KindAutoscalerTLS, write)
			if err != nil {
				return cfg, err
			}
			if owned {
				cfg.TLS = &TLSTemplate{SecretName: src.Name, MountPath: c.opts.Pods.MountPath, HasCA: info.HasCA, APIServer: c.opts.Pods.APIServer}
			}
		}
	}
	return cfg, nil
}

// copyData is what a managed copy of src holds: everything for a pull secret, the TLS keys for a certificate.
func copyData(src *corev1.Secret, kind string) map[string][]byte {
	out := map[string][]byte{}
	for k, v := range src.Data {
		if kind == KindAutoscalerTLS && k != TLSCertKey && k != TLSKeyKey && k != TLSCAKey {
			continue
		}
		out[k] = bytes.Clone(v)
	}
	return out
}

func sameData(a, b map[string][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return true
}

func isManagedCopyOf(s *corev1.Secret, source types.NamespacedName, kind string) bool {
	return s.Labels[informer.ManagedByLabel] == informer.ManagedByValue &&
		s.Annotations[SourceAnnotation] == source.String() && s.Annotations[KindAnnotation] == kind
}

// ensureCopy keeps a raysync-managed copy of src (same name) in rc's namespace equal to it by content.
// A source in rc's own namespace is used directly. owned is false when a Secret raysync does not
// manage already has the name: it is never touched, and rc gets a TargetNotOwned Event.
func (c *Controller) ensureCopy(ctx context.Context, rc *unstructured.Unstructured, src *corev1.Secret, kind string, write bool) (owned bool, err error) {
	ns, srcName := rc.GetNamespace(), types.NamespacedName{Namespace: src.Namespace, Name: src.Name}
	if ns == src.Namespace {
		return true, nil
	}
	want := copyData(src, kind)
	cur, _ := c.caches.ManagedSecret(ns, src.Name)
	if cur == nil {
		if !write {
			return false, nil
		}
		desired := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: src.Name, Namespace: ns,
				Labels:      map[string]string{informer.ManagedByLabel: informer.ManagedByValue},
				Annotations: map[string]string{SourceAnnotation: srcName.String(), KindAnnotation: kind}},
			Type: src.Type, Data: want,
		}
		_, err := c.writer.create(ctx, desired)
		if err == nil {
			c.metrics.Syncs.WithLabelValues(metrics.ResultCreated).Inc()
			c.log.Info("managed copy created", zap.String("namespace", ns), zap.String("secret", src.Name), zap.String("source", srcName.String()))
			return true, nil
		}
		if namespaceTerminating(err) {
			return false, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			c.metrics.Syncs.WithLabelValues(metrics.ResultError).Inc()
			return false, fmt.Errorf("create copy %s/%s: %w", ns, src.Name, err)
		}
		if cur, err = c.writer.get(ctx, ns, src.Name); err != nil {
			return false, fmt.Errorf("get copy %s/%s: %w", ns, src.Name, err)
		}
	}
	if !isManagedCopyOf(cur, srcName, kind) {
		if write {
			c.refusedCopies.Store(ns+"/"+src.Name, struct{}{})
			c.metrics.Syncs.WithLabelValues(metrics.ResultRefused).Inc()
			c.reportOnce(rc, corev1.EventTypeWarning, ReasonTargetNotOwned,
				"Secret %s already exists and is not managed by raysync; not copying %s into it and not using it", src.Name, srcName)
		}
		return false, nil
	}
	c.refusedCopies.Delete(ns + "/" + src.Name)
	if sameData(cur.Data, want) && cur.Type == src.Type {
		return true, nil
	}
	if !write {
		return true, nil
	}
	if cur.Type != src.Type {
		return false, fmt.Errorf("copy %s/%s has type %q, source has %q: delete the copy to let raysync recreate it", ns, src.Name, cur.Type, src.Type)
	}
	upd := cur.DeepCopy()
	upd.Data = want
	if _, err := c.writer.update(ctx, upd); err != nil {
		c.metrics.Syncs.WithLabelValues(metrics.ResultError).Inc()
		return false, fmt.Errorf("update copy %s/%s: %w", ns, src.Name, err)
	}
	c.metrics.Syncs.WithLabelValues(metrics.ResultUpdated).Inc()
	c.log.Info("managed copy updated", zap.String("namespace", ns), zap.String("secret", src.Name), zap.String("source", srcName.String()))
	return true, nil
}

// syncPodConfig makes rc's pod templates carry the pull secrets and autoscaler TLS, then deals
// with pods created before that: recycles those that never started, reports running ones.
func (c *Controller) syncPodConfig(ctx context.Context, key informer.Key, rc *unstructured.Unstructured, log *zap.Logger) error {
	if !c.opts.Pods.enabled() {
		return nil
	}
	cfg, err := c.templateConfigFor(ctx, rc, true)
	if err != nil {
		return err
	}
	desired, changed, err := desiredTemplates(rc, cfg)
	if err != nil {
		c.reportOnce(rc, corev1.EventTypeWarning, ReasonInvalidSpec, "raysync cannot read the pod templates: %v; leaving them alone", err)
		log.Warn("cannot read pod templates", zap.Error(err))
		return nil
	}
	if changed {
		if c.patchDeferred(rc) {
			c.reportOnce(rc, corev1.EventTypeWarning, ReasonTemplatePatchDeferred,
				"upgradeStrategy Recreate would restart every running pod to add raysync's pull secrets or autoscaler TLS; not patching (start raysync with --allow-recreate to permit it)")
			return c.handlePods(ctx, key, rc, cfg, false, log)
		}
		if err := c.patchTemplates(ctx, rc, desired); err != nil {
			return err
		}
		if _, seen := c.templatesApplied.LoadOrStore(rc.GetUID(), struct{}{}); seen {
			// raysync had put its entries in place before: KubeRay (or someone) wiped them.
			c.metrics.TemplateReapplied.Inc()
		}
		if !c.opts.DryRun {
			log.Info("pod templates patched with raysync's entries")
			c.recorder.Event(rc, corev1.EventTypeNormal, ReasonTemplatePatched, "pod templates now carry raysync's pull secrets / autoscaler TLS")
		}
		return nil // the pods are handled on the next pass, once the cache holds the patched template
	}
	c.templatesApplied.LoadOrStore(rc.GetUID(), struct{}{})
	return c.handlePods(ctx, key, rc, cfg, c.opts.Pods.RecyclePending, log)
}

// patchDeferred: with upgradeStrategy Recreate, a template change restarts every pod, so raysync waits
// while the cluster has running pods (unless --allow-recreate).
func (c *Controller) patchDeferred(rc *unstructured.Unstructured) bool {
	return RecreateStrategy(rc) && !c.opts.Pods.AllowRecreate && c.anyPodStarted(rc)
}

func (c *Controller) anyPodStarted(rc *unstructured.Unstructured) bool {
	for _, p := range c.caches.Pods(rc.GetNamespace(), rc.GetName()) {
		if podStarted(p) {
			return true
		}
	}
	return false
}

// patchTemplates sends a JSON merge patch of exactly raysync's changes, with rc's resourceVersion as
// precondition: a concurrent change of rc fails with a conflict and is retried on fresh data.
func (c *Controller) patchTemplates(ctx context.Context, rc, desired *unstructured.Unstructured) error {
	before, err := json.Marshal(rc.Object)
	if err != nil {
		return err
	}
	after, err := json.Marshal(desired.Object)
	if err != nil {
		return err
	}
	patch, err := jsonpatch.CreateMergePatch(before, after)
	if err != nil {
		return err
	}
	var p map[string]any
	if err := json.Unmarshal(patch, &p); err != nil {
		return err
	}
	p["metadata"] = map[string]any{"resourceVersion": rc.GetResourceVersion()}
	if patch, err = json.Marshal(p); err != nil {
		return err
	}
	if c.opts.DryRun {
		c.log.Info("dry-run: would patch RayCluster pod templates", zap.String("namespace", rc.GetNamespace()), zap.String("raycluster", rc.GetName()))
		return nil
	}
	_, err = c.dyn.Resource(kuberay.RayClusterGVR).Namespace(rc.GetNamespace()).Patch(ctx, rc.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: fieldManager})
	if err != nil {
		return fmt.Errorf("patch RayCluster %s/%s templates: %w", rc.GetNamespace(), rc.GetName(), err)
	}
	return nil
}

// handlePods recycles never-started pods that lack raysync's entries (KubeRay recreates them from the
// fixed template; only when recycle is set) and reports running ones; a running pod is never deleted.
func (c *Controller) handlePods(ctx context.Context, key informer.Key, rc *unstructured.Unstructured, cfg TemplateConfig, recycle bool, log *zap.Logger) error {
	autoscaling := Autoscaling(rc)
	var errs []error
	stale := map[string][]string{}
	for _, p := range c.caches.Pods(rc.GetNamespace(), rc.GetName()) {
		missing := podMissing(p, cfg, autoscaling)
		if len(missing) == 0 {
			continue
		}
		if !recyclable(p) {
			if podStarted(p) && p.DeletionTimestamp == nil {
				for _, m := range missing {
					stale[m] = append(stale[m], p.Name)
				}
			}
			continue
		}
		if !recycle {
			continue
		}
		// KubeRay counts on seeing the pods it creates (its scale expectations); a pod deleted before
		// KubeRay observed it stalls recreation for 30 s or more. Give it a moment first.
		if age := c.now().Sub(p.CreationTimestamp.Time); age < RecycleGrace {
			c.queue.AddAfter(key, RecycleGrace-age)
			continue
		}
		if c.opts.DryRun {
			log.Info("dry-run: would delete pending pod to recreate it from the fixed template", zap.String("pod", p.Name))
			continue
		}
		uid, rv := p.UID, p.ResourceVersion
		err := c.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case err == nil:
			for _, m := range missing {
				c.metrics.PodsRecycled.WithLabelValues(m).Inc()
			}
			log.Info("recycled pending pod created before the template fix", zap.String("pod", p.Name), zap.Strings("missing", missing))
			c.recorder.Eventf(rc, corev1.EventTypeNormal, ReasonPodRecycled,
				"deleted pending pod %s (missing %s, containers never started) so KubeRay recreates it from the fixed template", p.Name, strings.Join(missing, ", "))
		case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
			// Gone or changed since we looked: the next event brings it back to us.
		default:
			errs = append(errs, fmt.Errorf("recycle pod %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	for reason, pods := range stale {
		k, list := rc.GetNamespace()+"/"+rc.GetName()+"/"+reason, strings.Join(pods, ",")
		if prev, ok := c.staleConfigReported.Load(k); ok && prev.(string) == list {
			continue
		}
		c.staleConfigReported.Store(k, list)
		c.recorder.Eventf(rc, corev1.EventTypeWarning, ReasonStalePodConfig,
			"%d running Ray pod(s) (e.g. %s) lack raysync's %s; they are not deleted and pick it up when restarted", len(pods), pods[0], reason)
	}
	return errors.Join(errs...)
}
