package projection

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
)

// Event reasons (stable: users alert and filter on them).
const (
	ReasonTokenProjected    = "TokenProjected"
	ReasonTokenRotated      = "TokenRotated"
	ReasonTargetNotOwned    = "TargetNotOwned"
	ReasonStaleToken        = "StaleToken"
	ReasonSourceInvalid     = "SourceInvalid"
	ReasonSourceKeyMismatch = "SourceKeyMismatch"
	ReasonInvalidSpec       = "InvalidSpec"
)

// Options configure the token controller.
type Options struct {
	// Source is the canonical token Secret; SourceKey the data key holding the token.
	Source    types.NamespacedName
	SourceKey string
	// DryRun computes and logs every write, and writes nothing.
	DryRun bool
	// Prune deletes managed copies no RayCluster in their namespace references any more.
	Prune bool
	// Pods configures pull secrets and the autoscaler's client TLS (off when empty).
	Pods PodOptions
}

// Controller keeps every in-scope RayCluster's auth Secret equal to the canonical token.
type Controller struct {
	opts     Options
	caches   *informer.Caches
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	writer   secretWriter
	recorder record.EventRecorder
	metrics  *metrics.Metrics
	log      *zap.Logger
	queue    workqueue.TypedRateLimitingInterface[informer.Key]
	now      func() time.Time

	refused       sync.Map // cluster key -> types.UID: last reconcile met a foreign target Secret
	staleReported sync.Map // types.UID -> [32]byte: StaleToken already reported for this token
	reported      sync.Map // "cluster key/reason" -> reportedAt: Warning already emitted for this cluster generation

	refusedCopies       sync.Map // "ns/name" of a pull/TLS copy name taken by a foreign Secret
	templatesApplied    sync.Map // types.UID: raysync's template entries were in place once
	staleConfigReported sync.Map // "cluster key/reason" -> pods already reported

	srcMu    sync.Mutex
	srcState map[types.NamespacedName]*sourceState
}

// sourceState is what raysync remembers about a source between events (in memory only).
type sourceState struct {
	seen   bool
	digest [32]byte // detects rotations; never logged
	reason string   // why the source is invalid ("" when valid)
}

// New wires a controller to its caches. Call Run to start workers.
func New(kube kubernetes.Interface, dyn dynamic.Interface, caches *informer.Caches, recorder record.EventRecorder, m *metrics.Metrics, log *zap.Logger, opts Options) (*Controller, error) {
	if opts.SourceKey == "" {
		opts.SourceKey = kuberay.AuthTokenKey
	}
	if opts.Pods.MountPath == "" {
		opts.Pods.MountPath = DefaultTLSMountPath
	}
	c := &Controller{
		opts:     opts,
		caches:   caches,
		kube:     kube,
		dyn:      dyn,
		srcState: map[types.NamespacedName]*sourceState{},
		writer:   secretWriter{kube: kube, dryRun: opts.DryRun, log: log},
		recorder: recorder,
		metrics:  m,
		log:      log,
		now:      time.Now,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[informer.Key](5*time.Millisecond, 2*time.Minute),
				// Bounds retries overall; first attempts (plain Add) are never throttled.
				&workqueue.TypedBucketRateLimiter[informer.Key]{Limiter: rate.NewLimiter(rate.Limit(50), 500)},
			),
			workqueue.TypedRateLimitingQueueConfig[informer.Key]{Name: "raysync"}),
	}
	if err := caches.AddEventHandlers(c.queue.Add); err != nil {
		return nil, err
	}
	return c, nil
}

// Run processes keys with the given number of workers until ctx ends. The caches must be started.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	if !c.caches.WaitForSync(ctx.Done()) {
		return errors.New("caches did not sync")
	}
	c.log.Info("starting workers", zap.Int("workers", workers))
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for c.processNext(ctx) {
				}
			}, time.Second)
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	var err error
	switch key.Kind {
	case informer.ClusterKey:
		err = c.syncCluster(ctx, key)
	case informer.NamespaceKey:
		err = c.pruneNamespace(ctx, key.Namespace)
	case informer.SourceKey:
		c.syncSource(types.NamespacedName{Namespace: key.Namespace, Name: key.Name})
	}
	if err == nil {
		c.queue.Forget(key)
		return true
	}
	if apierrors.IsConflict(err) {
		c.log.Debug("conflict, requeued", zap.String("key", key.String()))
	} else {
		c.log.Error("reconcile failed, retrying with backoff", zap.String("key", key.String()),
			zap.Int("retries", c.queue.NumRequeues(key)), zap.Error(err))
	}
	c.queue.AddRateLimited(key)
	return true
}

