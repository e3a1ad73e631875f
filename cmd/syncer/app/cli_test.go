package app

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

// Every subcommand takes the syncer's flags, before or after its arguments, as --flag=value or
// --flag value, as Go's flag users expect.
func TestCommandFlagsGoAnywhere(t *testing.T) {
	scope := []string{"--auth-source=raysync/ray-token", "--all-namespaces"}
	tests := map[string]struct {
		cmd        string
		args       []string
		positional []string
		kubeconfig string
	}{
		"flag value after the argument":   {rotateCommand, append([]string{"ml/batch", "--kubeconfig", "/home/me/.kube/config"}, scope...), []string{"ml/batch"}, "/home/me/.kube/config"},
		"flag=value before the argument":  {rotateCommand, append(append([]string{"--kubeconfig=/k"}, scope...), "ml/batch"), []string{"ml/batch"}, "/k"},
		"arguments between flags":         {rotateCommand, append([]string{"a/one", "--kubeconfig", "/k", "b/two"}, scope...), []string{"a/one", "b/two"}, "/k"},
		"-- ends the flags":               {rotateCommand, append(append([]string{"--kubeconfig=/k"}, scope...), "--", "--odd/name"), []string{"--odd/name"}, "/k"},
		"status with -o after the scope":  {statusCommand, append(scope, "-o", "json"), nil, ""},
		"uninstall with --yes in between": {uninstallCommand, append([]string{"--yes"}, scope...), nil, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c, rest, err := parseCommand(tc.cmd, tc.args, func(string) string { return "" })
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(rest, tc.positional) || c.kubeconfig != tc.kubeconfig {
				t.Errorf("arguments %q, kubeconfig %q; want %q, %q", rest, c.kubeconfig, tc.positional, tc.kubeconfig)
			}
			if c.leaderElect {
				t.Error("a one-shot command leads")
			}
		})
	}
	if c, _, _ := parseCommand(statusCommand, append(scope, "-o", "json"), func(string) string { return "" }); c.output != "json" {
		t.Errorf("-o json read as %q", c.output)
	}
	if _, _, err := parseCommand(rotateCommand, append(scope, "--output=json"), func(string) string { return "" }); err == nil {
		t.Error("rotate accepted status's own flag")
	}
	if _, err := parseFlags(append(scope, "--leader-elect=false", "stray"), func(string) string { return "" }); err == nil || !strings.Contains(err.Error(), "unexpected argument") {
		t.Errorf("the controller took an argument: %v", err)
	}
}

