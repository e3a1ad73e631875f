package projection

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
)

// applier executes planned actions: it holds every API write raysync makes. Each write has a
// precondition (the resourceVersion it was decided on; UID and resourceVersion for deletes), so a
// write decided on stale data fails with a conflict and the key goes back to the queue. With dryRun
// it logs each write (names only, never data) and carries on as if it had succeeded.
type applier struct {
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	recorder record.EventRecorder
	metrics  *metrics.Metrics
	log      *zap.Logger
	memory   *memory
	caches   *informer.Caches // when clusters and sources were first seen changing (propagation times)
	source   types.NamespacedName
	dryRun   bool
	now      func() time.Time
}

// takenError: a create found the name taken by a Secret the caches do not hold (it belongs to
// someone else, or the caches lag). The controller plans again with it.
type takenError struct{ live *corev1.Secret }

func (e *takenError) Error() string {
	return "Secret " + e.live.Namespace + "/" + e.live.Name + " already exists"
}

// errVanished: what a write was aimed at is gone (its cluster or namespace is being deleted). Not an
// error: the delete events bring the key back if there is still something to do.
var errVanished = errors.New("target vanished")

// writeResult is what the outcome of an API write means: one policy for every write raysync makes.
type writeResult string

const (
	writeDone writeResult = "done"
	// writeGone: NotFound, or the namespace is terminating: what the write was aimed at is gone or
	// going. For a delete that is done; any other write stops its plan (errVanished).
	writeGone writeResult = "gone"
	// writeStale: Conflict or AlreadyExists: decided on stale data. The key goes back to the queue,
	// which logs it at debug; not counted as an error.
	writeStale writeResult = "stale"
	// writeFailed: anything else (Forbidden, a timeout, …): an error, counted and retried with back-off.
	writeFailed writeResult = "failed"
)

// classifyWrite says what err, returned by an API write, means.
func classifyWrite(err error) writeResult {
	switch {
	case err == nil:
		return writeDone
	case apierrors.IsNotFound(err) || apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause):
		return writeGone
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
		return writeStale
	}
	return writeFailed
}

// settle applies the write policy to err, the result of the write that what describes ("update
// Secret ns/name"): nil when done, errVanished when gone, else err with that context, counted in
// raysync_sync_total{result=error} when it is not merely stale.
func (a *applier) settle(what string, err error) error {
	switch classifyWrite(err) {
	case writeDone:
		return nil
	case writeGone:
		return errVanished
	case writeFailed:
		a.metrics.Syncs.WithLabelValues(names.ResultError).Inc()
	}
	return fmt.Errorf("%s: %w", what, err)
}

// deleted is a delete's result: one that found its object gone is done.
func deleted(err error) error {
	if errors.Is(err, errVanished) {
		return nil
	}
	return err
}

// stage is an independent part of a cluster's plan: the token (its target, the pods recycled for it
// and the RayCluster's record, which must never run ahead of the Secret it describes), the pods' entries
// (copies of pod sources, the template patch that names them, the stale pods recycled after it), and
// the gateway's address. A failure stops the rest of its stage only: a policy engine refusing an
// ExternalName Service, or a quota on Secrets, must not keep the token's record from being written.
type stage int

const (
	stageToken stage = iota
	stagePods
	stageGateway
	stages
)

// stageOf is the stage of act; an Event belongs to the stage of the action before it (ok false).
func stageOf(in *ClusterInput, act Action) (st stage, ok bool) {
	switch a := act.(type) {
	case CreateSecret:
		return secretStage(in, a.Secret), true
	case UpdateSecret:
		return secretStage(in, a.Secret), true
	case ReplaceSecret, PatchCluster:
		return stagePods, true
	case DeletePod:
		if slices.Contains(a.Missing, names.RecycledAuthToken) {
			return stageToken, true
		}
		return stagePods, true
	case CreateService, UpdateService:
		return stageGateway, true
	case RecordToken:
		return stageToken, true
	}
	return 0, false
}

func secretStage(in *ClusterInput, s *corev1.Secret) stage {
	if s.Name == in.targetName {
		return stageToken
	}
	return stagePods
}

