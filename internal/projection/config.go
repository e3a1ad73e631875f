package projection

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
	"github.com/raysync/raysync/internal/validate"
)

// Config is what raysync is told to do (the command line, validated).
type Config struct {
	// Source is the canonical token Secret; SourceKey the data key holding the token.
	Source    types.NamespacedName
	SourceKey string
	// ClusterSelector limits the RayClusters raysync manages (nil: all in the watched namespaces).
	ClusterSelector labels.Selector
	// Prune deletes managed copies no RayCluster in their namespace references any more.
	Prune bool
	// Pods configures pull secrets and the autoscaler's client TLS (off when empty).
	Pods PodOptions
	// Rotation says how running clusters move to a new token.
	Rotation RotationOptions
	// Ledger is the Secret numbering the canonical tokens (rotations) raysync has seen, in raysync's
	// own namespace. Empty: rotations are not numbered, and nothing is replaced or restarted.
	Ledger types.NamespacedName
	// NoPrecreate leaves a new cluster's generated auth Secret to KubeRay (and the admission
	// webhook) instead of creating it first; raysync still writes the token into it.
	NoPrecreate bool
	// Gateway is what raysync keeps for the gateway (off when Table is empty).
	Gateway GatewayOptions
	// Control is the ConfigMap an operator pauses the wave and adopts namespaces with (names.Control*
	// keys), in raysync's own namespace; raysync reads it and never writes it. Empty: none (nothing
	// paused, no namespace adopted as a whole).
	Control types.NamespacedName
}

// GatewayOptions: the table raysync publishes for the gateway, and the addresses it keeps.
type GatewayOptions struct {
	// Table is the Secret the gateway reads (in raysync's namespace).
	Table types.NamespacedName
	// Service is the gateway Service's DNS name; each RayService and RayCluster gets an ExternalName
	// Service <name>-gw pointing at it ("": none).
	Service string
	// Grace is how long the previous canonical token is accepted after a rotation.
	Grace time.Duration
	// PendingKey is a key of the canonical Secret holding the next token, accepted before it is current.
	PendingKey string
}

func (o GatewayOptions) enabled() bool { return o.Table.Name != "" }

// PodOptions configure registry pull secrets and the autoscaler's client TLS. Zero value: both off.
type PodOptions struct {
	PullSecrets    []types.NamespacedName
	AutoscalerTLS  *types.NamespacedName
	APIServer      *validate.APIServer
	MountPath      string
	RecyclePending bool
	AllowRecreate  bool
}

func (o PodOptions) enabled() bool { return len(o.PullSecrets) > 0 || o.AutoscalerTLS != nil }

// RecycleGrace is the minimum age of a pod raysync recycles. KubeRay (v1.1+) expects every pod it
// creates (its scale expectations) and creates no pod of that group until a reconcile finds it in its
// cache, or 30 s passed (ExpectationsTimeout). A pod deleted before such a reconcile (KubeRay's queue
// or cache a few seconds behind is enough) leaves its group without a pod for 30 s, and then until the
// next event on the cluster: up to RAYCLUSTER_DEFAULT_REQUEUE_SECONDS (300 s) for a head whose workers
// wait for it (TestFleetRotation on v1.5.1 under CI load, with a grace of 5 s). Past 30 s the deletion
// itself makes KubeRay recreate it. 5 s on top for the delay between the pod's creation and KubeRay
// recording it, clock skew, and one-second timestamps.
const RecycleGrace = 35 * time.Second

// withDefaults fills what the zero value leaves out.
func (c Config) withDefaults() Config {
	if c.SourceKey == "" {
		c.SourceKey = kuberay.AuthTokenKey
	}
	if c.Pods.MountPath == "" {
		c.Pods.MountPath = podtemplate.DefaultTLSMountPath
	}
	if c.ClusterSelector == nil {
		c.ClusterSelector = labels.Everything()
	}
	if c.Rotation.Policies == nil {
		c.Rotation.Policies = DefaultPolicies
	}
	if c.Rotation.MaxConcurrent == 0 {
		c.Rotation.MaxConcurrent = DefaultMaxConcurrentRotations
	}
	return c
}

// Sources lists every configured source Secret: the token source, then pull secrets, then the certificate.
func (c Config) Sources() []types.NamespacedName {
	out := append([]types.NamespacedName{c.Source}, c.Pods.PullSecrets...)
	if c.Pods.AutoscalerTLS != nil {
		out = append(out, *c.Pods.AutoscalerTLS)
	}
	return out
}

