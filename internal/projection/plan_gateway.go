package projection

// What raysync keeps for the gateway: one table of every routed object (which cluster, which head
// Service, which token its processes run on) and the client tokens it accepts; and an ExternalName
// Service <name>-gw per RayService and RayCluster, the stable address clients use.

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// GatewayAddressSuffix names an object's address: <name>-gw.
const GatewayAddressSuffix = "-gw"

// gatewayAddressOwner is the object a cluster's address belongs to: its RayService, else itself.
func gatewayAddressOwner(in *ClusterInput) *unstructured.Unstructured {
	if ownerKind(in.Cluster) == "RayService" {
		return in.Owner // nil until the RayService is in the cache
	}
	return in.Cluster
}

// gatewayAddressName is the address Service's name for obj ("" when the name would not be a valid one).
func gatewayAddressName(obj *unstructured.Unstructured) string {
	n := obj.GetName() + GatewayAddressSuffix
	if len(validation.IsDNS1035Label(n)) > 0 {
		return ""
	}
	return n
}

// desiredGatewayAddress is the ExternalName Service pointing obj's address at the gateway, owned by
// obj (so it is garbage-collected with it).
func desiredGatewayAddress(obj *unstructured.Unstructured, gatewayService string) *corev1.Service {
	f := false
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: gatewayAddressName(obj), Namespace: obj.GetNamespace(),
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.KindAnnotation: names.KindGatewayAddress},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: obj.GetAPIVersion(), Kind: obj.GetKind(), Name: obj.GetName(),
				UID: obj.GetUID(), BlockOwnerDeletion: &f}}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: gatewayService,
			Ports: []corev1.ServicePort{{Name: "dashboard", Port: 8265}, {Name: "client", Port: 10001}}},
	}
}

// planGatewayAddress keeps the cluster's address (its RayService's, for a RayService's cluster).
func planGatewayAddress(in *ClusterInput, cfg Config, p *ClusterPlan) {
	obj := gatewayAddressOwner(in)
	if cfg.Gateway.Service == "" || obj == nil || gatewayAddressName(obj) == "" || !cfg.managed(in.Cluster) {
		return
	}
	want, cur := desiredGatewayAddress(obj, cfg.Gateway.Service), in.GatewayAddress
	switch {
	case cur == nil:
		p.Actions = append(p.Actions, CreateService{Service: want})
	case cur.Labels[names.ManagedByLabel] != names.ManagedByValue:
		p.warnOnce(in, names.ReasonTargetNotOwned, fmt.Sprintf(
			"Service %s already exists and is not managed by raysync: the gateway address of %s %s is not kept (clients cannot use it)",
			cur.Name, obj.GetKind(), obj.GetName()))
	case cur.Spec.Type != want.Spec.Type || cur.Spec.ExternalName != want.Spec.ExternalName || len(cur.Spec.Ports) != len(want.Spec.Ports):
		next := cur.DeepCopy()
		next.Spec = want.Spec
		p.Actions = append(p.Actions, UpdateService{Service: next})
	}
}

// headService is the name of the cluster's own head Service (KubeRay: spec.headGroupSpec.headService's
// name when set, else <cluster>-head-svc).
func headService(rc *unstructured.Unstructured) string {
	if n, _, _ := unstructured.NestedString(rc.Object, "spec", "headGroupSpec", "headService", "metadata", "name"); n != "" {
		return n
	}
	return rc.GetName() + "-head-svc"
}

// runsOn is the token the cluster's processes run on, when raysync can say (nil: no route).
func runsOn(v clusterView) []byte {
	if !names.AsWanted(v.plan.Status.Token) || !v.in.Sources.token.valid() {
		return nil // missing, not owned, not yet written, or an invalid source: nothing to forward with
	}
	if v.in.Target != nil {
		return v.in.Target.Data[kuberay.AuthTokenKey] // raysync keeps it on what the processes hold
	}
	if v.plan.Standing.State == names.TokenCurrent {
		return v.in.Sources.token.value // reading the source itself, started after its last change
	}
	return nil
}

