// Package informer decides what raysync watches and how watch events become work-queue keys.
//
// Memory is bounded by what raysync must read, not by the size of the cluster: RayClusters are
// cached as unstructured objects (never round-tripped through Go types that could drop fields), all
// of them in the watched namespaces, whatever --cluster-selector says (raysync may delete a managed
// copy only when no RayCluster references it, selected or not);
// Secrets only through label- or field-selected informers (KubeRay's auth Secrets, raysync's own
// copies, the canonical source by name) in full, and every other Secret in the watched namespaces as
// its name and raysync's marks only (a metadata watch; whether a name is taken, and by whom, is a
// decision every replica must make alike); Pods only if they are Ray nodes. managedFields are stripped.
package informer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/tools/cache"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

const (
	clusterIndex     = "raysync.dev/cluster"      // pods by <namespace>/<ray.io/cluster>
	tokenSecretIndex = "raysync.dev/token-secret" // RayClusters by <namespace>/<the Secret their pods read the token from>
)

// KeyKind says what a work-queue key asks for.
type KeyKind uint8

const (
	// ClusterKey: reconcile one RayCluster's targets.
	ClusterKey KeyKind = iota
	// NamespaceKey: prune raysync-managed copies no RayCluster in the namespace references.
	NamespaceKey
	// SourceKey: validate the canonical source and account for rotations.
	SourceKey
	// WaveKey: decide the fleet's replacements and restarts (one key: one decision at a time).
	WaveKey
)

// Key is one unit of work. Handlers only ever enqueue keys; workers read the caches.
type Key struct {
	Kind      KeyKind
	Namespace string
	Name      string
}

func (k Key) String() string {
	switch k.Kind {
	case NamespaceKey:
		return "namespace:" + k.Namespace
	case SourceKey:
		return "source:" + k.Namespace + "/" + k.Name
	case WaveKey:
		return "wave"
	}
	return k.Namespace + "/" + k.Name
}

// Config is what raysync is told to watch.
type Config struct {
	// Namespaces to watch; empty means all namespaces.
	Namespaces []string
	// Sources are the canonical sources, watched by name (each gets an informer of its own): a change
	// of their content concerns every cluster.
	Sources []types.NamespacedName
	// Ledger is raysync's rotation ledger (none when Name is ""), watched by name: its content concerns
	// every cluster as a source's does, and its marks (the revocation of the previous token, whether it
	// is raysync's) the wave, which publishes the gateway's table.
	Ledger types.NamespacedName
	// Table is the gateway's table raysync publishes (none when Name is ""), watched by name: any
	// change of it (deleted, edited) has the wave decide it again from what it should hold.
	Table types.NamespacedName
	// GatewayAddresses: watch Services too (the gateway's <name>-gw addresses raysync keeps).
	GatewayAddresses bool
	// Control is the operator's control ConfigMap (none when Name is ""), watched by name: its changes
	// (a pause, an adoption) concern the wave.
	Control types.NamespacedName
}

// scope holds the informers of one watched namespace ("" when watching all).
type scope struct {
	clusters       cache.SharedIndexInformer
	services       cache.SharedIndexInformer // RayServices: what a replacement acts on
	jobs           cache.SharedIndexInformer // RayJobs: whether their cluster may be touched
	clusterSecrets cache.SharedIndexInformer // labelled ray.io/cluster (KubeRay's generated Secrets)
	managedSecrets cache.SharedIndexInformer // labelled raysync.dev/managed-by=raysync
	pods           cache.SharedIndexInformer // labelled ray.io/node-type
	secretNames    cache.SharedIndexInformer // every Secret, as its name and raysync's marks (SecretMeta)
	addresses      cache.SharedIndexInformer // Services, with the gateway on (nil otherwise)
}

// Caches are raysync's read path: every worker reads from here, never from the API server.
type Caches struct {
	cfg    Config
	scopes map[string]*scope
	// sources are the Secrets watched by name: the canonical sources, the ledger and the table.
	sources map[types.NamespacedName]cache.SharedIndexInformer
	// sourceNames are the names of the sources (a pod source's copies have its name).
	sourceNames map[string]bool

	// control is the control ConfigMap's informer (nil: none).
	control cache.SharedIndexInformer

	firstSeen       sync.Map // types.UID -> time.Time when raysync first saw the RayCluster
	sourceChangedAt sync.Map // types.NamespacedName -> time.Time of the last observed content change
	synced          atomic.Bool
}

