package projection

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
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
}

// Controller keeps every in-scope RayCluster's auth Secret equal to the canonical token.
type Controller struct {
	opts     Options
	caches   *informer.Caches
	writer   secretWriter
	recorder record.EventRecorder
	metrics  *metrics.Metrics
	log      *zap.Logger
	queue    workqueue.TypedRateLimitingInterface[informer.Key]
	now      func() time.Time

	refused       sync.Map // cluster key -> types.UID: last reconcile met a foreign target Secret
	staleReported sync.Map // types.UID -> [32]byte: StaleToken already reported for this token
	specReported  sync.Map // types.UID -> int64 generation: InvalidSpec / SourceKeyMismatch reported

	srcMu     sync.Mutex
	srcSeen   bool
	srcDigest [32]byte // in memory only: detects rotations
	srcReason string   // why the source is invalid ("" when valid)
}

// New wires a controller to its caches. Call Run to start workers.
func New(kube kubernetes.Interface, caches *informer.Caches, recorder record.EventRecorder, m *metrics.Metrics, log *zap.Logger, opts Options) (*Controller, error) {
	if opts.SourceKey == "" {
		opts.SourceKey = kuberay.AuthTokenKey
	}
	c := &Controller{
		opts:     opts,
		caches:   caches,
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
		c.syncSource()
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

// syncSource validates the canonical source and accounts for rotations. Targets are reconciled by
// their own keys (the source's event handler enqueues every cluster).
func (c *Controller) syncSource() {
	src, _ := c.caches.Source(c.opts.Source)
	token, err := ValidateToken(src, c.opts.SourceKey)
	log := c.log.With(zap.String("source", c.opts.Source.String()))
	c.srcMu.Lock()
	defer c.srcMu.Unlock()
	if err != nil {
		if reason := err.Error(); reason != c.srcReason {
			c.srcReason = reason
			log.Error("canonical source is invalid: leaving every target untouched", zap.String("reason", reason))
			c.recorder.Eventf(sourceRef(src, c.opts.Source), corev1.EventTypeWarning, ReasonSourceInvalid,
				"raysync cannot use key %q of this Secret: %s; every target keeps its current token", c.opts.SourceKey, reason)
		}
		return
	}
	if c.srcReason != "" {
		log.Info("canonical source is valid again")
		c.srcReason = ""
	}
	digest := sha256.Sum256(token)
	if c.srcSeen && digest != c.srcDigest {
		c.metrics.Rotations.WithLabelValues(c.opts.Source.String()).Inc()
		c.metrics.LastRotation.WithLabelValues(c.opts.Source.String()).Set(float64(c.now().UnixNano()) / 1e9)
		log.Info("canonical token rotated: propagating to every target")
	}
	c.srcSeen, c.srcDigest = true, digest
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

// syncCluster makes one RayCluster's token target hold the canonical token.
func (c *Controller) syncCluster(ctx context.Context, key informer.Key) error {
	rc, ok := c.caches.RayCluster(key.Namespace, key.Name)
	if !ok {
		c.refused.Delete(key.String())
		return nil
	}
	log := c.clusterLog(rc)
	t, ok, err := TokenTargetFor(rc, c.opts.Source)
	if err != nil {
		c.reportOnce(rc, corev1.EventTypeWarning, ReasonInvalidSpec, "raysync cannot read spec.authOptions: %v; leaving this cluster alone", err)
		log.Warn("cannot read spec.authOptions", zap.Error(err))
		return nil
	}
	if !ok || rc.GetDeletionTimestamp() != nil {
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
		case !apierrors.IsAlreadyExists(err):
			c.metrics.Syncs.WithLabelValues(metrics.ResultError).Inc()
			return fmt.Errorf("create token Secret %s/%s: %w", t.Namespace, t.Name, err)
		}
		// Not in our cache: KubeRay was faster (and our watch lags), or a Secret we do not own.
		if current, err = c.writer.get(ctx, t.Namespace, t.Name); err != nil {
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
	case errors.Is(err, errNotOwned):
		c.refused.Store(key.String(), rc.GetUID())
		c.metrics.Syncs.WithLabelValues(metrics.ResultRefused).Inc()
		c.recorder.Eventf(rc, corev1.EventTypeWarning, ReasonTargetNotOwned,
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

// reportOnce emits an Event once per cluster generation (spec problems do not change between resyncs).
func (c *Controller) reportOnce(rc *unstructured.Unstructured, typ, reason, format string, args ...any) {
	if prev, ok := c.specReported.Load(rc.GetUID()); ok && prev.(int64) == rc.GetGeneration() {
		return
	}
	c.specReported.Store(rc.GetUID(), rc.GetGeneration())
	c.recorder.Eventf(rc, typ, reason, format, args...)
}

// pruneNamespace deletes raysync's managed token copies that no RayCluster in ns references any more
// (a cluster being deleted still counts, as does one raysync otherwise skips).
func (c *Controller) pruneNamespace(ctx context.Context, ns string) error {
	referenced := map[string]bool{}
	for _, rc := range c.caches.RayClusters(ns) {
		if a := kuberay.ReadAuthOptions(rc); a.SecretName != "" {
			referenced[a.SecretName] = true
		} else if a.Err != nil {
			return nil // cannot tell what it references: keep everything
		}
	}
	for _, s := range c.caches.ManagedSecrets(ns) {
		if !isManagedCopy(s, c.opts.Source) || referenced[s.Name] {
			continue
		}
		err := c.writer.delete(ctx, s)
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("prune %s/%s: %w", ns, s.Name, err)
		}
		c.log.Info("pruned managed token copy no RayCluster references", zap.String("namespace", ns), zap.String("secret", s.Name))
	}
	return nil
}

// Snapshot computes every in-scope cluster's state from the caches (for the scrape-time collector).
func (c *Controller) Snapshot() metrics.Snapshot {
	src, _ := c.caches.Source(c.opts.Source)
	token, srcErr := ValidateToken(src, c.opts.SourceKey)
	snap := metrics.Snapshot{Sources: []metrics.SourceState{{Source: c.opts.Source.String(), Valid: srcErr == nil}}}
	for _, rc := range c.caches.RayClusters("") {
		t, ok, err := TokenTargetFor(rc, c.opts.Source)
		if err != nil || !ok {
			continue
		}
		var target *corev1.Secret
		switch {
		case t.IsSource:
			target = src
		case t.Mode == Generated:
			target, _ = c.caches.ClusterSecret(t.Namespace, t.Name)
		default:
			target, _ = c.caches.ManagedSecret(t.Namespace, t.Name)
		}
		refusedUID, refused := c.refused.Load(rc.GetNamespace() + "/" + rc.GetName())
		refused = refused && refusedUID.(types.UID) == rc.GetUID()
		st := metrics.TargetState{Namespace: rc.GetNamespace(), RayCluster: rc.GetName(),
			State: tokenState(t, rc, target, token, srcErr, c.opts.Source, refused)}
		if st.State == metrics.StateInSync && !t.IsSource {
			st.StalePods = len(stalePods(c.caches.Pods(rc.GetNamespace(), rc.GetName()), syncedAt(target)))
		}
		snap.Targets = append(snap.Targets, st)
	}
	return snap
}