// cluster executes a cluster's plan in order. A failure stops what follows in its stage, is reported
// (a Warning Event on the RayCluster, raysync_sync_total{result="error"}) and returned for a retry;
// the other stages go on. A create that found its name taken stops the plan: the controller plans
// again with what it found.
func (a *applier) cluster(ctx context.Context, key informer.Key, in *ClusterInput, plan ClusterPlan) error {
	log := clusterLog(a.log, in.Cluster)
	if plan.TokenCase != "" {
		log.Debug("token target classified", zap.String("case", plan.TokenCase))
	}
	var errs []error
	var stopped [stages]bool
	cur := stageToken
	for _, act := range plan.Actions {
		if st, ok := stageOf(in, act); ok {
			cur = st
		}
		if stopped[cur] {
			continue
		}
		err := a.do(ctx, key, in.Cluster, act, log)
		var taken *takenError
		switch {
		case err == nil:
		case errors.As(err, &taken):
			return err
		case errors.Is(err, errVanished):
			log.Debug("target disappeared during the reconcile")
			stopped[cur] = true
		default:
			errs = append(errs, err)
			if _, isPod := act.(DeletePod); !isPod { // one pod's failure must not hold back the others
				stopped[cur] = true
			}
			if classifyWrite(err) == writeFailed && a.recorder != nil {
				a.recorder.Event(in.Cluster, corev1.EventTypeWarning, names.ReasonWriteFailed,
					fmt.Sprintf("raysync could not %v; it retries with back-off, and what does not depend on this write went on", err))
			}
		}
	}
	if plan.Unchanged {
		a.metrics.Syncs.WithLabelValues(names.ResultUnchanged).Inc()
	}
	if plan.Refused > 0 {
		a.metrics.Syncs.WithLabelValues(names.ResultRefused).Add(float64(plan.Refused))
	}
	if plan.TemplatesInPlace && !in.Memory.templatesApplied && !stopped[stagePods] {
		a.memory.update(key, in.Cluster.GetUID(), func(m *clusterMemory) { m.templatesApplied = true })
	}
	return errors.Join(errs...)
}

func (a *applier) do(ctx context.Context, key informer.Key, rc *unstructured.Unstructured, act Action, log *zap.Logger) error {
	switch act := act.(type) {
	case CreateSecret:
		err := a.create(ctx, act.Secret, log)
		if err == nil {
			a.wrote(key, rc, act.Secret, act.Propagates)
			return nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return err
		}
		live, gerr := a.kube.CoreV1().Secrets(act.Secret.Namespace).Get(ctx, act.Secret.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(gerr) {
			return errVanished // deleted meanwhile; its delete event brings us back
		} else if gerr != nil {
			return fmt.Errorf("get Secret %s/%s: %w", act.Secret.Namespace, act.Secret.Name, gerr)
		}
		return &takenError{live: live}
	case UpdateSecret:
		if err := a.update(ctx, act, log); err != nil {
			return err
		}
		a.wrote(key, rc, act.Secret, act.Propagates)
	case ReplaceSecret:
		if err := deleted(a.delete(ctx, act.Old, log)); err != nil {
			return err
		}
		if err := a.create(ctx, act.New, log); err != nil {
			return err // AlreadyExists included: someone was faster; plan again from the caches
		}
		a.metrics.Syncs.WithLabelValues(names.ResultUpdated).Inc()
	case DeleteSecret:
		if err := deleted(a.delete(ctx, act.Secret, log)); err != nil {
			return err
		}
	case PatchCluster:
		if err := a.patch(ctx, act, log); err != nil {
			return err
		}
		if act.Reapplied {
			a.metrics.TemplateReapplied.Inc()
		}
		if rc != nil {
			a.memory.update(key, rc.GetUID(), func(m *clusterMemory) { m.templatesApplied = true })
		}
	case DeletePod:
		return a.deletePod(ctx, act, log)
	case PatchRotation:
		return a.patchRotation(ctx, act)
	case RecordToken:
		return a.recordToken(ctx, act, log)
	case CreateService, UpdateService:
		return a.gatewayAddress(ctx, act, log)
	case RecordEvent:
		a.recorder.Event(act.Object, act.Type, act.Reason, act.Message)
		if act.StartedWithout > 0 {
			a.metrics.PodsStartedWithout.WithLabelValues(act.StaleReason).Add(float64(act.StartedWithout))
		}
		if act.DedupKey != "" && rc != nil {
			a.memory.update(key, rc.GetUID(), func(m *clusterMemory) { m.warned[act.DedupKey] = act.DedupValue })
		}
	default:
		// A planner produced an action nobody taught the applier: doing nothing would look like success.
		return fmt.Errorf("unhandled action %T", act)
	}
	return nil
}

// update writes a Secret. A write marked as raced (MarksRace) carries the time it is sent, and, when
// the API server acknowledged it more than writeAckSlack later, the acknowledgement's time in a second
// write: the raced window (recycleRacedPods) is anchored at when kubelets could first see the token.
func (a *applier) update(ctx context.Context, act UpdateSecret, log *zap.Logger) error {
	s := act.Secret
	if act.MarksRace {
		s = s.DeepCopy()
		s.Annotations[names.WrittenUnderPodsAnnotation] = a.now().UTC().Format(time.RFC3339Nano)
	}
	sent := a.now()
	var out *corev1.Secret
	err := a.write(ctx, "update", s, log, func() (err error) {
		out, err = a.kube.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: names.FieldManager})
		return err
	})
	if err != nil || !act.MarksRace || a.dryRun || out == nil {
		return err
	}
	if acked := a.now(); acked.Sub(sent) > writeAckSlack {
		out = out.DeepCopy()
		out.Annotations[names.WrittenUnderPodsAnnotation] = acked.UTC().Format(time.RFC3339Nano)
		log.Info("the API server acknowledged the token write late: its raced-reader mark now carries the acknowledgement's time",
			zap.Duration("after", acked.Sub(sent)))
		return a.write(ctx, "update", out, log, func() error {
			_, err := a.kube.CoreV1().Secrets(out.Namespace).Update(ctx, out, metav1.UpdateOptions{FieldManager: names.FieldManager})
			return err
		})
	}
	return nil
}