// syncSource validates one source and accounts for rotations of its content. Targets are reconciled
// by their own keys (the source's event handler enqueues every cluster).
func (c *Controller) syncSource(name types.NamespacedName) {
	src, _ := c.caches.Source(name)
	var err error
	var content []byte
	what := "key " + strconv.Quote(c.opts.SourceKey)
	switch {
	case name == c.opts.Source:
		content, err = ValidateToken(src, c.opts.SourceKey)
	case c.opts.Pods.AutoscalerTLS != nil && name == *c.opts.Pods.AutoscalerTLS:
		what = "the client certificate"
		if _, err = ValidateAutoscalerTLS(src, c.now()); err == nil {
			content = secretContent(src)
		}
	default:
		what = "the registry credentials"
		if err = ValidatePullSecret(src); err == nil {
			content = secretContent(src)
		}
	}
	log := c.log.With(zap.String("source", name.String()))
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	st := c.srcState[name]
	if st == nil {
		st = &sourceState{}
		c.srcState[name] = st
	}
	if err != nil {
		if reason := err.Error(); reason != st.reason {
			st.reason = reason
			log.Error("source is invalid: leaving every target untouched", zap.String("reason", reason))
			c.recorder.Eventf(sourceRef(src, name), corev1.EventTypeWarning, ReasonSourceInvalid,
				"raysync cannot use %s of this Secret: %s; every target keeps what it has", what, reason)
		}
		return
	}
	if st.reason != "" {
		log.Info("source is valid again")
		st.reason = ""
	}
	digest := sha256.Sum256(content)
	if st.seen && digest != st.digest {
		c.metrics.Rotations.WithLabelValues(name.String()).Inc()
		c.metrics.LastRotation.WithLabelValues(name.String()).Set(float64(c.now().UnixNano()) / 1e9)
		log.Info("source content changed: propagating to every target")
	}
	st.seen, st.digest = true, digest
}

// secretContent serialises a Secret's type and data deterministically (for change detection only).
func secretContent(s *corev1.Secret) []byte {
	keys := make([]string, 0, len(s.Data))
	for k := range s.Data {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b := []byte(s.Type)
	for _, k := range keys {
		b = append(b, 0)
		b = append(b, k...)
		b = append(b, 0)
		b = append(b, s.Data[k]...)
	}
	return b
}

// sourceRef is the object a SourceInvalid Event is attached to; a missing Secret gets a reference by name.
func sourceRef(src *corev1.Secret, name types.NamespacedName) *corev1.Secret {
	if src != nil {
		return src
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: name.Namespace, Name: name.Name}}
}

func (c *Controller) clusterLog(rc *unstructured.Unstructured) *zap.Logger {
	fields := []zap.Field{zap.String("namespace", rc.GetNamespace()), zap.String("raycluster", rc.GetName())}
	switch rc.GetLabels()[kuberay.OriginatedFromCRDLabel] {
	case "RayService":
		fields = append(fields, zap.String("rayservice", rc.GetLabels()[kuberay.OriginatedFromNameLabel]))
	case "RayJob":
		fields = append(fields, zap.String("rayjob", rc.GetLabels()[kuberay.OriginatedFromNameLabel]))
	}
	return c.log.With(fields...)
}

// syncCluster reconciles one RayCluster: its token target, then its pod templates and pods.
func (c *Controller) syncCluster(ctx context.Context, key informer.Key) error {
	rc, ok := c.caches.RayCluster(key.Namespace, key.Name)
	if !ok {
		c.forget(key)
		return nil
	}
	if rc.GetAnnotations()[SkipAnnotation] == "true" || !kuberay.ValidClusterName(rc.GetName()) || rc.GetDeletionTimestamp() != nil {
		c.forget(key)
		return nil
	}
	log := c.clusterLog(rc)
	return errors.Join(c.syncToken(ctx, key, rc, log), c.syncPodConfig(ctx, key, rc, log))
}

