package projection

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
)

// Controller runs the work queue: event handlers enqueue keys, workers turn each key into
// gather → plan → apply. Conflicts and stale caches go back to the queue, whose back-off is the only
// retry loop.
type Controller struct {
	cfg      Config
	caches   *informer.Caches
	gather   *gatherer
	apply    *applier
	memory   *memory
	reporter *Reporter
	queue    workqueue.TypedRateLimitingInterface[informer.Key]
	metrics  *metrics.Metrics
	recorder record.EventRecorder
	log      *zap.Logger
	now      func() time.Time
	// sourcesSeen remembers each source's last content, to count rotations.
	sourcesSeen *sourceTracker
	// expected are the replacements and restarts this process started that the caches may not show
	// yet: they count as in flight, so a lagging cache never lets the wave exceed its bound.
	expected *expectations
	// reported is the last problem reported about each of raysync's own Secrets (reportOwnSecret).
	reported *reported
}

// waveDelay gathers the events of a busy moment into one wave decision.
const waveDelay = 200 * time.Millisecond

// New wires a controller to its caches. Call Run to start workers. With dryRun it writes nothing.
func New(kube kubernetes.Interface, dyn dynamic.Interface, caches *informer.Caches, recorder record.EventRecorder,
	m *metrics.Metrics, log *zap.Logger, cfg Config, dryRun bool) (*Controller, error) {
	cfg = cfg.withDefaults()
	mem := newMemory()
	c := &Controller{
		cfg: cfg, caches: caches, memory: mem, metrics: m, recorder: recorder, log: log, now: time.Now,
		gather:      &gatherer{caches: caches, cfg: cfg, memory: mem},
		sourcesSeen: &sourceTracker{seen: map[types.NamespacedName]sourceMemory{}},
		expected:    &expectations{started: map[string]time.Time{}},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[informer.Key](5*time.Millisecond, 2*time.Minute),
				// Bounds retries overall; first attempts (plain Add) are never throttled.
				&workqueue.TypedBucketRateLimiter[informer.Key]{Limiter: rate.NewLimiter(rate.Limit(50), 500)},
			),
			workqueue.TypedRateLimitingQueueConfig[informer.Key]{Name: "raysync"}),
	}
	c.apply = &applier{kube: kube, dyn: dyn, recorder: recorder, metrics: m, log: log, memory: mem, caches: caches,
		source: cfg.Source, dryRun: dryRun, now: func() time.Time { return c.now() }}
	c.reported = &reported{last: map[string]string{}}
	c.reporter = &Reporter{gather: c.gather, now: func() time.Time { return c.now() }}
	for _, s := range cfg.Sources() {
		m.SourcesConfigured(s.String())
	}
	if err := caches.AddEventHandlers(c.enqueue); err != nil {
		return nil, err
	}
	return c, nil
}

// enqueue adds a key; the wave key after a short delay, so that one decision covers a burst of events.
func (c *Controller) enqueue(k informer.Key) {
	if k.Kind == informer.WaveKey {
		c.queue.AddAfter(k, waveDelay)
		return
	}
	c.queue.Add(k)
}

// Snapshot is the scrape-time state for the metrics collector (on standbys too).
func (c *Controller) Snapshot() metrics.Snapshot { return c.reporter.Snapshot() }

// Run processes keys with the given number of workers until ctx ends. The caches must be started.
func (c *Controller) Run(ctx context.Context, workers int) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	if !c.caches.WaitForSync(ctx.Done()) {
		return errors.New("caches did not sync")
	}
	// A Secret created before now arrived unseen: raysync cannot tell it was not read (mayHaveBeenRead).
	c.gather.watchingSince.Store(c.now().UnixNano())
	// One fleet pass at start whatever the events: a new leader publishes the gateway's table even
	// with no cluster in scope.
	c.enqueue(informer.Key{Kind: informer.WaveKey})
	c.log.Info("starting workers", zap.Int("workers", workers))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for c.processNext(ctx) {
				}
			}, time.Second)
		})
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
		err = c.syncNamespace(ctx, key.Namespace)
	case informer.SourceKey:
		err = c.syncSource(ctx, types.NamespacedName{Namespace: key.Namespace, Name: key.Name})
	case informer.WaveKey:
		err = c.syncWave(ctx)
	}
	if err == nil {
		c.queue.Forget(key)
		return true
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		c.log.Debug("decided on stale data, requeued", zap.String("key", key.String()))
	} else {
		c.log.Error("reconcile failed, retrying with backoff", zap.String("key", key.String()),
			zap.Int("retries", c.queue.NumRequeues(key)), zap.Error(err))
	}
	c.queue.AddRateLimited(key)
	return true
}