// New builds (does not start) the informers. md lists Secret metadata (nil: the typed client, whose
// full Secrets are reduced to the same metadata before they are cached; for tests).
func New(kube kubernetes.Interface, dyn dynamic.Interface, md metadata.Interface, cfg Config) *Caches {
	c := &Caches{cfg: cfg, scopes: map[string]*scope{}, sources: map[types.NamespacedName]cache.SharedIndexInformer{}, sourceNames: map[string]bool{}}
	for _, src := range cfg.Sources {
		c.sourceNames[src.Name] = true
	}
	namespaces := cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	labelled := func(selector string) func(*metav1.ListOptions) {
		return func(o *metav1.ListOptions) { o.LabelSelector = selector }
	}
	nsIndex := cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}
	for _, ns := range namespaces {
		s := &scope{
			clusters: dynamicinformer.NewFilteredDynamicInformer(dyn, kuberay.RayClusterGVR, ns, 0,
				cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, tokenSecretIndex: clusterTokenSecretIndex}, nil).Informer(),
			services:       dynamicinformer.NewFilteredDynamicInformer(dyn, kuberay.RayServiceGVR, ns, 0, nsIndex, nil).Informer(),
			jobs:           dynamicinformer.NewFilteredDynamicInformer(dyn, kuberay.RayJobGVR, ns, 0, nsIndex, nil).Informer(),
			clusterSecrets: coreinformers.NewFilteredSecretInformer(kube, ns, 0, nsIndex, labelled(kuberay.ClusterLabel)),
			managedSecrets: coreinformers.NewFilteredSecretInformer(kube, ns, 0, nsIndex, labelled(names.ManagedByLabel+"="+names.ManagedByValue)),
			pods: coreinformers.NewFilteredPodInformer(kube, ns, 0, cache.Indexers{clusterIndex: podClusterIndex},
				labelled(kuberay.NodeTypeLabel)),
			secretNames: secretNamesInformer(kube, md, ns),
		}
		if cfg.GatewayAddresses {
			s.addresses = coreinformers.NewFilteredServiceInformer(kube, ns, 0, nsIndex, nil)
			_ = s.addresses.SetTransform(stripManagedFields)
		}
		for _, inf := range []cache.SharedIndexInformer{s.clusters, s.services, s.jobs, s.clusterSecrets, s.managedSecrets, s.pods} {
			_ = inf.SetTransform(stripManagedFields)
		}
		_ = s.secretNames.SetTransform(secretMarks)
		c.scopes[ns] = s
	}
	for _, src := range cfg.byName() {
		inf := coreinformers.NewFilteredSecretInformer(kube, src.Namespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", src.Name).String()
		})
		_ = inf.SetTransform(stripManagedFields)
		c.sources[src] = inf
	}
	if n := cfg.Control; n.Name != "" {
		c.control = coreinformers.NewFilteredConfigMapInformer(kube, n.Namespace, 0, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", n.Name).String()
		})
		_ = c.control.SetTransform(stripManagedFields)
	}
	return c
}

// ControlReadable reports whether the control ConfigMap could be listed (false while its RBAC is missing,
// e.g. a new binary with an earlier release's Roles); true when none is configured.
func (c *Caches) ControlReadable() bool { return c.control == nil || c.control.HasSynced() }

// Control returns the control ConfigMap as cached (nil: none configured, or absent).
func (c *Caches) Control() *corev1.ConfigMap {
	if c.control == nil {
		return nil
	}
	obj, ok, _ := c.control.GetIndexer().GetByKey(c.cfg.Control.String())
	if !ok {
		return nil
	}
	return obj.(*corev1.ConfigMap)
}

