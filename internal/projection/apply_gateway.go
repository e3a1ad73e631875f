package projection

// The applier's gateway writes: the addresses (<name>-gw Services) and the published table.

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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

// publishTable creates or updates the gateway's table Secret (planGatewayTableSecret decided it from
// the Secret as cached; an update carries its resourceVersion). Not counted in raysync_sync_total,
// which counts the clusters' targets.
func (a *applier) publishTable(ctx context.Context, act Action, routes, accepted int) error {
	log := a.log.With(zap.Int("routes", routes), zap.Int("accepted", accepted))
	var s *corev1.Secret
	var call func() error
	verb := "create"
	switch act := act.(type) {
	case CreateSecret:
		s = act.Secret
		call = func() error {
			_, err := a.kube.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: names.FieldManager})
			return err
		}
	case UpdateSecret:
		s, verb = act.Secret, "update"
		call = func() error {
			_, err := a.kube.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: names.FieldManager})
			return err
		}
	default:
		return fmt.Errorf("unhandled gateway table action %T", act)
	}
	if err := a.write(ctx, verb, s, log, call); err != nil {
		if errors.Is(err, errVanished) {
			return nil // its namespace is going; the delete event brings the wave back
		}
		return fmt.Errorf("publish the gateway table: %w", err)
	}
	return nil
}