// forget drops what raysync remembers about a cluster that is gone or out of scope.
func (c *Controller) forget(key informer.Key) {
	c.refused.Delete(key.String())
	for _, r := range []string{ReasonPullSecret, ReasonAutoscalerTLS} {
		c.staleConfigReported.Delete(key.String() + "/" + r)
	}
	for _, r := range onceReasons {
		c.reported.Delete(key.String() + "/" + r)
	}
}

// syncToken makes one RayCluster's token target hold the canonical token.
func (c *Controller) syncToken(ctx context.Context, key informer.Key, rc *unstructured.Unstructured, log *zap.Logger) error {
	t, ok, err := TokenTargetFor(rc, c.opts.Source)
	if err != nil {
		c.reportOnce(rc, corev1.EventTypeWarning, ReasonInvalidSpec, "raysync cannot read spec.authOptions: %v; leaving this cluster alone", err)
		log.Warn("cannot read spec.authOptions", zap.Error(err))
		return nil
	}
	if !ok {
		c.refused.Delete(key.String())
		return nil
	}
	log = log.With(zap.String("secret", t.Name), zap.String("source", c.opts.Source.String()))
	src, _ := c.caches.Source(c.opts.Source)
	token, err := ValidateToken(src, c.opts.SourceKey)
	if err != nil {
		return nil // syncSource reports it; every target keeps its token
	}
	if t.IsSource {
		if !holdsToken(src, token) {
			c.reportOnce(rc, corev1.EventTypeWarning, ReasonSourceKeyMismatch,
				"spec.authOptions.secretName names the canonical source %s, but KubeRay reads key %q and the source keeps its token in %q: Ray pods will fail to start",
				c.opts.Source, kuberay.AuthTokenKey, c.opts.SourceKey)
		}
		return nil
	}

	var current *corev1.Secret
	if t.Mode == Generated {
		current, _ = c.caches.ClusterSecret(t.Namespace, t.Name)
	} else {
		current, _ = c.caches.ManagedSecret(t.Namespace, t.Name)
	}
	if current == nil {
		var desired *corev1.Secret
		if t.Mode == Generated {
			desired = desiredGeneratedSecret(rc, t.Name, token, c.opts.Source, c.now())
		} else {
			desired = desiredManagedCopy(t.Namespace, t.Name, token, c.opts.Source, c.now())
		}
		_, err := c.writer.create(ctx, desired)
		switch {
		case err == nil:
			c.written(rc, log, metrics.ResultCreated, ReasonTokenProjected, "created")
			return nil
		case namespaceTerminating(err):
			log.Debug("namespace is being deleted: nothing to project")
			return nil
		case !apierrors.IsAlreadyExists(err):
			c.metrics.Syncs.WithLabelValues(metrics.ResultError).Inc()
			return fmt.Errorf("create token Secret %s/%s: %w", t.Namespace, t.Name, err)
		}
		// Not in our cache: KubeRay was faster (and our watch lags), or a Secret we do not own.
		if current, err = c.writer.get(ctx, t.Namespace, t.Name); apierrors.IsNotFound(err) {
			return nil // deleted meanwhile (its cluster is going); the delete event brings us back if not
		} else if err != nil {
			return fmt.Errorf("get token Secret %s/%s: %w", t.Namespace, t.Name, err)
		}
	}

	var wrote, rotated bool
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !ownsTokenTarget(t, rc, current, c.opts.Source) {
			return errNotOwned
		}
		if holdsToken(current, token) {
			return nil
		}
		rotated = current.Annotations[TokenSHA256Annotation] != ""
		_, err := c.writer.update(ctx, withToken(current, token, c.opts.Source, c.now()))
		if apierrors.IsConflict(err) {
			var gerr error
			if current, gerr = c.writer.get(ctx, t.Namespace, t.Name); gerr != nil {
				return gerr
			}
		}
		wrote = err == nil
		return err
	})
	switch {
	case apierrors.IsNotFound(err) || namespaceTerminating(err):
		// The target vanished under us (its cluster or namespace is being deleted). Not an error:
		// the Secret's delete event re-enqueues the cluster if it is still there.
		log.Debug("target disappeared during the reconcile")
		return nil
	case errors.Is(err, errNotOwned):
		c.refused.Store(key.String(), rc.GetUID())
		c.metrics.Syncs.WithLabelValues(metrics.ResultRefused).Inc()
		c.reportOnce(rc, corev1.EventTypeWarning, ReasonTargetNotOwned,
			"Secret %s already exists and is not managed by raysync for this RayCluster; leaving it untouched", t.Name)
		log.Warn("target Secret exists and is not ours: leaving it untouched")
		return nil
	case err != nil:
		c.metrics.Syncs.WithLabelValues(metrics.ResultError).Inc()
		return fmt.Errorf("project token into %s/%s: %w", t.Namespace, t.Name, err)
	}
	c.refused.Delete(key.String())
	if wrote {
		reason := ReasonTokenProjected
		if rotated {
			reason = ReasonTokenRotated
		}
		c.written(rc, log, metrics.ResultUpdated, reason, "updated")
		return nil
	}
	c.metrics.Syncs.WithLabelValues(metrics.ResultUnchanged).Inc()
	c.reportStale(rc, current, token)
	return nil
}

