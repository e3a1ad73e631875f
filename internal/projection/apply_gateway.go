package projection

// The applier's gateway writes: the addresses (<name>-gw Services) and the published table.

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/names"
)

// gatewayAddress creates or updates one <name>-gw Service.
func (a *applier) gatewayAddress(ctx context.Context, act Action, log *zap.Logger) error {
	var svc *corev1.Service
	var err error
	verb := "create"
	if a.dryRun {
		log.Info("dry-run: would keep the gateway address")
		return nil
	}
	switch act := act.(type) {
	case CreateService:
		svc = act.Service
		_, err = a.kube.CoreV1().Services(svc.Namespace).Create(ctx, svc, metav1.CreateOptions{FieldManager: names.FieldManager})
	case UpdateService:
		svc, verb = act.Service, "update"
		_, err = a.kube.CoreV1().Services(svc.Namespace).Update(ctx, svc, metav1.UpdateOptions{FieldManager: names.FieldManager})
	}
	if err = a.settle(verb+" Service "+svc.Namespace+"/"+svc.Name, err); err == nil {
		log.Info(verb+"d the gateway address", zap.String("service", svc.Name))
	}
	return err
}

// tablePublisher writes the gateway's table when its content changed. The last content written is
// kept in memory only to spare an API call when nothing changed: after a restart (or on a new leader)
// the first pass reads the Secret and writes only if it differs.
type tablePublisher struct {
	a    *applier
	mu   sync.Mutex
	last []byte
}

func (p *tablePublisher) publish(ctx context.Context, cfg Config, t *gateway.Table) error {
	a := p.a
	b, err := t.Encode()
	if err != nil {
		return err
	}
	if len(b) > 900<<10 {
		a.metrics.Syncs.WithLabelValues(names.ResultError).Inc()
		return fmt.Errorf("gateway table of %d routes is %d bytes: over what a Secret holds (1 MiB); the published table stays as it is", len(t.Routes), len(b))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if bytes.Equal(p.last, b) {
		return nil
	}
	if a.dryRun {
		a.log.Info("dry-run: would publish the gateway table", zap.Int("routes", len(t.Routes)))
		p.last = b
		return nil
	}
	n := cfg.Gateway.Table
	cur, err := a.kube.CoreV1().Secrets(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = a.kube.CoreV1().Secrets(n.Namespace).Create(ctx, desiredGatewayTableSecret(cfg, nil, b), metav1.CreateOptions{FieldManager: names.FieldManager})
	case err != nil:
	case cur.Labels[names.ManagedByLabel] != names.ManagedByValue || cur.Annotations[names.KindAnnotation] != names.KindGatewayTable:
		return fmt.Errorf("Secret %s exists and is not raysync's gateway table: leaving it untouched (the gateway keeps its last table)", n)
	case bytes.Equal(cur.Data[gateway.TableKey], b):
	default:
		_, err = a.kube.CoreV1().Secrets(n.Namespace).Update(ctx, desiredGatewayTableSecret(cfg, cur, b), metav1.UpdateOptions{FieldManager: names.FieldManager})
	}
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			a.metrics.Syncs.WithLabelValues(names.ResultError).Inc()
		}
		return fmt.Errorf("publish the gateway table %s: %w", n, err)
	}
	p.last = b
	a.log.Debug("gateway table published", zap.Int("routes", len(t.Routes)), zap.Int("accepted", len(t.Accept)))
	return nil
}