// --name names an install's own objects; the default keeps the names of a single install.
func TestNameNamesTheInstallsObjects(t *testing.T) {
	env := func(k string) string { return map[string]string{"POD_NAMESPACE": "platform"}[k] }
	args := []string{"--auth-source=a/b", "--all-namespaces", "--webhook-addr=:9443", "--webhook-ips=127.0.0.1"}
	c, err := parseFlags(args, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.name != "raysync" || c.rotationLedger != (types.NamespacedName{Namespace: "platform", Name: "raysync-rotations"}) ||
		c.webhook.certSecret.Name != "raysync-webhook-tls" || c.webhook.configuration != "raysync" {
		t.Errorf("defaults: %q %v %v %q", c.name, c.rotationLedger, c.webhook.certSecret, c.webhook.configuration)
	}
	c, err = parseFlags(append(args, "--name=tenant-a"), env)
	if err != nil {
		t.Fatal(err)
	}
	if c.rotationLedger.Name != "tenant-a-rotations" || c.webhook.certSecret.Name != "tenant-a-webhook-tls" || c.webhook.configuration != "tenant-a" {
		t.Errorf("--name tenant-a: %v %v %q", c.rotationLedger, c.webhook.certSecret, c.webhook.configuration)
	}
	if c, _ := parseFlags(append(args, "--webhook-configuration=-"), env); c.webhook.configuration != "" {
		t.Errorf("--webhook-configuration=- keeps %q", c.webhook.configuration)
	}
	if _, err := parseFlags(append(args, "--name=Not_A_Label"), env); err == nil {
		t.Error("accepted a --name that cannot name objects")
	}
	if c, _, err := parseCommand(statusCommand, []string{"--auth-source=a/b", "--all-namespaces", "-n", "rel", "--name", "tenant-a"}, func(string) string { return "" }); err != nil ||
		c.rotationLedger != (types.NamespacedName{Namespace: "rel", Name: "tenant-a-rotations"}) {
		t.Errorf("status -n rel --name tenant-a reads ledger %v (%v)", c.rotationLedger, err)
	}
}

func behind(held string) *projection.RotationStatus {
	return &projection.RotationStatus{State: names.TokenBehind, Policy: names.PolicyHold, Held: held}
}

// movable: behind, held by its policy, and moved by move on request.
func movable(move string) *projection.RotationStatus {
	return &projection.RotationStatus{State: names.TokenBehind, Policy: names.PolicyHold, Move: move}
}

// unmovable: behind, and raysync cannot move it whatever its policy (held by default, so Held is "").
func unmovable(why string) *projection.RotationStatus {
	return &projection.RotationStatus{State: names.TokenBehind, Policy: names.PolicyHold, Unmovable: why}
}

// What `syncer rotate` does to a cluster, from where it stands: a request for a cluster that is not
// behind, or that raysync cannot move, is refused, never kept.
func TestRotateDecides(t *testing.T) {
	tests := map[string]struct {
		status     projection.ClusterStatus
		wantAction string
		wantWhy    string
	}{
		"behind, a RayService's": {projection.ClusterStatus{OwnerKind: "RayService", Owner: "svc", Rotation: movable("replace")}, "replaced", "its RayService svc starts a new cluster"},
		"behind, standalone":     {projection.ClusterStatus{Rotation: movable("restart")}, "restarted", "every pod stops"},
		"behind, a RayJob's":     {projection.ClusterStatus{OwnerKind: "RayJob", Owner: "job", Rotation: movable("restart")}, "restarted", "not while its RayJob job runs"},
		"behind, held by default, sharing a managed copy with running clusters": {projection.ClusterStatus{Rotation: unmovable("it shares the managed Secret x")},
			"", "raysync cannot move it: it shares the managed Secret x"},
		"behind, a RayJob's, sharing a managed copy": {projection.ClusterStatus{OwnerKind: "RayJob", Owner: "job", Rotation: unmovable("it shares the managed Secret x")},
			"", "raysync cannot move it: it shares"},
		"behind, a RayService's whose upgradeStrategy is None, held by annotation": {projection.ClusterStatus{OwnerKind: "RayService", Owner: "svc",
			Rotation: unmovable("its RayService has upgradeStrategy None")}, "", "raysync cannot move it: its RayService has upgradeStrategy None"},
		"current":             {projection.ClusterStatus{Rotation: &projection.RotationStatus{State: names.TokenCurrent}}, "", "not behind"},
		"rotating":            {projection.ClusterStatus{Rotation: &projection.RotationStatus{State: names.TokenRotating}}, "", "already rotating"},
		"held: a shared copy": {projection.ClusterStatus{Rotation: &projection.RotationStatus{State: names.TokenBehind, Policy: names.PolicyHold, Held: "it shares the managed Secret x", Unmovable: "it shares the managed Secret x"}}, "", "raysync cannot move it: it shares"},
		"no token managed":    {projection.ClusterStatus{Token: names.StateNotOwned}, "", "does not manage this cluster's token"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tc.status.Namespace, tc.status.RayCluster = "ml", "c"
			d := decideRotation(tc.status)
			if d.action != tc.wantAction || !strings.Contains(d.why, tc.wantWhy) {
				t.Errorf("action %q (%s), want %q (%s)", d.action, d.why, tc.wantAction, tc.wantWhy)
			}
		})
	}
}

// A user names what they know: a RayCluster, or a RayService or RayJob (whose cluster name changes at
// every upgrade).
func TestRotateResolvesWhatUsersName(t *testing.T) {
	report := &statusReport{Clusters: []projection.ClusterStatus{
		{Namespace: "ml", RayCluster: "batch"},
		{Namespace: "ml", RayCluster: "svc-x7k2p", Owner: "svc", OwnerKind: "RayService"},
		{Namespace: "ml", RayCluster: "job-abc", Owner: "job", OwnerKind: "RayJob"},
		{Namespace: "ml", RayCluster: "both"},
		{Namespace: "ml", RayCluster: "both-1", Owner: "both", OwnerKind: "RayService"},
	}}
	tests := map[string]struct {
		target  string
		want    []string
		wantErr string
	}{
		"a RayCluster":          {target: "ml/batch", want: []string{"batch"}},
		"a RayService":          {target: "ml/svc", want: []string{"svc-x7k2p"}},
		"a RayJob":              {target: "ml/job", want: []string{"job-abc"}},
		"kind given":            {target: "rayservice/ml/both", want: []string{"both-1"}},
		"kind given, a cluster": {target: "RayCluster/ml/both", want: []string{"both"}},
		"two kinds of one name": {target: "ml/both", wantErr: "more than one kind"},
		"nothing of that name":  {target: "ml/nope", wantErr: "no RayCluster, RayService or RayJob"},
		"another namespace":     {target: "other/batch", wantErr: "no RayCluster"},
		"not NAMESPACE/NAME":    {target: "batch", wantErr: "want NAMESPACE/NAME"},
		"an unknown kind":       {target: "deployment/ml/batch", wantErr: "unknown kind"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := resolveTargets(report, []string{tc.target})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var clusters []string
			for _, c := range got[tc.target] {
				clusters = append(clusters, c.RayCluster)
			}
			if !slices.Equal(clusters, tc.want) {
				t.Errorf("clusters %v, want %v", clusters, tc.want)
			}
		})
	}
}