// syncCluster reconciles one RayCluster: gather, plan, apply. When a create meets a Secret the
// caches do not hold, it plans once more with that Secret as read from the API.
func (c *Controller) syncCluster(ctx context.Context, key informer.Key) error {
	rc, ok := c.caches.RayCluster(key.Namespace, key.Name)
	if !ok || !c.cfg.managed(rc) {
		c.memory.forget(key)
		return nil
	}
	now := c.now()
	in := c.gather.cluster(rc, c.gather.sources(now), now)
	for attempt := 0; ; attempt++ {
		plan := planCluster(in, c.cfg)
		err := c.apply.cluster(ctx, key, in, plan)
		var taken *takenError
		if errors.As(err, &taken) && attempt == 0 {
			in.see(taken.live)
			in.Memory = c.memory.of(key, rc.GetUID())
			continue
		}
		if err == nil && plan.RequeueAfter > 0 {
			c.queue.AddAfter(key, plan.RequeueAfter)
		}
		return err
	}
}

// syncNamespace prunes the managed copies no RayCluster in the namespace references.
func (c *Controller) syncNamespace(ctx context.Context, ns string) error {
	if !c.cfg.Prune {
		return nil
	}
	var errs []error
	for _, act := range planPrune(c.caches.RayClusters(ns), c.caches.ManagedSecrets(ns), c.cfg) {
		del := act.(DeleteSecret)
		err := c.apply.do(ctx, informer.Key{Kind: informer.NamespaceKey, Namespace: ns}, nil, act, c.log.With(zap.String("namespace", ns)))
		if err != nil && !errors.Is(err, errVanished) {
			errs = append(errs, err)
			continue
		}
		c.log.Info("pruned managed copy no RayCluster references", zap.String("namespace", ns), zap.String("secret", del.Secret.Name))
	}
	return errors.Join(errs...)
}

// syncSource validates one source and accounts for rotations of its content: the token source's
// new content gets the next number in the rotation ledger. Targets are reconciled by their own keys
// (the source's event handler enqueues every cluster and the wave).
func (c *Controller) syncSource(ctx context.Context, name types.NamespacedName) error {
	now := c.now()
	sources := c.gather.sources(now)
	for _, src := range sources.all() {
		if src.name == name {
			c.apply.sourceChange(src, c.sourcesSeen.observe(src, c.cfg.SourceKey))
		}
	}
	if name != c.cfg.Source && name != c.cfg.Ledger {
		return nil
	}
	p := planLedger(c.cfg, sources, now, false)
	if p.Verify {
		live, err := c.apply.kube.CoreV1().Secrets(c.cfg.Source.Namespace).Get(ctx, c.cfg.Source.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			live = nil
		case err != nil:
			return fmt.Errorf("read the canonical source %s live before numbering a token the ledger held: %w", c.cfg.Source, err)
		}
		sources = readSources(c.cfg, func(n types.NamespacedName) *corev1.Secret {
			if n == c.cfg.Source {
				return live
			}
			s, _ := c.caches.Source(n)
			return s
		}, now)
		p = planLedger(c.cfg, sources, now, true)
	}
	if c.reported.changed("ledger", p.Problem) {
		c.reportOwnSecret(ctx, c.cfg.Ledger, p.Problem, p.Warning)
	}
	if p.Write == nil {
		return nil
	}
	c.log.Info("new canonical token: rotation recorded in the ledger", zap.Int("rotation", p.Rotation),
		zap.String("ledger", c.cfg.Ledger.String()))
	return c.apply.do(ctx, informer.Key{Kind: informer.SourceKey, Namespace: name.Namespace, Name: name.Name}, nil, p.Write, c.log)
}

// reportOwnSecret says, once per problem, why raysync leaves one of its own Secrets (the ledger, the
// gateway's table) as it is: a log line, raysync_sync_total{result="refused"}, and a Warning Event on
// the Secret; or, problem "", that it is usable again.
func (c *Controller) reportOwnSecret(ctx context.Context, name types.NamespacedName, problem string, warning *RecordEvent) {
	log := c.log.With(zap.String("secret", name.String()))
	if problem == "" {
		log.Info("raysync's own Secret is usable again")
		return
	}
	log.Warn("leaving raysync's own Secret as it is", zap.String("reason", problem))
	c.metrics.Syncs.WithLabelValues(names.ResultRefused).Inc()
	if warning != nil && warning.Object != nil {
		_ = c.apply.do(ctx, informer.Key{Kind: informer.WaveKey}, nil, *warning, log)
	}
}

