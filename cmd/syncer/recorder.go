package main

import (
	"fmt"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// logRecorder replaces the Event recorder under --dry-run: Events are writes too.
type logRecorder struct{ log *zap.Logger }

func (r logRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	m, _ := obj.(metav1.Object)
	var ns, name string
	if m != nil {
		ns, name = m.GetNamespace(), m.GetName()
	}
	r.log.Info("dry-run: would record Event", zap.String("namespace", ns), zap.String("object", name),
		zap.String("type", eventtype), zap.String("reason", reason), zap.String("message", message))
}

func (r logRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.Event(obj, eventtype, reason, fmt.Sprintf(format, args...))
}

func (r logRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, eventtype, reason, format string, args ...any) {
	r.Eventf(obj, eventtype, reason, format, args...)
}

func metav1ObjectMeta(name, namespace string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: namespace}
}