// planGatewayTable is the gateway's table for the fleet at now; nil when the canonical source or the
// rotation ledger cannot be used (the published table then stays as it is, the previous token's grace
// with it).
func planGatewayTable(views []clusterView, src *sourceView, cfg Config, now time.Time) *gateway.Table {
	if !src.token.valid() || src.ledgerErr != nil {
		return nil
	}
	t := &gateway.Table{Accept: []gateway.Accepted{{Credential: gateway.Current, SHA256: gateway.Digest(src.token.value)}},
		Tokens: map[string][]byte{}, Routes: map[string]gateway.Route{}}
	if prev, until, ok := previousAccepted(src, cfg, now); ok && prev.Accept != t.Accept[0].SHA256 {
		t.Accept = append(t.Accept, gateway.Accepted{Credential: gateway.Previous, SHA256: prev.Accept, Until: &until})
	}
	if len(src.pending) > 0 && gateway.Digest(src.pending) != t.Accept[0].SHA256 {
		t.Accept = append(t.Accept, gateway.Accepted{Credential: gateway.Pending, SHA256: gateway.Digest(src.pending)})
	}
	route := func(key, kind string, v clusterView, token []byte) {
		id := tokenDigest(token)
		t.Tokens[id] = token
		t.Routes[key] = gateway.Route{Kind: kind, Cluster: v.in.Cluster.GetName(), Service: headService(v.in.Cluster), Token: id, RayTLS: rayTLS(v)}
	}
	for _, v := range views {
		if token := runsOn(v); token != nil && v.in.Cluster.GetDeletionTimestamp() == nil {
			route(v.in.Cluster.GetNamespace()+"/"+v.in.Cluster.GetName(), "RayCluster", v, token)
		}
	}
	// A RayService routes to its active cluster, with that cluster's token (one snapshot: never the
	// new cluster with the old token); it wins over a RayCluster of the same name.
	for _, v := range views {
		rc := v.in.Cluster
		if token := runsOn(v); token != nil && ownerKind(rc) == "RayService" && v.in.Owner != nil && activeCluster(v.in.Owner) == rc.GetName() {
			route(rc.GetNamespace()+"/"+v.in.Owner.GetName(), "RayService", v, token)
		}
	}
	return t
}

// rayTLS reports whether the cluster's Ray serves its gRPC ports, Ray Client's among them, only over
// mutual TLS: RAY_USE_TLS set to 1 or true (as Ray reads it) on the head's Ray container, in the
// spec or in a head pod (KubeRay v1.7.0's RayClusterMTLS gate, spec.tlsOptions, sets it in the pods).
func rayTLS(v clusterView) bool {
	on := func(env []corev1.EnvVar) bool {
		return slices.ContainsFunc(env, func(e corev1.EnvVar) bool {
			return e.Name == "RAY_USE_TLS" && (strings.EqualFold(e.Value, "1") || strings.EqualFold(e.Value, "true"))
		})
	}
	rc := v.in.Cluster
	if _, ok, _ := unstructured.NestedMap(rc.Object, "spec", "tlsOptions"); ok {
		return true
	}
	containers, _, _ := unstructured.NestedSlice(rc.Object, "spec", "headGroupSpec", "template", "spec", "containers")
	if len(containers) > 0 {
		var c corev1.Container
		if m, ok := containers[0].(map[string]any); ok && runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c) == nil && on(c.Env) {
			return true
		}
	}
	return slices.ContainsFunc(v.in.Pods, func(p *corev1.Pod) bool {
		return p.Labels[kuberay.NodeTypeLabel] == "head" && len(p.Spec.Containers) > 0 && on(p.Spec.Containers[0].Env)
	})
}

// maxTableBytes: a Secret holds at most 1 MiB; a table larger than this is not published.
const maxTableBytes = 900 << 10

