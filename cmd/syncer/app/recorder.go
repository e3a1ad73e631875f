package app

import (
	"fmt"
	"hash/fnv"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
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

// eventShards is how many Event broadcasters raysync runs. One client-go broadcaster writes Events
// one at a time and drops what does not fit its 1,000-Event queue: a rotation of 1,000 clusters
// (a TokenRotated Event each, right after the writes) recorded 209 of them, 5,000 clusters 362
// (make bench). With 8, every Event of a 5,000-cluster rotation was recorded and the rotation still
// ran within 1.2x of a minimal client (1.4x at 1,000); beyond that, client-go logs each dropped Event.
const eventShards = 8

// shardedRecorder spreads Events over several broadcasters by involved object, so all Events of one
// object go through the same correlator (its aggregation and spam filter stay per object).
type shardedRecorder []record.EventRecorder

func newShardedRecorder(n int, newRecorder func() (record.EventRecorder, func())) (shardedRecorder, func()) {
	r := make(shardedRecorder, n)
	stops := make([]func(), n)
	for i := range r {
		r[i], stops[i] = newRecorder()
	}
	return r, func() {
		for _, stop := range stops {
			stop()
		}
	}
}

func (r shardedRecorder) shard(obj runtime.Object) record.EventRecorder {
	h := fnv.New32a()
	if m, err := meta.Accessor(obj); err == nil {
		_, _ = h.Write([]byte(m.GetNamespace() + "/" + m.GetName()))
	}
	return r[h.Sum32()%uint32(len(r))]
}

func (r shardedRecorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.shard(obj).Event(obj, eventtype, reason, message)
}

func (r shardedRecorder) Eventf(obj runtime.Object, eventtype, reason, format string, args ...any) {
	r.shard(obj).Eventf(obj, eventtype, reason, format, args...)
}

func (r shardedRecorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, format string, args ...any) {
	r.shard(obj).AnnotatedEventf(obj, annotations, eventtype, reason, format, args...)
}