var errNotOwned = errors.New("target not owned")

// namespaceTerminating: the namespace is being deleted, with everything in it; retrying is pointless.
func namespaceTerminating(err error) bool {
	return apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)
}

// written accounts for a successful target write.
func (c *Controller) written(rc *unstructured.Unstructured, log *zap.Logger, result, reason, verb string) {
	c.metrics.Syncs.WithLabelValues(result).Inc()
	start := c.caches.FirstSeen(rc.GetUID())
	if s := c.caches.SourceChangedAt(c.opts.Source); s.After(start) {
		start = s
	}
	var took time.Duration
	if !start.IsZero() {
		took = c.now().Sub(start)
		c.metrics.Propagation.Observe(took.Seconds())
	}
	if c.opts.DryRun {
		return
	}
	log.Info("token target "+verb, zap.Duration("propagation", took))
	msg := "auth Secret now holds the canonical token from " + c.opts.Source.String()
	if reason == ReasonTokenRotated {
		msg = "auth Secret updated to the rotated canonical token from " + c.opts.Source.String()
	}
	c.recorder.Event(rc, corev1.EventTypeNormal, reason, msg)
}

// reportStale emits one StaleToken Event per cluster and token when running pods started before
// their target received the token it holds. Nothing is restarted.
func (c *Controller) reportStale(rc *unstructured.Unstructured, target *corev1.Secret, token []byte) {
	stale := stalePods(c.caches.Pods(rc.GetNamespace(), rc.GetName()), syncedAt(target))
	if len(stale) == 0 {
		return
	}
	digest := sha256.Sum256(token)
	if prev, ok := c.staleReported.Load(rc.GetUID()); ok && prev.([32]byte) == digest {
		return
	}
	c.staleReported.Store(rc.GetUID(), digest)
	c.recorder.Eventf(rc, corev1.EventTypeWarning, ReasonStaleToken,
		"%d Ray pod(s) (e.g. %s) started before Secret %s received its current token at %s; they keep the old token until restarted",
		len(stale), stale[0].Name, target.Name, syncedAt(target).UTC().Format(time.RFC3339))
}

type reportedAt struct {
	uid        types.UID
	generation int64
}

// onceReasons are the Warnings reportOnce emits; forget clears them when a cluster goes.
var onceReasons = []string{ReasonInvalidSpec, ReasonSourceKeyMismatch, ReasonTargetNotOwned, ReasonTemplatePatchDeferred}

// reportOnce emits an Event once per cluster generation and reason: what it reports does not change
// between reconciles, and KubeRay's status updates trigger many of those.
func (c *Controller) reportOnce(rc *unstructured.Unstructured, typ, reason, format string, args ...any) {
	k := rc.GetNamespace() + "/" + rc.GetName() + "/" + reason
	now := reportedAt{rc.GetUID(), rc.GetGeneration()}
	if prev, ok := c.reported.Load(k); ok && prev.(reportedAt) == now {
		return
	}
	c.reported.Store(k, now)
	c.recorder.Eventf(rc, typ, reason, format, args...)
}