func (a *applier) create(ctx context.Context, s *corev1.Secret, log *zap.Logger) error {
	return a.write(ctx, "create", s, log, func() error {
		_, err := a.kube.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: names.FieldManager})
		return err
	})
}

// delete removes s only if it is still exactly the object raysync decided to delete.
func (a *applier) delete(ctx context.Context, s *corev1.Secret, log *zap.Logger) error {
	return a.write(ctx, "delete", s, log, func() error {
		return a.kube.CoreV1().Secrets(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion}})
	})
}

// write runs one Secret write (or logs it under dry-run) and settles its result.
func (a *applier) write(ctx context.Context, verb string, s *corev1.Secret, log *zap.Logger, call func() error) error {
	log = log.With(zap.String("secret", s.Name))
	if a.dryRun {
		log.Info("dry-run: would " + verb + " Secret")
		return nil
	}
	err := a.settle(verb+" Secret "+s.Namespace+"/"+s.Name, call())
	if err == nil {
		log.Info(verb + "d Secret")
	}
	return err
}

// wrote accounts for a successful create or update.
func (a *applier) wrote(key informer.Key, rc *unstructured.Unstructured, s *corev1.Secret, propagates bool) {
	result := names.ResultUpdated
	if s.ResourceVersion == "" {
		result = names.ResultCreated
	}
	a.metrics.Syncs.WithLabelValues(result).Inc()
	if !propagates || rc == nil {
		return
	}
	start := a.caches.FirstSeen(rc.GetUID())
	if changed := a.caches.SourceChangedAt(a.source); changed.After(start) {
		start = changed
	}
	if !start.IsZero() {
		a.metrics.Propagation.Observe(a.now().Sub(start).Seconds())
	}
}

func (a *applier) patch(ctx context.Context, act PatchCluster, log *zap.Logger) error {
	if a.dryRun {
		log.Info("dry-run: would patch RayCluster pod templates")
		return nil
	}
	_, err := a.dyn.Resource(kuberay.RayClusterGVR).Namespace(act.Namespace).Patch(ctx, act.Name, types.MergePatchType, act.Patch,
		metav1.PatchOptions{FieldManager: names.FieldManager})
	if err = a.settle("patch RayCluster "+act.Namespace+"/"+act.Name+" templates", err); err == nil {
		log.Info("pod templates patched with raysync's entries", zap.Bool("reapplied", act.Reapplied))
	}
	return err
}

func (a *applier) deletePod(ctx context.Context, act DeletePod, log *zap.Logger) error {
	p := act.Pod
	log = log.With(zap.String("pod", p.Name), zap.Strings("missing", act.Missing))
	if a.dryRun {
		log.Info("dry-run: would delete the pod so KubeRay recreates it")
		return nil
	}
	err := a.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &p.UID, ResourceVersion: &p.ResourceVersion}})
	if err = a.settle("recycle pod "+p.Namespace+"/"+p.Name, err); err == nil {
		for _, m := range act.Missing {
			a.metrics.PodsRecycled.WithLabelValues(m).Inc()
		}
		log.Info("recycled pod: KubeRay recreates it")
	}
	return deleted(err)
}

// clusterLog carries the fixed keys of a cluster's log lines.
func clusterLog(log *zap.Logger, rc *unstructured.Unstructured) *zap.Logger {
	fields := []zap.Field{zap.String("namespace", rc.GetNamespace()), zap.String("raycluster", rc.GetName())}
	if owner := ownerKind(rc); owner != "" {
		fields = append(fields, zap.String(strings.ToLower(string(owner)), rc.GetLabels()[kuberay.OriginatedFromNameLabel]))
	}
	return log.With(fields...)
}