// desiredGatewayTableSecret is the Secret holding the encoded table; cur is it as it is (nil: absent).
func desiredGatewayTableSecret(cfg Config, cur *corev1.Secret, table []byte) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Gateway.Table.Name, Namespace: cfg.Gateway.Table.Namespace,
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.KindAnnotation: names.KindGatewayTable}},
		Type: corev1.SecretTypeOpaque,
	}
	if cur != nil {
		s = cur.DeepCopy()
	}
	s.Data = map[string][]byte{gateway.TableKey: table}
	return s
}

// ownGatewayTable reports whether s carries raysync's marks of the gateway's table.
func ownGatewayTable(s *corev1.Secret) bool {
	return s.Labels[names.ManagedByLabel] == names.ManagedByValue && s.Annotations[names.KindAnnotation] == names.KindGatewayTable
}

// tablePlan is what the published table Secret needs: a write, or why there is none.
type tablePlan struct {
	Write   Action // CreateSecret or UpdateSecret; nil: nothing to write
	Problem string // why the Secret is left as it is ("": none)
	Warning *RecordEvent
}

// planGatewayTableSecret compares the published table Secret as it is (cur, nil: absent) with the
// table it should hold: created when absent, put back when it holds anything else (deleted, edited),
// nothing when equal. A Secret of that name that is not raysync's table is never written.
func planGatewayTableSecret(cfg Config, cur *corev1.Secret, table []byte) tablePlan {
	switch {
	case cur == nil:
		return tablePlan{Write: CreateSecret{Secret: desiredGatewayTableSecret(cfg, nil, table)}}
	case !ownGatewayTable(cur):
		msg := fmt.Sprintf("Secret %s exists and is not raysync's gateway table (label %s=%s and annotation %s=%s): raysync leaves it as it is "+
			"and publishes no table (the gateway keeps its last one); delete it or choose another --gateway-table",
			cfg.Gateway.Table, names.ManagedByLabel, names.ManagedByValue, names.KindAnnotation, names.KindGatewayTable)
		return tablePlan{Problem: msg, Warning: &RecordEvent{Object: cur, Type: corev1.EventTypeWarning, Reason: names.ReasonTargetNotOwned, Message: msg}}
	case len(cur.Data) == 1 && bytes.Equal(cur.Data[gateway.TableKey], table):
		return tablePlan{}
	}
	return tablePlan{Write: UpdateSecret{Secret: desiredGatewayTableSecret(cfg, cur, table)}}
}

// previousAccepted is the canonical token the gateway accepts besides the current one, and until
// when, from the source and the ledger as they are: the rotation before the current token's, for
// --gateway-grace after the current token was first seen, unless `syncer revoke-previous` revoked it.
// The source's change and the ledger's record of it reach the caches, and their keys the queue, in
// any order: until the ledger holds the current token, its newest rotation is the token just replaced
// and its grace runs from now (from the record's time once it is written), so the first table that
// accepts a new token accepts the old one too.
func previousAccepted(src *sourceView, cfg Config, now time.Time) (prev ledger.Rotation, until time.Time, ok bool) {
	if cfg.Gateway.Grace <= 0 || len(src.ledger) == 0 {
		return prev, until, false
	}
	since, rotation := src.rotation.FirstSeen, src.rotation.ID
	if rotation != 0 {
		prev, ok = src.ledger.Previous()
	} else { // the ledger has not recorded the current token yet: it will be the next rotation
		// (since in whole minutes: a ledger that cannot be written must not make every pass rewrite
		// the table)
		prev, ok = src.ledger[len(src.ledger)-1], true
		since, rotation = now.Truncate(time.Minute), prev.ID+1
	}
	until = since.Add(cfg.Gateway.Grace)
	return prev, until, ok && prev.Accept != "" && src.previousRevoked != rotation && now.Before(until)
}

// tableExpiry is how long until an accepted credential of t expires (0: none will): the table is
// planned again then.
func tableExpiry(t *gateway.Table, now time.Time) time.Duration {
	var d time.Duration
	for _, a := range t.Accept {
		if a.Until != nil && a.Until.After(now) && (d == 0 || a.Until.Sub(now) < d) {
			d = a.Until.Sub(now) + time.Second
		}
	}
	return d
}
