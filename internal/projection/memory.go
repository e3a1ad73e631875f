package projection

import (
	"maps"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
)

// clusterMemory is what raysync remembers about one RayCluster between reconciles, in process memory:
// nothing here changes what raysync writes (another replica, or raysync after a restart, has none of
// it and plans the same writes: TestMemoryChangesNoWrite), only whether it repeats an Event and how it
// counts. It is forgotten when the cluster leaves the cache or the scope.
type clusterMemory struct {
	uid types.UID
	// warned maps an Event's dedup key to the value it was last recorded with.
	warned map[string]string
	// templatesApplied: raysync's template entries were in place once (a later patch re-applies them).
	templatesApplied bool
}

// memory holds every cluster's clusterMemory, by cluster key.
type memory struct {
	mu       sync.Mutex
	clusters map[informer.Key]*clusterMemory
}

func newMemory() *memory { return &memory{clusters: map[informer.Key]*clusterMemory{}} }

// of returns a copy of what is remembered about the cluster with this key and UID (a cluster
// recreated under the same name starts afresh).
func (m *memory) of(key informer.Key, uid types.UID) clusterMemory {
	m.mu.Lock()
	defer m.mu.Unlock()
	cm := m.clusters[key]
	if cm == nil || cm.uid != uid {
		return clusterMemory{uid: uid}
	}
	return *cm // the maps are never changed in place (see update): sharing them is safe
}

// update changes what is remembered about a cluster. f gets fresh copies of the maps, so copies
// handed out by of never change under their reader.
func (m *memory) update(key informer.Key, uid types.UID, f func(*clusterMemory)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cm := m.clusters[key]
	if cm == nil || cm.uid != uid {
		cm = &clusterMemory{uid: uid}
	}
	next := &clusterMemory{uid: uid, templatesApplied: cm.templatesApplied, warned: maps.Clone(cm.warned)}
	if next.warned == nil {
		next.warned = map[string]string{}
	}
	f(next)
	m.clusters[key] = next
}

// forget drops everything about a cluster that is gone or out of scope.
func (m *memory) forget(key informer.Key) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.clusters, key)
}

// size is the number of clusters remembered.
func (m *memory) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.clusters)
}
