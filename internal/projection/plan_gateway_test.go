package projection

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

var gatewayTableName = types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "raysync-gateway"}
var ledgerName = types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "raysync-rotations"}

// gatewayLedger is a ledger whose current rotation (7, first seen an hour ago) holds token and whose
// previous one a client token clients may still hold.
func gatewayLedger(revoked string) *corev1.Secret {
	l := ledger.Ledger{{ID: 6, Digest: "0011223344556677", FirstSeen: planNow.Add(-48 * time.Hour), Accept: gateway.Digest([]byte("previous-client-token"))},
		{ID: 7, Digest: tokenDigest([]byte(token)), FirstSeen: planNow.Add(-time.Hour), Accept: gateway.Digest([]byte(token))}}
	s := ledger.Desired(ledgerName, nil, l)
	if revoked != "" {
		s.Annotations[names.PreviousRevokedAnnotation] = revoked
	}
	return s
}

func gatewayConfig() Config {
	return Config{Source: tokenSrc, Ledger: ledgerName, Rotation: RotationOptions{Timeout: time.Hour},
		Gateway: GatewayOptions{Table: gatewayTableName, Service: "raysync-gateway.raysync.svc.cluster.local", Grace: 24 * time.Hour, PendingKey: "pending"}}.withDefaults()
}

func gatewayView(cfg Config, sources []*corev1.Secret, rc *unstructured.Unstructured, opts ...func(*ClusterInput)) clusterView {
	in := input(cfg, rc, sources, opts...)
	return clusterView{in: in, plan: planCluster(in, cfg)}
}

func TestGatewayTable(t *testing.T) {
	cfg := gatewayConfig()
	src := sourceSecret(token)
	src.Data["pending"] = []byte("next-client-token")
	sources := []*corev1.Secret{src, gatewayLedger("")}
	marked := func(name, value string) *corev1.Secret {
		return secret(ns, name, map[string]string{"auth_token": value}, ownedBy(name), withSecretAnnotation(names.TokenSHA256Annotation, tokenDigest([]byte(value))),
			withSecretAnnotation(names.SyncedAtAnnotation, planNow.Add(-10*time.Hour).Format(time.RFC3339Nano)))
	}
	early := func(name string) *corev1.Pod {
		return startedPod(name+"-head", name, planNow.Add(-5*time.Hour), headPod)
	}
	rs := rayService("svc", setPath("svc-a", "status", "activeServiceStatus", "rayClusterName"))
	views := []clusterView{
		gatewayView(cfg, sources, rayCluster("current"), target(marked("current", token))),
		gatewayView(cfg, sources, rayCluster("behind"), target(marked("behind", oldToken)), pods(early("behind"))),
		gatewayView(cfg, sources, rayCluster("gone"), pods(early("gone"))), // its Secret deleted under it: missing
		gatewayView(cfg, sources, rayCluster("svc-a", ofRayService("svc")), target(marked("svc-a", oldToken)), pods(early("svc-a")), owner(rs)),
		gatewayView(cfg, sources, rayCluster("svc-b", ofRayService("svc")), target(marked("svc-b", token)), owner(rs)),
		gatewayView(cfg, sources, rayCluster("own-svc", setPath("custom-head", "spec", "headGroupSpec", "headService", "metadata", "name")), target(marked("own-svc", token))),
		gatewayView(cfg, sources, rayCluster("reads-source", withAuth(map[string]any{"mode": "token", "secretName": "ray-token"}), func(u *unstructured.Unstructured) { u.SetNamespace(tokenSrc.Namespace) }),
			pods(startedPod("reads-source-head", "reads-source", planNow.Add(-5*time.Hour)))), // started before the rotation: behind, token unknown
		gatewayView(cfg, sources, rayCluster("leaving", deleting), target(marked("leaving", token))),
	}
	tab := planGatewayTable(views, readSources(cfg, getter(sources), planNow), cfg, planNow)
	if tab == nil {
		t.Fatal("no table")
	}
	route := func(key string) string {
		r, ok := tab.Routes[key]
		if !ok {
			return "-"
		}
		return r.Kind + " " + r.Cluster + " " + r.Service + " " + string(tab.Tokens[r.Token])
	}
	for key, want := range map[string]string{
		"ray/current": "RayCluster current current-head-svc " + token,
		"ray/behind":  "RayCluster behind behind-head-svc " + oldToken, // the token its processes run on
		"ray/gone":    "-",                                             // nothing says which token it runs on
		// A RayService goes to its active cluster, with that cluster's token, not the newest one's.
		"ray/svc":                            "RayService svc-a svc-a-head-svc " + oldToken,
		"ray/svc-b":                          "RayCluster svc-b svc-b-head-svc " + token,
		"ray/own-svc":                        "RayCluster own-svc custom-head " + token,
		tokenSrc.Namespace + "/reads-source": "-",
		"ray/leaving":                        "-",
	} {
		if got := route(key); got != want {
			t.Errorf("route %s: %q, want %q", key, redactTokens(got), redactTokens(want))
		}
	}
	if len(tab.Tokens) != 2 {
		t.Errorf("%d tokens in the table, want 2 (clusters on one token share it)", len(tab.Tokens))
	}
	until := planNow.Add(23 * time.Hour)
	want := []gateway.Accepted{{Credential: gateway.Current, SHA256: gateway.Digest([]byte(token))},
		{Credential: gateway.Previous, SHA256: gateway.Digest([]byte("previous-client-token")), Until: &until},
		{Credential: gateway.Pending, SHA256: gateway.Digest([]byte("next-client-token"))}}
	if !equalJSON(tab.Accept, want) {
		t.Errorf("accept %+v, want %+v", tab.Accept, want)
	}
	if d := tableExpiry(tab, planNow); d != 23*time.Hour+time.Second {
		t.Errorf("replanned in %s, want when the previous token's grace ends", d)
	}
	b, _ := tab.Encode()
	if _, err := gateway.Decode(b); err != nil {
		t.Errorf("the table does not decode: %v", err)
	}
}

