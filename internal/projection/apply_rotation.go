package projection

// The applier's rotation writes: the wave's patches, and what an observation of a source means.

import (
	"context"
	"errors"
	"strings"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// wave executes the wave's actions in order, stops at the first failure, and returns the units whose
// rotation it started.
func (a *applier) wave(ctx context.Context, w wavePlan) ([]string, error) {
	var started []string
	for _, act := range w.Actions {
		if err := a.do(ctx, informer.Key{Kind: informer.WaveKey}, nil, act, a.log); err != nil {
			if errors.Is(err, errVanished) {
				continue // what it was aimed at is gone: nothing to do for it
			}
			return started, err
		}
		if p, ok := act.(PatchRotation); ok && p.Starts != "" {
			started = append(started, string(p.Kind)+"/"+p.Namespace+"/"+p.Name)
		}
	}
	return started, nil
}

// patchRotation sends a rotation's patch: server-side apply with raysync's field manager on a
// RayService (raysync owns only its own fields there), a merge patch with a resourceVersion on a RayCluster.
func (a *applier) patchRotation(ctx context.Context, p PatchRotation) error {
	log := a.log.With(zap.String("namespace", p.Namespace), zap.String(strings.ToLower(string(p.Kind)), p.Name))
	if a.dryRun {
		log.Info("dry-run: would patch " + string(p.Kind) + " for a token rotation")
		return nil
	}
	var err error
	if p.Kind == names.OwnerRayService {
		force := true
		_, err = a.dyn.Resource(kuberay.RayServiceGVR).Namespace(p.Namespace).Patch(ctx, p.Name, types.ApplyPatchType, p.Patch,
			metav1.PatchOptions{FieldManager: names.FieldManager, Force: &force})
	} else {
		_, err = a.dyn.Resource(kuberay.RayClusterGVR).Namespace(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, p.Patch,
			metav1.PatchOptions{FieldManager: names.FieldManager})
	}
	if err := a.settle("patch "+string(p.Kind)+" "+p.Namespace+"/"+p.Name+" for a token rotation", err); err != nil {
		return err
	}
	switch {
	case p.Abandons != "":
		a.metrics.RotationsAbandoned.WithLabelValues(p.Abandons).Inc()
		log.Warn("token rotation abandoned: the cluster resumed on the token it had", zap.String("reason", p.Abandons))
	case p.Starts != "":
		a.metrics.RotationsStarted.WithLabelValues(p.Starts).Inc()
		log.Info("token rotation started", zap.String("action", p.Starts))
	case p.Completes > 0:
		a.metrics.RotationDuration.Observe(p.Completes.Seconds())
		log.Info("token rotation completed", zap.Duration("took", p.Completes))
	default:
		log.Info("token rotation advanced")
	}
	return nil
}

// recordToken writes a RayCluster's record of the token its containers run on.
func (a *applier) recordToken(ctx context.Context, r RecordToken, log *zap.Logger) error {
	if a.dryRun {
		log.Info("dry-run: would record on the RayCluster which rotation's token its containers run on")
		return nil
	}
	_, err := a.dyn.Resource(kuberay.RayClusterGVR).Namespace(r.Namespace).Patch(ctx, r.Name, types.MergePatchType, r.Patch,
		metav1.PatchOptions{FieldManager: names.FieldManager})
	if err = a.settle("record the token rotation on RayCluster "+r.Namespace+"/"+r.Name, err); err == nil {
		log.Debug("recorded on the RayCluster which rotation's token its containers run on")
	}
	return err
}

// sourceChange reports what one observation of a source meant: a SourceInvalid Warning on the source
// when it became invalid (for a new reason), a rotation in the metrics when its content changed.
func (a *applier) sourceChange(src source, ch sourceChange) {
	log := a.log.With(zap.String("source", src.name.String()))
	switch {
	case ch.nowInvalid != "":
		log.Error("source is invalid: leaving every target untouched", zap.String("reason", ch.nowInvalid))
		obj := src.secret
		if obj == nil { // a missing Secret gets a reference by name
			obj = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: src.name.Namespace, Name: src.name.Name}}
		}
		a.recorder.Eventf(obj, corev1.EventTypeWarning, names.ReasonSourceInvalid,
			"raysync cannot use %s of this Secret: %s; every target keeps what it has", ch.description, ch.nowInvalid)
	case ch.rotated:
		a.metrics.Rotations.WithLabelValues(src.name.String()).Inc()
		a.metrics.LastRotation.WithLabelValues(src.name.String()).Set(float64(a.now().UnixNano()) / 1e9)
		log.Info("source content changed: propagating to every target")
	case ch.validAgain:
		log.Info("source is valid again")
	}
}