// TestREADMEDocumentsEveryFlag: the CLI reference (docs/reference/cli.md, generated from the command
// tree by tools/docgen) names every command and every flag each command takes.
func TestREADMEDocumentsEveryFlag(t *testing.T) {
	b, err := os.ReadFile("../../../docs/reference/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	var visit func(cmd *cobra.Command)
	visit = func(cmd *cobra.Command) {
		if !strings.Contains(readme, "## "+cmd.CommandPath()+"\n") {
			t.Errorf("the reference has no section for %s", cmd.CommandPath())
		}
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if !strings.Contains(readme, "`--"+f.Name) {
				t.Errorf("%s: the reference does not mention --%s", cmd.CommandPath(), f.Name)
			}
			if f.Shorthand != "" && !strings.Contains(readme, "`-"+f.Shorthand+"`") {
				t.Errorf("%s: the reference does not mention -%s", cmd.CommandPath(), f.Shorthand)
			}
		})
		for _, sub := range cmd.Commands() {
			if sub.IsAvailableCommand() {
				visit(sub)
			}
		}
	}
	visit(Command(func(string) string { return "" }))
}

func TestGatewayFlags(t *testing.T) {
	env := func(k string) string { return map[string]string{"POD_NAMESPACE": "raysync"}[k] }
	c, err := parseGatewayFlags(nil, env)
	if err != nil || c.table.String() != "raysync/raysync-gateway" || c.dashboardAddr != ":8265" || c.clientAddr != ":10001" {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	c, err = parseGatewayFlags([]string{"--table-secret", "ops/tenant-a-raysync-gateway", "--cluster-domain=corp.local"}, env)
	if err != nil || c.table.String() != "ops/tenant-a-raysync-gateway" || c.clusterDomain != "corp.local" {
		t.Fatalf("flags: %+v, %v", c, err)
	}
	for _, bad := range [][]string{{"--table-secret=nope"}, {"--log-format=xml"}, {"--drain-delay=-1s"}, {"extra"}, {"--auth-source=a/b"}} {
		if _, err := parseGatewayFlags(bad, env); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	if _, err := parseGatewayFlags(nil, func(string) string { return "" }); err == nil {
		t.Error("no table Secret and no $POD_NAMESPACE accepted")
	}
}

// In raysync's container a one-shot command inherits the running controller's flags that it takes
// (in either form, --flag=value or --flag value), and none of the controller's own.
func TestInheritedFlags(t *testing.T) {
	argv := []string{"--auth-source=raysync/ray-token", "--namespaces=ml", "--name=rel-raysync", "--workers=16", "--log-format=json",
		"--leader-elect=true", "--leader-election-lease-duration=15s", "--dry-run=true", "--webhook-addr=:9443",
		"--webhook-cert-secret=raysync/rel-raysync-webhook-tls", "--prune=true", "-n", "raysync", "--kubeconfig", "/k", "--leader-elect",
		"--drain-delay", "5s", "--rotation-timeout=30m"}
	common := []string{"--auth-source=raysync/ray-token", "--namespaces=ml", "--name=rel-raysync", "-n", "raysync", "--kubeconfig", "/k", "--rotation-timeout=30m"}
	for cmd, want := range map[string][]string{
		statusCommand:    common,
		rotateCommand:    common,
		revokeCommand:    common,
		uninstallCommand: {"--auth-source=raysync/ray-token", "--namespaces=ml", "--name=rel-raysync", "--leader-election-lease-duration=15s", "--webhook-cert-secret=raysync/rel-raysync-webhook-tls", "-n", "raysync", "--kubeconfig", "/k", "--rotation-timeout=30m"},
	} {
		got := InheritedFlags(cmd, argv)
		if !slices.Equal(got, want) {
			t.Errorf("syncer %s inherits %q, want %q", cmd, got, want)
		}
		if _, _, err := parseCommand(cmd, got, func(string) string { return "" }); err != nil {
			t.Errorf("syncer %s with what it inherits: %v", cmd, err)
		}
	}
}

// TestStatusPrintsUnreadableAnnotations: what `-o json` says of unreadable raysync annotations, the
// table says too (a cluster with a rotation state and one without).
func TestStatusPrintsUnreadableAnnotations(t *testing.T) {
	r := &statusReport{Now: time.Now(), Clusters: []projection.ClusterStatus{
		{Namespace: "ml", RayCluster: "a", Rotation: &projection.RotationStatus{State: names.TokenCurrent, Policy: names.PolicyHold,
			Invalid: []string{`raysync.dev/rotation "hodl" is not replace, restart, hold or gateway: read as hold, the safest`}}},
		{Namespace: "ml", RayCluster: "b", Invalid: []string{`raysync.dev/skip "yes" is not "true" or "false": read as false`}},
		{Namespace: "ml", RayCluster: "c"},
	}}
	var b strings.Builder
	printStatus(&b, r)
	for _, want := range []string{"\n  ml/a: raysync.dev/rotation \"hodl\"", "\n  ml/b: raysync.dev/skip \"yes\""} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status does not say %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "ml/c:") {
		t.Errorf("a cluster without unreadable annotations listed:\n%s", b.String())
	}
}