func getter(sources []*corev1.Secret) func(types.NamespacedName) *corev1.Secret {
	return func(n types.NamespacedName) *corev1.Secret {
		for _, s := range sources {
			if s.Namespace == n.Namespace && s.Name == n.Name {
				return s
			}
		}
		return nil
	}
}

func redactTokens(s string) string {
	return strings.NewReplacer(token, "<current>", oldToken, "<old>").Replace(s)
}

func TestGatewayAccepts(t *testing.T) {
	cfg := gatewayConfig()
	accepted := func(cfg Config, now time.Time, sources ...*corev1.Secret) []gateway.Credential {
		tab := planGatewayTable(nil, readSources(cfg, getter(sources), now), cfg, now)
		if tab == nil {
			return nil
		}
		var out []gateway.Credential
		for _, a := range tab.Accept {
			out = append(out, a.Credential)
		}
		return out
	}
	noGrace := cfg
	noGrace.Gateway.Grace = 0
	noPending := cfg
	noPending.Gateway.PendingKey = ""
	pendingIsCurrent := sourceSecret(token)
	pendingIsCurrent.Data["pending"] = []byte(token)
	oldLedger := gatewayLedger("")
	l, _ := ledger.Read(oldLedger)
	l[0].Accept = "" // recorded before raysync kept what the gateway accepts
	oldLedger = ledger.Desired(ledgerName, nil, l)
	foreignLedger := gatewayLedger("")
	foreignLedger.Labels = nil
	brokenLedger := gatewayLedger("")
	brokenLedger.Data["rotations.json"] = []byte("{")
	for name, tc := range map[string]struct {
		got  []gateway.Credential
		want string
	}{
		"current and previous within its grace":        {accepted(noPending, planNow, sourceSecret(token), gatewayLedger("")), "current previous"},
		"the grace over":                               {accepted(noPending, planNow.Add(24*time.Hour), sourceSecret(token), gatewayLedger("")), "current"},
		"no grace":                                     {accepted(noGrace, planNow, sourceSecret(token), gatewayLedger("")), "current"},
		"previous revoked for this rotation":           {accepted(noPending, planNow, sourceSecret(token), gatewayLedger("7")), "current"},
		"a revocation of an earlier rotation":          {accepted(noPending, planNow, sourceSecret(token), gatewayLedger("6")), "current previous"},
		"a previous rotation recorded without its SHA": {accepted(noPending, planNow, sourceSecret(token), oldLedger), "current"},
		"a pending key equal to the current token":     {accepted(noGrace, planNow, pendingIsCurrent, gatewayLedger("")), "current"},
		// The source's change reached the caches before the ledger's record of it: the token just
		// replaced (the ledger's newest) is the previous one already, or the first table accepting the
		// new token would refuse the old one.
		"the source newer than the ledger":           {accepted(noPending, planNow, sourceSecret("unseen-token"), gatewayLedger("")), "current previous"},
		"the source newer than the ledger, no grace": {accepted(noGrace, planNow, sourceSecret("unseen-token"), gatewayLedger("")), "current"},
		"the source rolled back to an earlier token": {accepted(noPending, planNow, sourceSecret("previous-client-token"), gatewayLedger("")), "current previous"},
		"the ledger is someone else's: no table":     {accepted(noPending, planNow, sourceSecret(token), foreignLedger), ""},
		"the ledger cannot be read: no table":        {accepted(noPending, planNow, sourceSecret(token), brokenLedger), ""},
		"an invalid source: no table":                {accepted(cfg, planNow, sourceSecret(" padded "), gatewayLedger("")), ""},
	} {
		var got []string
		for _, c := range tc.got {
			got = append(got, string(c))
		}
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s: %v, want %q", name, got, tc.want)
		}
	}
}

