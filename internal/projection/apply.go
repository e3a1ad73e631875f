package projection

import (
	"context"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// secretWriter is the only place raysync writes Secrets. With dryRun it logs the intended write
// (names only, never data) and pretends it succeeded.
type secretWriter struct {
	kube   kubernetes.Interface
	dryRun bool
	log    *zap.Logger
}

func (w secretWriter) create(ctx context.Context, s *corev1.Secret) (*corev1.Secret, error) {
	if w.dryRun {
		w.log.Info("dry-run: would create Secret", zap.String("namespace", s.Namespace), zap.String("secret", s.Name))
		return s, nil
	}
	return w.kube.CoreV1().Secrets(s.Namespace).Create(ctx, s, metav1.CreateOptions{FieldManager: fieldManager})
}

// update writes s with its resourceVersion as precondition (optimistic concurrency).
func (w secretWriter) update(ctx context.Context, s *corev1.Secret) (*corev1.Secret, error) {
	if w.dryRun {
		w.log.Info("dry-run: would update Secret", zap.String("namespace", s.Namespace), zap.String("secret", s.Name))
		return s, nil
	}
	return w.kube.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: fieldManager})
}

// delete removes s only if it is still exactly the object raysync decided to delete.
func (w secretWriter) delete(ctx context.Context, s *corev1.Secret) error {
	if w.dryRun {
		w.log.Info("dry-run: would delete Secret", zap.String("namespace", s.Namespace), zap.String("secret", s.Name))
		return nil
	}
	return w.kube.CoreV1().Secrets(s.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &s.UID, ResourceVersion: &s.ResourceVersion},
	})
}

func (w secretWriter) get(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return w.kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

const fieldManager = "raysync"