// pruneNamespace deletes raysync's managed copies that no RayCluster in ns references any more
// (a cluster being deleted still counts, as does one raysync otherwise skips). Copies of sources
// raysync is not configured with (another instance's) are left alone.
func (c *Controller) pruneNamespace(ctx context.Context, ns string) error {
	if !c.opts.Prune {
		return nil
	}
	referenced := map[string]bool{} // kind + "/" + name
	for _, rc := range c.caches.RayClusters(ns) {
		a := kuberay.ReadAuthOptions(rc)
		if a.Err != nil {
			return nil // cannot tell what it references: keep everything
		}
		if a.SecretName != "" {
			referenced[KindAuthToken+"/"+a.SecretName] = true
		}
		for _, n := range templateSecretRefs(rc, "imagePullSecrets") {
			referenced[KindPullSecret+"/"+n] = true
		}
		for _, n := range templateSecretRefs(rc, "volumes") {
			referenced[KindAutoscalerTLS+"/"+n] = true
		}
		// Clusters raysync manages will reference the copies (their templates may not be patched yet).
		if c.podConfigInScope(rc) {
			for _, src := range c.opts.Pods.PullSecrets {
				referenced[KindPullSecret+"/"+src.Name] = true
			}
			if src := c.opts.Pods.AutoscalerTLS; src != nil && Autoscaling(rc) {
				referenced[KindAutoscalerTLS+"/"+src.Name] = true
			}
		}
	}
	for _, s := range c.caches.ManagedSecrets(ns) {
		kind := s.Annotations[KindAnnotation]
		if !c.ownCopy(s) || referenced[kind+"/"+s.Name] {
			continue
		}
		err := c.writer.delete(ctx, s)
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("prune %s/%s: %w", ns, s.Name, err)
		}
		c.log.Info("pruned managed copy no RayCluster references", zap.String("namespace", ns), zap.String("secret", s.Name), zap.String("kind", kind))
	}
	return nil
}

// ownCopy reports whether s is a managed copy of one of this raysync's configured sources.
func (c *Controller) ownCopy(s *corev1.Secret) bool {
	switch s.Annotations[KindAnnotation] {
	case KindAuthToken:
		return isManagedCopyOf(s, c.opts.Source, KindAuthToken)
	case KindPullSecret:
		for _, src := range c.opts.Pods.PullSecrets {
			if isManagedCopyOf(s, src, KindPullSecret) {
				return true
			}
		}
	case KindAutoscalerTLS:
		return c.opts.Pods.AutoscalerTLS != nil && isManagedCopyOf(s, *c.opts.Pods.AutoscalerTLS, KindAutoscalerTLS)
	}
	return false
}

func (c *Controller) podConfigInScope(rc *unstructured.Unstructured) bool {
	return c.opts.Pods.enabled() && rc.GetAnnotations()[SkipAnnotation] != "true" && kuberay.ValidClusterName(rc.GetName())
}

// templateSecretRefs lists Secret names a cluster's templates reference in imagePullSecrets or
// (head) volumes, tolerating malformed fields.
func templateSecretRefs(rc *unstructured.Unstructured, field string) []string {
	var specs []any
	if ps, ok, _ := unstructured.NestedFieldNoCopy(rc.Object, "spec", "headGroupSpec", "template", "spec"); ok {
		specs = append(specs, ps)
	}
	if field == "imagePullSecrets" {
		if ws, ok, _ := unstructured.NestedFieldNoCopy(rc.Object, "spec", "workerGroupSpecs"); ok {
			list, _ := ws.([]any)
			for _, w := range list {
				if wm, ok := w.(map[string]any); ok {
					if ps, ok, _ := unstructured.NestedFieldNoCopy(wm, "template", "spec"); ok {
						specs = append(specs, ps)
					}
				}
			}
		}
	}
	var names []string
	for _, ps := range specs {
		m, _ := ps.(map[string]any)
		list, _ := m[field].([]any)
		for _, e := range list {
			em, _ := e.(map[string]any)
			if field == "volumes" {
				em, _ = em["secret"].(map[string]any)
				if n, ok := em["secretName"].(string); ok {
					names = append(names, n)
				}
				continue
			}
			if n, ok := em["name"].(string); ok {
				names = append(names, n)
			}
		}
	}
	return names
}