func TestGatewayAddress(t *testing.T) {
	cfg := gatewayConfig()
	sources := []*corev1.Secret{sourceSecret(token)}
	mine := desiredGatewayAddress(rayCluster("c1"), cfg.Gateway.Service)
	mine.ResourceVersion = "3"
	moved := mine.DeepCopy()
	moved.Spec.ExternalName = "elsewhere.example"
	foreign := mine.DeepCopy()
	foreign.Labels = nil
	rs := rayService("svc")
	for name, tc := range map[string]struct {
		rc   *unstructured.Unstructured
		opts []func(*ClusterInput)
		want string
	}{
		"none yet: created":                                {rc: rayCluster("c1"), want: "create c1-gw -> raysync-gateway.raysync.svc.cluster.local owned by RayCluster c1"},
		"in place: nothing":                                {rc: rayCluster("c1"), opts: []func(*ClusterInput){func(in *ClusterInput) { in.GatewayAddress = mine }}, want: ""},
		"pointing elsewhere: put back":                     {rc: rayCluster("c1"), opts: []func(*ClusterInput){func(in *ClusterInput) { in.GatewayAddress = moved }}, want: "update c1-gw -> raysync-gateway.raysync.svc.cluster.local owned by RayCluster c1"},
		"someone else's Service: left alone":               {rc: rayCluster("c1"), opts: []func(*ClusterInput){func(in *ClusterInput) { in.GatewayAddress = foreign }}, want: "warn TargetNotOwned"},
		"a RayService's cluster: the RayService's address": {rc: rayCluster("svc-a", ofRayService("svc")), opts: []func(*ClusterInput){owner(rs)}, want: "create svc-gw -> raysync-gateway.raysync.svc.cluster.local owned by RayService svc"},
		"its RayService not cached yet: nothing":           {rc: rayCluster("svc-a", ofRayService("svc")), want: ""},
		"a name too long for a Service: nothing":           {rc: rayCluster(strings.Repeat("a", 61)), want: ""},
		"being deleted: nothing":                           {rc: rayCluster("c1", deleting), want: ""},
	} {
		t.Run(name, func(t *testing.T) {
			in := input(cfg, tc.rc, sources, tc.opts...)
			var p ClusterPlan
			planGatewayAddress(in, cfg, &p)
			var got []string
			for _, a := range p.Actions {
				switch a := a.(type) {
				case CreateService:
					got = append(got, describeAddress("create", a.Service))
				case UpdateService:
					got = append(got, describeAddress("update", a.Service))
				case RecordEvent:
					got = append(got, "warn "+a.Reason)
				}
			}
			if strings.Join(got, "; ") != tc.want {
				t.Errorf("%q, want %q", strings.Join(got, "; "), tc.want)
			}
		})
	}
	if cfg.Gateway.Service = ""; true {
		var p ClusterPlan
		planGatewayAddress(input(cfg, rayCluster("c1"), sources), cfg, &p)
		if len(p.Actions) != 0 {
			t.Errorf("without --gateway-service: %v", p.Actions)
		}
	}
}

func describeAddress(verb string, s *corev1.Service) string {
	o := s.OwnerReferences[0]
	ok := s.Spec.Type == corev1.ServiceTypeExternalName && s.Labels[names.ManagedByLabel] == names.ManagedByValue &&
		s.Annotations[names.KindAnnotation] == names.KindGatewayAddress && len(s.Spec.Ports) == 2
	if !ok {
		return verb + " a malformed Service"
	}
	return verb + " " + s.Name + " -> " + s.Spec.ExternalName + " owned by " + o.Kind + " " + o.Name
}

