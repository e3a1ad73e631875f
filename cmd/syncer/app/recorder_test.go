package app

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
)

func TestShardedRecorderKeepsEachObjectOnOneShard(t *testing.T) {
	const shards, objects, perObject = 4, 200, 3
	fakes := make([]*record.FakeRecorder, 0, shards)
	stopped := 0
	r, stop := newShardedRecorder(shards, func() (record.EventRecorder, func()) {
		f := record.NewFakeRecorder(objects * perObject)
		fakes = append(fakes, f)
		return f, func() { stopped++ }
	})
	for i := range objects {
		obj := &corev1.Secret{}
		obj.Namespace, obj.Name = fmt.Sprintf("ns-%d", i%7), fmt.Sprintf("c%d", i)
		r.Event(obj, corev1.EventTypeNormal, "A", obj.Namespace+"/"+obj.Name)
		r.Eventf(obj, corev1.EventTypeNormal, "B", "%s/%s", obj.Namespace, obj.Name)
		r.AnnotatedEventf(obj, nil, corev1.EventTypeWarning, "C", "%s/%s", obj.Namespace, obj.Name)
	}
	stop()
	if stopped != shards {
		t.Errorf("stop stopped %d of %d broadcasters", stopped, shards)
	}
	shardOf := map[string]int{}
	used := map[int]bool{}
	total := 0
	for i, f := range fakes {
		close(f.Events)
		for e := range f.Events {
			total++
			var typ, reason, obj string
			if _, err := fmt.Sscan(e, &typ, &reason, &obj); err != nil {
				t.Fatalf("event %q: %v", e, err)
			}
			if prev, ok := shardOf[obj]; ok && prev != i {
				t.Errorf("%s: Events on shards %d and %d; its correlator would be split", obj, prev, i)
			}
			shardOf[obj], used[i] = i, true
		}
	}
	if total != objects*perObject || len(shardOf) != objects {
		t.Errorf("got %d Events for %d objects, want %d for %d", total, len(shardOf), objects*perObject, objects)
	}
	if len(used) != shards {
		t.Errorf("only %d of %d shards used: %v", len(used), shards, used)
	}
}
