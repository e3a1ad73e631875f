package projection

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/metrics"
)

// ClusterStatus is where one in-scope RayCluster stands, computed from the caches. Metrics and
// `syncer status` both read it, so they can never disagree.
type ClusterStatus struct {
	Namespace  string `json:"namespace"`
	RayCluster string `json:"raycluster"`
	// Owner is the RayService or RayJob that generated the cluster ("" for a standalone cluster).
	Owner     string `json:"owner,omitempty"`
	OwnerKind string `json:"ownerKind,omitempty"`
	// Mode is generated or referenced; "" when the cluster does not use token auth.
	Mode  Mode   `json:"mode,omitempty"`
	Token string `json:"token,omitempty"` // a metrics.State*; "" when not a token target
	// PullSecret and AutoscalerTLS are metrics.State* values; "" when not configured or not applicable.
	PullSecret    string         `json:"pullSecret,omitempty"`
	AutoscalerTLS string         `json:"autoscalerTLS,omitempty"`
	StalePods     map[string]int `json:"stalePods"` // by reason: token, pull_secret, autoscaler_tls
	Deferred      bool           `json:"templatePatchDeferred,omitempty"`
}

// InSync reports whether every applicable target is in sync and no pod is stale.
func (s ClusterStatus) InSync() bool {
	for _, st := range []string{s.Token, s.PullSecret, s.AutoscalerTLS} {
		if st != "" && st != metrics.StateInSync {
			return false
		}
	}
	for _, n := range s.StalePods {
		if n > 0 {
			return false
		}
	}
	return !s.Deferred
}

// Status computes the sources' validity and every in-scope cluster's state from the caches.
// lookup, when not nil, fetches a target Secret missing from the caches (a foreign Secret raysync
// does not watch); the running controller passes nil and relies on what its reconciles met.
func (c *Controller) Status(lookup func(ns, name string) *corev1.Secret) ([]metrics.SourceState, []ClusterStatus) {
	var sources []metrics.SourceState
	src, _ := c.caches.Source(c.opts.Source)
	token, srcErr := ValidateToken(src, c.opts.SourceKey)
	sources = append(sources, metrics.SourceState{Source: c.opts.Source.String(), Valid: srcErr == nil})
	pullValid := map[string]bool{}
	for _, p := range c.opts.Pods.PullSecrets {
		s, _ := c.caches.Source(p)
		pullValid[p.Name] = ValidatePullSecret(s) == nil
		sources = append(sources, metrics.SourceState{Source: p.String(), Valid: pullValid[p.Name]})
	}
	var tlsInfo AutoscalerTLS
	var tlsErr error
	if p := c.opts.Pods.AutoscalerTLS; p != nil {
		s, _ := c.caches.Source(*p)
		tlsInfo, tlsErr = ValidateAutoscalerTLS(s, c.now())
		sources = append(sources, metrics.SourceState{Source: p.String(), Valid: tlsErr == nil, NotAfter: tlsInfo.NotAfter})
	}

	var out []ClusterStatus
	for _, rc := range c.caches.RayClusters("") {
		if !kuberay.ValidClusterName(rc.GetName()) || rc.GetAnnotations()[SkipAnnotation] == "true" || rc.GetDeletionTimestamp() != nil {
			continue
		}
		ns, name := rc.GetNamespace(), rc.GetName()
		st := ClusterStatus{Namespace: ns, RayCluster: name, StalePods: map[string]int{},
			Owner: rc.GetLabels()[kuberay.OriginatedFromNameLabel], OwnerKind: rc.GetLabels()[kuberay.OriginatedFromCRDLabel]}
		if t, ok, err := TokenTargetFor(rc, c.opts.Source); err == nil && ok {
			st.Mode = t.Mode
			var target *corev1.Secret
			switch {
			case t.IsSource:
				target = src
			case t.Mode == Generated:
				target, _ = c.caches.ClusterSecret(t.Namespace, t.Name)
			default:
				target, _ = c.caches.ManagedSecret(t.Namespace, t.Name)
			}
			refusedUID, refused := c.refused.Load(ns + "/" + name)
			refused = refused && refusedUID.(types.UID) == rc.GetUID()
			if target == nil && !refused && lookup != nil && !t.IsSource {
				if live := lookup(t.Namespace, t.Name); live != nil {
					target = live
				}
			}
			st.Token = tokenState(t, rc, target, token, srcErr, c.opts.Source, refused)
			st.StalePods[ReasonToken] = 0
			if st.Token == metrics.StateInSync && !t.IsSource {
				st.StalePods[ReasonToken] = len(stalePods(c.caches.Pods(ns, name), syncedAt(target)))
			}
		}
		if c.opts.Pods.enabled() {
			var full TemplateConfig
			var pullStates []string
			for _, p := range c.opts.Pods.PullSecrets {
				full.PullSecrets = append(full.PullSecrets, p.Name)
				pullStates = append(pullStates, c.copyState(rc, p, KindPullSecret, pullValid[p.Name], TemplateConfig{PullSecrets: []string{p.Name}}, lookup))
			}
			if len(pullStates) > 0 {
				st.PullSecret = worst(pullStates)
				st.StalePods[ReasonPullSecret] = 0
			}
			if p := c.opts.Pods.AutoscalerTLS; p != nil && Autoscaling(rc) {
				full.TLS = &TLSTemplate{SecretName: p.Name, MountPath: c.opts.Pods.MountPath, HasCA: tlsInfo.HasCA, APIServer: c.opts.Pods.APIServer}
				st.AutoscalerTLS = c.copyState(rc, *p, KindAutoscalerTLS, tlsErr == nil, TemplateConfig{TLS: full.TLS}, lookup)
				st.StalePods[ReasonAutoscalerTLS] = 0
			}
			for _, pod := range c.caches.Pods(ns, name) {
				if podStarted(pod) && pod.DeletionTimestamp == nil {
					for _, m := range podMissing(pod, full, Autoscaling(rc)) {
						st.StalePods[m]++
					}
				}
			}
			if _, changed, err := desiredTemplates(rc, full); err == nil && changed {
				st.Deferred = c.patchDeferred(rc)
			}
		}
		out = append(out, st)
	}
	return sources, out
}

