package standin

import (
	"sort"
	"sync"
)

type clusterKey struct{ namespace, name string }

// stats is the stand-in's record of what happened, read through the JSON endpoint.
type stats struct {
	mu       sync.Mutex
	clusters map[clusterKey]*ClusterStats
	starts   map[string][]ContainerStart // by namespace, in start order
	proxy    ProxyStats
}

func newStats() *stats {
	return &stats{clusters: map[clusterKey]*ClusterStats{}, starts: map[string][]ContainerStart{}, proxy: ProxyStats{}}
}

func (s *stats) cluster(k clusterKey) *ClusterStats {
	c, ok := s.clusters[k]
	if !ok {
		c = &ClusterStats{Namespace: k.namespace, Cluster: k.name, Requests: map[Caller]RequestCounts{}}
		s.clusters[k] = c
	}
	return c
}

func (s *stats) request(k clusterKey, caller Caller, v verdict) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.cluster(k)
	r := c.Requests[caller]
	switch v {
	case accepted:
		r.Accepted++
	case unauthenticated:
		r.Unauthenticated++
	case forbidden:
		r.Forbidden++
	}
	c.Requests[caller] = r
}

func (s *stats) joinFailure(k clusterKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cluster(k).JoinFailures++
}

func (s *stats) restart(k clusterKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cluster(k).Restarts++
}

func (s *stats) started(c ContainerStart) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.starts[c.Namespace] = append(s.starts[c.Namespace], c)
}

func (s *stats) proxied(caller Caller, count func(*ProxyCounts)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.proxy[caller]
	count(&p)
	s.proxy[caller] = p
}

func (s *stats) clusterSnapshot(k clusterKey) ClusterStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return copyCluster(s.cluster(k))
}

func (s *stats) allClusters() []ClusterStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ClusterStats, 0, len(s.clusters))
	for _, c := range s.clusters {
		out = append(out, copyCluster(c))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Cluster < out[j].Cluster
	})
	return out
}

func (s *stats) startsIn(namespace string) []ContainerStart {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ContainerStart(nil), s.starts[namespace]...)
}

func (s *stats) proxySnapshot() ProxyStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := ProxyStats{}
	for k, v := range s.proxy {
		out[k] = v
	}
	return out
}

func copyCluster(c *ClusterStats) ClusterStats {
	out := *c
	out.Requests = map[Caller]RequestCounts{}
	for k, v := range c.Requests {
		out.Requests[k] = v
	}
	return out
}