// syncWave decides and performs the fleet's replacements and restarts (one at a time: one key).
func (c *Controller) syncWave(ctx context.Context) error {
	now := c.now()
	views := c.gather.views(now)
	w := planWave(append(views, c.gather.released(now)...), c.cfg, now, c.expected.pending(now))
	c.expected.observed(w.Observed)
	c.reportControl(ctx, w)
	started, err := c.apply.wave(ctx, w)
	c.expected.add(started, now)
	if w.RequeueAfter > 0 {
		c.queue.AddAfter(informer.Key{Kind: informer.WaveKey}, w.RequeueAfter)
	}
	if c.cfg.Gateway.enabled() {
		err = errors.Join(err, c.syncGatewayTable(ctx, views, now))
	}
	return err
}

// reportControl says, once per change, what the control ConfigMap does to the wave: paused (and how
// many units it holds back) or resumed, and a value raysync cannot read (a log line and a Warning
// Event on the ConfigMap).
func (c *Controller) reportControl(ctx context.Context, w wavePlan) {
	if c.reported.changed("paused", fmt.Sprint(w.Paused)) {
		if w.Paused {
			c.log.Warn("the control ConfigMap pauses the wave: no replacement or restart starts; those in flight finish",
				zap.String("control", c.cfg.Control.String()), zap.Int("held", w.Held))
		} else if c.cfg.Control.Name != "" {
			c.log.Info("the wave is not paused", zap.String("control", c.cfg.Control.String()))
		}
	}
	cm := c.caches.Control()
	ctl := readControl(cm)
	if !c.caches.ControlReadable() {
		ctl = unreadableControl(c.cfg.Control.String())
		c.queue.AddAfter(informer.Key{Kind: informer.WaveKey}, 30*time.Second) // look again once it may be readable
	}
	problems := strings.Join(ctl.problems, "; ")
	if !c.reported.changed("control", problems) || problems == "" {
		return
	}
	c.log.Warn("the control ConfigMap has values raysync cannot read: it applies the safe reading", zap.String("control", c.cfg.Control.String()),
		zap.String("problems", problems))
	if cm != nil { // an Event needs the object (one raysync cannot read has no Event, only the log)
		_ = c.apply.do(ctx, informer.Key{Kind: informer.WaveKey}, nil, RecordEvent{Object: cm, Type: corev1.EventTypeWarning,
			Reason: names.ReasonControlInvalid, Message: problems}, c.log)
	}
}

// syncGatewayTable plans the gateway's table and makes the published Secret hold it, decided from the
// Secret as cached (the caches watch it: a table deleted or edited is put back).
func (c *Controller) syncGatewayTable(ctx context.Context, views []clusterView, now time.Time) error {
	t := planGatewayTable(views, c.gather.sources(now), c.cfg, now)
	if t == nil {
		return nil // the source or the ledger cannot be used: the published table stays as it is
	}
	// The previous token's grace ends at a time, not on an event.
	if prev := tableExpiry(t, now); prev > 0 {
		c.queue.AddAfter(informer.Key{Kind: informer.WaveKey}, prev)
	}
	b, err := t.Encode()
	if err != nil {
		return err
	}
	if len(b) > maxTableBytes {
		c.metrics.Syncs.WithLabelValues(names.ResultError).Inc()
		return fmt.Errorf("gateway table of %d routes is %d bytes: over what a Secret holds (1 MiB); the published table stays as it is", len(t.Routes), len(b))
	}
	cur, _ := c.caches.Source(c.cfg.Gateway.Table)
	p := planGatewayTableSecret(c.cfg, cur, b)
	if c.reported.changed("table", p.Problem) {
		c.reportOwnSecret(ctx, c.cfg.Gateway.Table, p.Problem, p.Warning)
	}
	if p.Write == nil {
		return nil
	}
	return c.apply.publishTable(ctx, p.Write, len(t.Routes), len(t.Accept))
}

// reported remembers the last problem reported about each of raysync's own Secrets, so that each is
// reported once (in memory: a restart reports it again; it changes no write).
type reported struct {
	mu   sync.Mutex
	last map[string]string
}

// changed records problem as the last about key and says whether it differs from the one before.
func (r *reported) changed(key, problem string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last[key] == problem {
		return false
	}
	r.last[key] = problem
	return true
}

// expectations are rotations started by this process, until the caches show them.
type expectations struct {
	mu      sync.Mutex
	started map[string]time.Time
}

// expectTTL: a start the caches have not shown by then is given up on (the caches then decide).
const expectTTL = time.Minute

func (e *expectations) pending(now time.Time) map[string]bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]bool{}
	for k, t := range e.started {
		if now.Sub(t) > expectTTL {
			delete(e.started, k)
			continue
		}
		out[k] = true
	}
	return out
}

func (e *expectations) add(keys []string, now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		e.started[k] = now
	}
}

func (e *expectations) observed(keys []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range keys {
		delete(e.started, k)
	}
}