// Snapshot is Status in the shape of the scrape-time collector.
func (c *Controller) Snapshot() metrics.Snapshot {
	sources, clusters := c.Status(nil)
	snap := metrics.Snapshot{Sources: sources}
	for _, st := range clusters {
		for kind, state := range map[string]string{metrics.KindAuthToken: st.Token, metrics.KindPullSecret: st.PullSecret, metrics.KindAutoscalerTLS: st.AutoscalerTLS} {
			if state != "" {
				snap.Targets = append(snap.Targets, metrics.TargetState{Namespace: st.Namespace, RayCluster: st.RayCluster, Kind: kind, State: state})
			}
		}
		for reason, n := range st.StalePods {
			snap.StalePods = append(snap.StalePods, metrics.StalePods{Namespace: st.Namespace, RayCluster: st.RayCluster, Reason: reason, Count: n})
		}
		if st.Deferred {
			snap.Deferred = append(snap.Deferred, metrics.ClusterRef{Namespace: st.Namespace, RayCluster: st.RayCluster})
		}
	}
	return snap
}

// Display turns a state into the form `syncer status` prints (in-sync, not-owned, …; "-" for none).
func Display(state string) string {
	if state == "" {
		return "-"
	}
	return strings.ReplaceAll(state, "_", "-")
}

// copyState is one pod-level source's state for one cluster: its copy and the templates.
func (c *Controller) copyState(rc *unstructured.Unstructured, src types.NamespacedName, kind string, valid bool, cfg TemplateConfig, lookup func(ns, name string) *corev1.Secret) string {
	if !valid {
		return metrics.StateSourceInvalid
	}
	ns := rc.GetNamespace()
	if ns != src.Namespace {
		if _, refused := c.refusedCopies.Load(ns + "/" + src.Name); refused {
			return metrics.StateNotOwned
		}
		cp, ok := c.caches.ManagedSecret(ns, src.Name)
		if !ok && lookup != nil {
			if live := lookup(ns, src.Name); live != nil && !isManagedCopyOf(live, src, kind) {
				return metrics.StateNotOwned
			}
		}
		source, _ := c.caches.Source(src)
		if !ok || source == nil || !isManagedCopyOf(cp, src, kind) || !sameData(cp.Data, copyData(source, kind)) {
			return metrics.StateOutOfSync
		}
	}
	if _, changed, err := desiredTemplates(rc, cfg); err != nil || changed {
		return metrics.StateOutOfSync
	}
	return metrics.StateInSync
}

// worst orders states by how much attention they need.
func worst(states []string) string {
	rank := map[string]int{metrics.StateInSync: 0, metrics.StateOutOfSync: 1, metrics.StateNotOwned: 2, metrics.StateSourceInvalid: 3}
	w := metrics.StateInSync
	for _, s := range states {
		if rank[s] > rank[w] {
			w = s
		}
	}
	return w
}