// byName lists every Secret watched by name: the sources, the ledger, the table (each once).
func (c Config) byName() []types.NamespacedName {
	out := slices.Clone(c.Sources)
	for _, n := range []types.NamespacedName{c.Ledger, c.Table} {
		if n.Name != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

func (c *Caches) all() []cache.SharedIndexInformer {
	var infs []cache.SharedIndexInformer
	for _, s := range c.scopes {
		infs = append(infs, s.clusters, s.services, s.jobs, s.clusterSecrets, s.managedSecrets, s.pods, s.secretNames)
		if s.addresses != nil {
			infs = append(infs, s.addresses)
		}
	}
	for _, inf := range c.sources {
		infs = append(infs, inf)
	}
	if c.control != nil {
		infs = append(infs, c.control)
	}
	return infs
}

// Start runs every informer until stop is closed.
func (c *Caches) Start(stop <-chan struct{}) {
	for _, inf := range c.all() {
		go inf.Run(stop)
	}
}

// WaitForSync blocks until every informer has listed once (or stop closes) and reports success.
func (c *Caches) WaitForSync(stop <-chan struct{}) bool {
	var syncs []cache.InformerSynced
	for _, inf := range c.all() {
		if inf == c.control {
			continue // optional: ControlReadable says whether it can be read (raysync reads it as paused until then)
		}
		syncs = append(syncs, inf.HasSynced)
	}
	ok := cache.WaitForCacheSync(stop, syncs...)
	c.synced.Store(ok)
	return ok
}

// HasSynced is the readiness signal: true once every cache has synced.
func (c *Caches) HasSynced() bool { return c.synced.Load() }

func (c *Caches) scopeFor(ns string) *scope {
	if s, ok := c.scopes[metav1.NamespaceAll]; ok {
		return s
	}
	return c.scopes[ns]
}

// InScope reports whether raysync watches the namespace.
func (c *Caches) InScope(ns string) bool { return c.scopeFor(ns) != nil }

// RayCluster returns a cached RayCluster; callers must DeepCopy before changing it.
func (c *Caches) RayCluster(ns, name string) (*unstructured.Unstructured, bool) {
	return objectFrom(c.scopeFor(ns), func(s *scope) cache.SharedIndexInformer { return s.clusters }, ns, name)
}

// RayClusters lists cached RayClusters in ns, or in every watched namespace when ns is "".
func (c *Caches) RayClusters(ns string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	add := func(objs []any) {
		for _, o := range objs {
			if u, ok := o.(*unstructured.Unstructured); ok {
				out = append(out, u)
			}
		}
	}
	if ns != "" {
		if s := c.scopeFor(ns); s != nil {
			objs, _ := s.clusters.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
			add(objs)
		}
		return out
	}
	for _, s := range c.scopes {
		add(s.clusters.GetIndexer().List())
	}
	return out
}

// RayService returns a cached RayService.
func (c *Caches) RayService(ns, name string) (*unstructured.Unstructured, bool) {
	return objectFrom(c.scopeFor(ns), func(s *scope) cache.SharedIndexInformer { return s.services }, ns, name)
}

// RayJob returns a cached RayJob.
func (c *Caches) RayJob(ns, name string) (*unstructured.Unstructured, bool) {
	return objectFrom(c.scopeFor(ns), func(s *scope) cache.SharedIndexInformer { return s.jobs }, ns, name)
}

func objectFrom(s *scope, pick func(*scope) cache.SharedIndexInformer, ns, name string) (*unstructured.Unstructured, bool) {
	if s == nil {
		return nil, false
	}
	obj, ok, _ := pick(s).GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil, false
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// ClusterSecret returns a cached Secret labelled ray.io/cluster (KubeRay's shape).
func (c *Caches) ClusterSecret(ns, name string) (*corev1.Secret, bool) {
	return secretFrom(c.scopeFor(ns), func(s *scope) cache.SharedIndexInformer { return s.clusterSecrets }, ns, name)
}

// ManagedSecret returns a cached raysync-managed Secret.
func (c *Caches) ManagedSecret(ns, name string) (*corev1.Secret, bool) {
	return secretFrom(c.scopeFor(ns), func(s *scope) cache.SharedIndexInformer { return s.managedSecrets }, ns, name)
}

// ManagedSecrets lists raysync-managed Secrets in ns.
func (c *Caches) ManagedSecrets(ns string) []*corev1.Secret {
	s := c.scopeFor(ns)
	if s == nil {
		return nil
	}
	objs, _ := s.managedSecrets.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	out := make([]*corev1.Secret, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*corev1.Secret))
	}
	return out
}

// SecretMeta returns a Secret's name and raysync's marks (labels raysync.dev/managed-by and
// ray.io/cluster) for any Secret in a watched namespace: whether a name is taken, and by whom.
func (c *Caches) SecretMeta(ns, name string) (*metav1.PartialObjectMetadata, bool) {
	s := c.scopeFor(ns)
	if s == nil {
		return nil, false
	}
	obj, ok, _ := s.secretNames.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil, false
	}
	m, ok := obj.(*metav1.PartialObjectMetadata)
	return m, ok
}

// ClustersReading lists the cached RayClusters in ns whose pods read their token from the Secret
// named secret (selected or not, being deleted or not): generated mode by KubeRay's name for it,
// referenced mode by spec.authOptions.secretName.
func (c *Caches) ClustersReading(ns, secret string) []*unstructured.Unstructured {
	s := c.scopeFor(ns)
	if s == nil {
		return nil
	}
	objs, _ := s.clusters.GetIndexer().ByIndex(tokenSecretIndex, ns+"/"+secret)
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// Source returns a Secret watched by name (a source, the ledger or the table) as cached.
func (c *Caches) Source(src types.NamespacedName) (*corev1.Secret, bool) {
	inf, ok := c.sources[src]
	if !ok {
		return nil, false
	}
	obj, ok, _ := inf.GetIndexer().GetByKey(src.String())
	if !ok {
		return nil, false
	}
	return obj.(*corev1.Secret), true
}

// Pods lists the cached Ray pods of one cluster.
func (c *Caches) Pods(ns, cluster string) []*corev1.Pod {
	s := c.scopeFor(ns)
	if s == nil {
		return nil
	}
	objs, _ := s.pods.GetIndexer().ByIndex(clusterIndex, ns+"/"+cluster)
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*corev1.Pod))
	}
	return out
}