// Watched lists every single Secret the decisions read by name: the sources, then the ledger.
func (c Config) Watched() []types.NamespacedName {
	if c.Ledger.Name == "" {
		return c.Sources()
	}
	return append(c.Sources(), c.Ledger)
}

// Watches is what raysync watches for this configuration in the given namespaces (none: all): the
// sources by name, its own ledger and gateway table by name, and the gateway addresses' Services.
func (c Config) Watches(namespaces []string) informer.Config {
	return informer.Config{Namespaces: namespaces, Sources: c.Sources(), Ledger: c.Ledger, Table: c.Gateway.Table,
		GatewayAddresses: c.Gateway.Service != "", Control: c.Control}
}

// InScope is the one predicate for "raysync manages this RayCluster": it matches the selector, is not
// annotated raysync.dev/skip=true, and has a name KubeRay accepts (KubeRay ignores the others). A
// cluster being deleted is in scope (it still references its Secrets) but is never written for.
func (c Config) InScope(rc *unstructured.Unstructured) bool {
	return metaString(rc, "annotations", names.SkipAnnotation) != "true" && kuberay.ValidClusterName(rc.GetName()) &&
		c.ClusterSelector.Matches(objectLabels{rc})
}

// invalidSkip says, when rc's raysync.dev/skip is neither "true" nor "false" (nor absent), how raysync
// reads it: as false, what it read before it said so. Reading "yes" as skip would instead stop, on a
// cluster raysync already manages, what it does for the cluster's next pods (the webhook's pull
// secrets and TLS) with nothing but a typo to say why; a value only "true" changes is one the
// operator fixes once it is reported.
func invalidSkip(rc *unstructured.Unstructured) string {
	switch v := metaString(rc, "annotations", names.SkipAnnotation); v {
	case "", "true", "false":
		return ""
	default:
		return fmt.Sprintf("%s %q is not \"true\" or \"false\": read as false, as before (raysync manages the cluster); set \"true\" to leave it alone", names.SkipAnnotation, v)
	}
}

// rotateRequested: rc carries a rotation request (raysync.dev/rotate, as `syncer rotate` writes it:
// any value but "false", which asks for nothing and is reported by invalidRotate).
func rotateRequested(rc *unstructured.Unstructured) bool {
	v := metaString(rc, "annotations", names.RotateAnnotation)
	return v != "" && v != "false"
}

// invalidRotate says, when rc's raysync.dev/rotate is "false", how raysync reads it: as no request.
// The annotation is a request that raysync removes once served; "false" reads like a setting that
// turns rotation off, which it is not (that is raysync.dev/rotation=hold).
func invalidRotate(rc *unstructured.Unstructured) string {
	if metaString(rc, "annotations", names.RotateAnnotation) != "false" {
		return ""
	}
	return fmt.Sprintf("%s \"false\" requests nothing: read as no request (remove it; to keep the cluster's token, set %s=%s)",
		names.RotateAnnotation, names.RotationAnnotation, names.PolicyHold)
}

// objectLabels reads rc's labels in place (GetLabels copies them: once per cluster per scrape adds up).
type objectLabels struct{ rc *unstructured.Unstructured }

func (o objectLabels) Lookup(key string) (string, bool) {
	m, _, _ := unstructured.NestedFieldNoCopy(o.rc.Object, "metadata", "labels")
	labels, _ := m.(map[string]any)
	v, ok := labels[key].(string)
	return v, ok
}

func (o objectLabels) Has(key string) bool {
	_, ok := o.Lookup(key)
	return ok
}

func (o objectLabels) Get(key string) string {
	v, _ := o.Lookup(key)
	return v
}

// metaString reads one label or annotation without copying the map.
func metaString(rc *unstructured.Unstructured, field, key string) string {
	m, _, _ := unstructured.NestedFieldNoCopy(rc.Object, "metadata", field)
	values, _ := m.(map[string]any)
	v, _ := values[key].(string)
	return v
}

// managed reports whether raysync acts on rc now: in scope and not being deleted.
func (c Config) managed(rc *unstructured.Unstructured) bool {
	return c.InScope(rc) && !beingDeleted(rc)
}

// beingDeleted is rc.GetDeletionTimestamp() != nil without the metav1.Time it allocates.
func beingDeleted(rc *unstructured.Unstructured) bool {
	meta, _ := rc.Object["metadata"].(map[string]any)
	if s, _ := meta["deletionTimestamp"].(string); s == "" {
		return false
	}
	return rc.GetDeletionTimestamp() != nil
}