// TestPreviousTokenBeforeTheLedgerRecordsTheRotation: until the ledger holds the current token, the
// token it replaces (the ledger's newest) is accepted for the grace from now, in whole minutes (a
// ledger that cannot be written does not make every pass rewrite the table); once recorded, for the
// grace from the record.
func TestPreviousTokenBeforeTheLedgerRecordsTheRotation(t *testing.T) {
	cfg := gatewayConfig()
	cfg.Gateway.PendingKey = ""
	now := planNow.Truncate(time.Minute).Add(10 * time.Second)
	src := readSources(cfg, getter([]*corev1.Secret{sourceSecret("unseen-token"), gatewayLedger("")}), now)
	prev, until, ok := previousAccepted(src, cfg, now)
	if !ok || prev.ID != 7 || !until.Equal(now.Truncate(time.Minute).Add(24*time.Hour)) {
		t.Errorf("before the record: rotation %d until %s (%v)", prev.ID, until, ok)
	}
	if _, _, ok := previousAccepted(src, cfg, now.Add(time.Second)); !ok {
		t.Error("not accepted a second later")
	}
	if a, b := planGatewayTable(nil, src, cfg, now), planGatewayTable(nil, src, cfg, now.Add(20*time.Second)); !equalJSON(a, b) {
		t.Errorf("the table changes within a minute while the ledger lags: %+v vs %+v", a.Accept, b.Accept)
	}
	// revoke-previous names a recorded rotation: the next one cannot have been revoked yet
	src = readSources(cfg, getter([]*corev1.Secret{sourceSecret("unseen-token"), gatewayLedger("7")}), now)
	if _, _, ok := previousAccepted(src, cfg, now); !ok {
		t.Error("a revocation of the rotation before revoked the token the source just replaced")
	}
}

// A route says when its cluster's Ray takes gRPC only over mutual TLS (RAY_USE_TLS as Ray reads it:
// 1 or true, any case), so that the gateway refuses Ray Client for it with why (issue 36 item 3).
func TestGatewayRoutesSayWhenRayRunsWithTLS(t *testing.T) {
	cfg := gatewayConfig()
	sources := []*corev1.Secret{sourceSecret(token), gatewayLedger("")}
	marked := func(name string) func(*ClusterInput) {
		return target(secret(ns, name, map[string]string{"auth_token": token}, ownedBy(name), withSecretAnnotation(names.TokenSHA256Annotation, tokenDigest([]byte(token))),
			withSecretAnnotation(names.SyncedAtAnnotation, planNow.Add(-10*time.Hour).Format(time.RFC3339Nano))))
	}
	headEnv := func(name, value string) func(*unstructured.Unstructured) {
		return setPath([]any{map[string]any{"name": "ray-head", "image": "rayproject/ray", "env": []any{map[string]any{"name": name, "value": value}}}},
			"spec", "headGroupSpec", "template", "spec", "containers")
	}
	podEnv := func(cluster, value string) func(*ClusterInput) {
		p := startedPod(cluster+"-head", cluster, planNow.Add(-time.Hour), headPod)
		p.Spec.Containers = []corev1.Container{{Name: "ray-head", Env: []corev1.EnvVar{{Name: "RAY_USE_TLS", Value: value}}}}
		return pods(p)
	}
	for name, tc := range map[string]struct {
		rc   *unstructured.Unstructured
		opts []func(*ClusterInput)
		want bool
	}{
		"plain":                         {rc: rayCluster("plain"), want: false},
		"RAY_USE_TLS=1 on the head":     {rc: rayCluster("one", headEnv("RAY_USE_TLS", "1")), want: true},
		"RAY_USE_TLS=TRUE on the head":  {rc: rayCluster("upper", headEnv("RAY_USE_TLS", "TRUE")), want: true},
		"RAY_USE_TLS=0 on the head":     {rc: rayCluster("zero", headEnv("RAY_USE_TLS", "0")), want: false},
		"another variable":              {rc: rayCluster("other", headEnv("RAY_TLS_CA_CERT", "/etc/ca.crt")), want: false},
		"spec.tlsOptions (KubeRay 1.7)": {rc: rayCluster("mtls", setPath(map[string]any{}, "spec", "tlsOptions")), want: true},
		"set in the head pod only":      {rc: rayCluster("pod"), opts: []func(*ClusterInput){podEnv("pod", "true")}, want: true},
		"the head pod says 0":           {rc: rayCluster("podzero"), opts: []func(*ClusterInput){podEnv("podzero", "0")}, want: false},
	} {
		t.Run(name, func(t *testing.T) {
			v := gatewayView(cfg, sources, tc.rc, append([]func(*ClusterInput){marked(tc.rc.GetName())}, tc.opts...)...)
			tab := planGatewayTable([]clusterView{v}, readSources(cfg, getter(sources), planNow), cfg, planNow)
			r, ok := tab.Routes["ray/"+tc.rc.GetName()]
			if !ok {
				t.Fatalf("no route for %s: %v", tc.rc.GetName(), tab.Routes)
			}
			if r.RayTLS != tc.want {
				t.Errorf("RayTLS %v, want %v", r.RayTLS, tc.want)
			}
		})
	}
}