// FirstSeen is when raysync first saw the RayCluster (zero if never).
func (c *Caches) FirstSeen(uid types.UID) time.Time {
	if v, ok := c.firstSeen.Load(uid); ok {
		return v.(time.Time)
	}
	return time.Time{}
}

// SourceChangedAt is when raysync last saw the source's content change (zero if never).
func (c *Caches) SourceChangedAt(src types.NamespacedName) time.Time {
	if v, ok := c.sourceChangedAt.Load(src); ok {
		return v.(time.Time)
	}
	return time.Time{}
}

// Service returns a Service of ns by name (only with GatewayAddresses).
func (c *Caches) Service(ns, name string) (*corev1.Service, bool) {
	s := c.scopeFor(ns)
	if s == nil || s.addresses == nil {
		return nil, false
	}
	obj, ok, _ := s.addresses.GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil, false
	}
	svc, ok := obj.(*corev1.Service)
	return svc, ok
}

func secretFrom(s *scope, pick func(*scope) cache.SharedIndexInformer, ns, name string) (*corev1.Secret, bool) {
	if s == nil {
		return nil, false
	}
	obj, ok, _ := pick(s).GetIndexer().GetByKey(ns + "/" + name)
	if !ok {
		return nil, false
	}
	sec, ok := obj.(*corev1.Secret)
	return sec, ok
}

func podClusterIndex(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if c := p.Labels[kuberay.ClusterLabel]; c != "" {
		return []string{p.Namespace + "/" + c}, nil
	}
	return nil, nil
}

// clusterTokenSecretIndex indexes a RayCluster by the Secret its pods read RAY_AUTH_TOKEN from.
func clusterTokenSecretIndex(obj any) ([]string, error) {
	rc, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	auth := kuberay.ReadAuthOptions(rc)
	switch {
	case auth.Err != nil || !auth.TokenAuth():
		return nil, nil
	case auth.SecretName != "":
		return []string{rc.GetNamespace() + "/" + auth.SecretName}, nil
	}
	return []string{rc.GetNamespace() + "/" + kuberay.CheckName(rc.GetName())}, nil
}

var secretsGVR = corev1.SchemeGroupVersion.WithResource("secrets")

// secretNamesInformer watches every Secret of ns as metadata (through md), or, without md, as full
// Secrets turned into metadata before anything keeps them.
func secretNamesInformer(kube kubernetes.Interface, md metadata.Interface, ns string) cache.SharedIndexInformer {
	if md != nil {
		return metadatainformer.NewFilteredMetadataInformer(md, secretsGVR, ns, 0, cache.Indexers{}, nil).Informer()
	}
	secrets := kube.CoreV1().Secrets(ns)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := secrets.List(ctx, o)
			if err != nil {
				return nil, err
			}
			out := &metav1.PartialObjectMetadataList{ListMeta: l.ListMeta}
			for i := range l.Items {
				out.Items = append(out.Items, *asMetadata(&l.Items[i]))
			}
			return out, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := secrets.Watch(ctx, o)
			if err != nil {
				return nil, err
			}
			return watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
				if s, ok := e.Object.(*corev1.Secret); ok {
					e.Object = asMetadata(s)
				}
				return e, true
			}), nil
		},
	}
	// The typed client says whether it streams the initial list (a fake one does not).
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, kube), &metav1.PartialObjectMetadata{}, 0, cache.Indexers{})
}

func asMetadata(s *corev1.Secret) *metav1.PartialObjectMetadata {
	return &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: s.ObjectMeta}
}

// secretMarks keeps of a Secret's metadata only what tells whose it is: 20,000 unrelated Secrets
// (with kubectl's last-applied annotation, which holds their data) must not cost their size.
func secretMarks(obj any) (any, error) {
	m, ok := obj.(*metav1.PartialObjectMetadata)
	if !ok {
		return obj, nil
	}
	out := &metav1.PartialObjectMetadata{TypeMeta: m.TypeMeta, ObjectMeta: metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion}}
	for _, k := range []string{names.ManagedByLabel, kuberay.ClusterLabel} {
		if v, ok := m.Labels[k]; ok {
			if out.Labels == nil {
				out.Labels = map[string]string{}
			}
			out.Labels[k] = v
		}
	}
	return out, nil
}

// stripManagedFields drops what raysync never reads before an object enters a cache.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// String describes the watch configuration for logs.
func (c Config) String() string {
	ns := "all namespaces"
	if len(c.Namespaces) > 0 {
		ns = fmt.Sprint(c.Namespaces)
	}
	return fmt.Sprintf("namespaces=%s sources=%v ledger=%s table=%s", ns, c.Sources, c.Ledger, c.Table)
}
