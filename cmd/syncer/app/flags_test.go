package app

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func TestParseFlags(t *testing.T) {
	base := []string{"--auth-source=raysync/ray-token", "--all-namespaces", "--leader-elect=false"}
	env := func(k string) string {
		if k == "POD_NAMESPACE" {
			return "raysync-system"
		}
		return ""
	}
	tests := map[string]struct {
		args    []string
		getenv  func(string) string
		wantErr string
		check   func(*testing.T, *config)
	}{
		"minimal": {args: base, check: func(t *testing.T, c *config) {
			if c.authSource != (types.NamespacedName{Namespace: "raysync", Name: "ray-token"}) || c.authSourceKey != "auth_token" ||
				!c.allNamespaces || c.workers != 16 || c.qps != 0 || c.metricsAddr != ":8080" || c.probeAddr != ":8081" || c.logFormat != "json" {
				t.Errorf("defaults: %+v", c)
			}
		}},
		"namespaces deduplicated": {args: []string{"--auth-source=a/b", "--namespaces=x, y,x", "--leader-elect=false"}, check: func(t *testing.T, c *config) {
			if strings.Join(c.namespaces, ",") != "x,y" {
				t.Errorf("namespaces = %v", c.namespaces)
			}
		}},
		"leader election namespace from POD_NAMESPACE": {args: []string{"--auth-source=a/b", "--all-namespaces"}, getenv: env, check: func(t *testing.T, c *config) {
			if !c.leaderElect || c.leaderElectionNS != "raysync-system" {
				t.Errorf("leader election: %v %q", c.leaderElect, c.leaderElectionNS)
			}
		}},
		"webhook with its own certificate": {args: append(base, "--webhook-addr=:9443", "--webhook-dns-names=raysync-webhook.raysync.svc", "--precreate-auth-secrets=false"),
			check: func(t *testing.T, c *config) {
				if c.webhook.certSecret != (types.NamespacedName{Namespace: "raysync", Name: "raysync-webhook-tls"}) || c.webhook.configuration != "raysync" ||
					len(c.webhook.dnsNames) != 1 || !c.noPrecreate || !c.projection().NoPrecreate {
					t.Errorf("webhook: %+v, no precreate %v", c.webhook, c.noPrecreate)
				}
			}},
		"webhook with cert-manager's certificate": {args: append(base, "--webhook-addr=:9443", "--webhook-cert-dir=/etc/tls"), check: func(t *testing.T, c *config) {
			if c.webhook.certDir != "/etc/tls" || c.webhook.certSecret.Name != "" || c.noPrecreate {
				t.Errorf("webhook: %+v", c.webhook)
			}
		}},
		"webhook certificate for no name": {args: append(base, "--webhook-addr=:9443"), wantErr: "needs --webhook-dns-names or --webhook-ips"},
		"webhook bad address":             {args: append(base, "--webhook-addr=9443", "--webhook-ips=127.0.0.1"), wantErr: "--webhook-addr"},
		"webhook bad IP":                  {args: append(base, "--webhook-addr=:9443", "--webhook-ips=localhost"), wantErr: "not an IP address"},
		"webhook bad DNS name":            {args: append(base, "--webhook-addr=:9443", "--webhook-dns-names=Not_A_Name"), wantErr: "not a DNS name"},
		"webhook certificate too short":   {args: append(base, "--webhook-addr=:9443", "--webhook-ips=127.0.0.1", "--webhook-cert-validity=10s"), wantErr: "at least 1m"},
		"missing source":                  {args: []string{"--all-namespaces", "--leader-elect=false"}, wantErr: "--auth-source is required"},
		"source without namespace":        {args: []string{"--auth-source=ray-token", "--all-namespaces", "--leader-elect=false"}, wantErr: "is not NAMESPACE/NAME"},
		"source with bad name":            {args: []string{"--auth-source=ns/Bad_Name", "--all-namespaces", "--leader-elect=false"}, wantErr: "is not NAMESPACE/NAME"},
		"source with extra slash":         {args: []string{"--auth-source=a/b/c", "--all-namespaces", "--leader-elect=false"}, wantErr: "is not NAMESPACE/NAME"},
		"bad source key":                  {args: append(base, "--auth-source-key=a b"), wantErr: "not a valid Secret key"},
		"no scope":                        {args: []string{"--auth-source=a/b", "--leader-elect=false"}, wantErr: "one of --namespaces or --all-namespaces is required"},
		"both scopes":                     {args: append(base, "--namespaces=x"), wantErr: "mutually exclusive"},
		"bad namespace":                   {args: []string{"--auth-source=a/b", "--namespaces=ok,Not_OK", "--leader-elect=false"}, wantErr: `"Not_OK" is not a valid namespace`},
		"empty namespace in list":         {args: []string{"--auth-source=a/b", "--namespaces=a,,b", "--leader-elect=false"}, wantErr: "is not a valid namespace"},
		"bad selector":                    {args: append(base, "--cluster-selector=a in (b"), wantErr: "--cluster-selector"},
		"leader election without ns":      {args: []string{"--auth-source=a/b", "--all-namespaces"}, getenv: func(string) string { return "" }, wantErr: "--leader-election-namespace"},
		"bad lease timing":                {args: []string{"--auth-source=a/b", "--all-namespaces", "--leader-election-namespace=x", "--leader-election-renew-deadline=20s"}, wantErr: "retry-period < renew-deadline < lease-duration"},
		"negative qps":                    {args: append(base, "--kube-api-qps=-1"), wantErr: "must not be negative"},
		"zero workers":                    {args: append(base, "--workers=0"), wantErr: "--workers"},
		"bad log format":                  {args: append(base, "--log-format=xml"), wantErr: "--log-format"},
		"bad log level":                   {args: append(base, "--log-level=loud"), wantErr: "--log-level"},
		"unknown flag":                    {args: append(base, "--frobnicate"), wantErr: "unknown flag: --frobnicate"},
		"not a number":                    {args: append(base, "--workers=many"), wantErr: `invalid argument "many" for "--workers" flag`},
		"pod features": {args: append(base, "--pull-secret=p/regcred", "--pull-secret=p/other", "--autoscaler-tls-secret=p/tls",
			"--autoscaler-api-server=https://proxy:6443", "--recycle-pending-pods=false", "--prune=false"), check: func(t *testing.T, c *config) {
			if len(c.pullSecrets) != 2 || c.autoscalerTLS == nil || c.apiServer == nil || c.apiServer.Port != 6443 || c.recyclePending || c.prune ||
				c.tlsMountPath != "/etc/raysync/autoscaler-tls" {
				t.Errorf("pod options: %+v", c)
			}
		}},
		"pod feature defaults": {args: base, check: func(t *testing.T, c *config) {
			if !c.recyclePending || !c.prune || c.allowRecreate || len(c.pullSecrets) != 0 || c.autoscalerTLS != nil {
				t.Errorf("defaults: %+v", c)
			}
		}},
		"pull secret not NAMESPACE/NAME": {args: append(base, "--pull-secret=regcred"), wantErr: "--pull-secret"},
		"copy names collide":             {args: append(base, "--pull-secret=a/regcred", "--pull-secret=b/regcred"), wantErr: "already used"},
		"tls and pull secret collide":    {args: append(base, "--pull-secret=a/x", "--autoscaler-tls-secret=b/x"), wantErr: "already used"},
		"api server without tls":         {args: append(base, "--autoscaler-api-server=https://proxy"), wantErr: "needs --autoscaler-tls-secret"},
		"http api server refused":        {args: append(base, "--autoscaler-tls-secret=a/t", "--autoscaler-api-server=http://proxy"), wantErr: "https"},
		"relative mount path":            {args: append(base, "--autoscaler-tls-mount-path=etc/tls"), wantErr: "clean absolute path"},
		"positional argument":            {args: append(base, "extra"), wantErr: `unexpected argument "extra"`},
		"negative drain delay":           {args: append(base, "--drain-delay=-1s"), wantErr: "--drain-delay must not be negative"},
		// Two roles naming one Secret: raysync would overwrite (or erase) one with the other.
		"ledger names the source": {args: append(base, "--rotation-ledger=raysync/ray-token"),
			wantErr: "--rotation-ledger raysync/ray-token is also --auth-source: each role needs a Secret of its own"},
		"ledger names a pull secret":            {args: append(base, "--pull-secret=p/regcred", "--rotation-ledger=p/regcred"), wantErr: "is also --pull-secret"},
		"ledger names the TLS secret":           {args: append(base, "--autoscaler-tls-secret=p/tls", "--rotation-ledger=p/tls"), wantErr: "is also --autoscaler-tls-secret"},
		"a pull secret is the source":           {args: append(base, "--pull-secret=raysync/ray-token"), wantErr: "--pull-secret raysync/ray-token is also --auth-source"},
		"the table is the ledger":               {args: append(base, "--gateway-table=raysync/book", "--rotation-ledger=raysync/book"), wantErr: "--gateway-table raysync/book is also --rotation-ledger"},
		"the table is the source":               {args: append(base, "--gateway-table=raysync/ray-token"), wantErr: "is also --auth-source"},
		"the webhook certificate is the source": {args: append(base, "--webhook-addr=:9443", "--webhook-ips=127.0.0.1", "--webhook-cert-secret=raysync/ray-token"), wantErr: "--webhook-cert-secret raysync/ray-token is also --auth-source"},
		"the webhook certificate is the table":  {args: append(base, "--webhook-addr=:9443", "--webhook-ips=127.0.0.1", "--gateway-table=raysync/x", "--webhook-cert-secret=raysync/x"), wantErr: "is also --gateway-table"},
		"the webhook certificate is the ledger (defaults)": {args: []string{"--auth-source=a/b", "--all-namespaces", "--leader-election-namespace=sys",
			"--webhook-addr=:9443", "--webhook-ips=127.0.0.1", "--webhook-cert-secret=sys/raysync-rotations"}, wantErr: "is also --rotation-ledger"},
		"a pull secret's copy would be the ledger": {args: append(base, "--pull-secret=p/book", "--rotation-ledger=ml/book"),
			wantErr: "--pull-secret p/book is copied as book into the watched namespace ml, where it is --rotation-ledger"},
		"a copy outside the watched namespaces is no copy": {args: []string{"--auth-source=raysync/ray-token", "--namespaces=ml", "--leader-elect=false", "--pull-secret=p/book", "--rotation-ledger=other/book"},
			check: func(t *testing.T, c *config) {}},
		// A flag given a value that changes nothing (what it configures is off) is refused, never ignored.
		"a certificate Secret with cert-manager's certificate": {args: append(base, "--webhook-addr=:9443", "--webhook-cert-dir=/tls", "--webhook-cert-secret=raysync/ray-token"),
			wantErr: "--webhook-cert-secret=raysync/ray-token has no effect without --webhook-addr, or with --webhook-cert-dir"},
		"webhook names without a webhook":      {args: append(base, "--webhook-dns-names=a.b"), wantErr: "--webhook-dns-names=a.b has no effect"},
		"a certificate directory alone":        {args: append(base, "--webhook-cert-dir=/tls"), wantErr: "--webhook-cert-dir=/tls has no effect without --webhook-addr"},
		"a grace without a gateway":            {args: append(base, "--gateway-grace=1h"), wantErr: "--gateway-grace=1h0m0s has no effect without --gateway-table"},
		"a mount path without a certificate":   {args: append(base, "--autoscaler-tls-mount-path=/tls"), wantErr: "has no effect without --autoscaler-tls-secret"},
		"recycling off without pod sources":    {args: append(base, "--recycle-pending-pods=false"), wantErr: "--recycle-pending-pods=false has no effect"},
		"lease timing without leader election": {args: append(base, "--leader-election-lease-duration=30s"), wantErr: "with --leader-elect=false or --dry-run"},
		"a burst without a rate":               {args: append(base, "--kube-api-burst=10"), wantErr: "--kube-api-burst=10 has no effect without --kube-api-qps"},
		"defaults given explicitly change nothing: accepted": {args: append(base, "--recycle-pending-pods=true", "--allow-recreate=false", "--kube-api-burst=0",
			"--autoscaler-tls-mount-path=/etc/raysync/autoscaler-tls", "--leader-election-retry-period=2s", "--gateway-grace=24h"), check: func(t *testing.T, c *config) {}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			getenv := tc.getenv
			if getenv == nil {
				getenv = func(string) string { return "" }
			}
			c, err := parseFlags(tc.args, getenv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || strings.Contains(err.Error(), "\n") {
					t.Fatalf("err = %v, want one line containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

// FuzzParseFlags: no command line panics or runs anything, and every error is one line on stderr
// with exit 2 (through Main, as the binary runs; each command's validated configuration is caught
// instead of run). The first argument may name a command.
func FuzzParseFlags(f *testing.F) {
	f.Add("--auth-source=a/b", "--namespaces=x,y", "--cluster-selector=a=b")
	f.Add("--auth-source=/", "--all-namespaces", "--workers=-3")
	f.Add("status", "--auth-source=a/b", "-o=json")
	f.Add("rotate", "x/y", "--all")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		var stderr bytes.Buffer
		x := &cli{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: &stderr, parsed: func(string, any, []string) {}}
		root := x.command()
		root.SetArgs([]string{a, b, c, "--leader-elect=false"})
		cmd, err := root.ExecuteC()
		if code := x.exit(cmd, err); code != 0 && (code != 2 || strings.Count(stderr.String(), "\n") != 1) {
			t.Fatalf("exit %d, stderr %q", code, stderr.String())
		}
		if err != nil && !strings.HasPrefix(stderr.String(), "syncer") {
			t.Fatalf("error not named after its command: %q", stderr.String())
		}
	})
}

// A one-shot command refuses a flag that configures only the controller (its servers, leader election,
// workers, logs, webhook, pruning): it would change nothing, and raysync never accepts and ignores a
// flag. The flags that say what raysync manages, where its objects are and how to reach the API are
// taken; uninstall also takes the Lease duration (a Lease not renewed for twice that: raysync stopped)
// and the webhook certificate Secret (which it deletes).
func TestOneShotCommandsRefuseControllerOnlyFlags(t *testing.T) {
	scope := []string{"--auth-source=raysync/ray-token", "--namespaces=ml", "-n", "raysync"}
	env := func(string) string { return "" }
	refused := []string{"--workers=4", "--leader-elect=true", "--leader-election-renew-deadline=5s", "--leader-election-retry-period=1s",
		"--metrics-bind-address=:9090", "--health-probe-bind-address=:9091", "--drain-delay=5s", "--log-format=console", "--log-level=debug",
		"--prune=false", "--webhook-addr=:9443", "--webhook-cert-dir=/tls", "--webhook-configuration=x", "--webhook-dns-names=a.b",
		"--webhook-ips=127.0.0.1", "--webhook-cert-validity=48h"}
	for _, cmd := range []string{statusCommand, rotateCommand, adoptCommand, pauseCommand, resumeCommand, uninstallCommand, revokeCommand} {
		for _, flag := range refused {
			if _, _, err := parseCommand(cmd, append(scope, flag), env); err == nil || !strings.Contains(err.Error(), "is a flag of the controller that syncer "+cmd+" does not take") {
				t.Errorf("syncer %s %s: %v, want it refused", cmd, flag, err)
			}
		}
		for _, flag := range []string{"--kubeconfig=/k", "--name=tenant-a", "--cluster-selector=a=b", "--pull-secret=p/regcred", "--rotation-policy-raycluster=restart",
			"--rotation-timeout=1h", "--max-concurrent-rotations=2", "--kube-api-qps=5", "--gateway-table=raysync/gw", "--precreate-auth-secrets=false"} {
			if _, _, err := parseCommand(cmd, append(scope, flag), env); err != nil {
				t.Errorf("syncer %s %s: %v", cmd, flag, err)
			}
		}
	}
	for cmd, flags := range map[string][]string{
		statusCommand:    {"--dry-run", "--leader-election-lease-duration=30s", "--webhook-cert-secret=raysync/cert"},
		rotateCommand:    {"--leader-election-lease-duration=30s", "--webhook-cert-secret=raysync/cert"},
		revokeCommand:    {"--leader-election-lease-duration=30s", "--webhook-cert-secret=raysync/cert"},
		uninstallCommand: {},
	} {
		for _, flag := range flags {
			if _, _, err := parseCommand(cmd, append(scope, flag), env); err == nil {
				t.Errorf("syncer %s accepted %s", cmd, flag)
			}
		}
	}
	c, _, err := parseCommand(uninstallCommand, append(scope, "--leader-election-lease-duration=30s", "--webhook-cert-secret=raysync/rel-raysync-webhook-tls", "--dry-run"), env)
	if err != nil || c.leaseDuration != 30*time.Second || c.webhook.certSecret != (types.NamespacedName{Namespace: "raysync", Name: "rel-raysync-webhook-tls"}) || !c.dryRun {
		t.Errorf("uninstall: %v; lease %s, certificate %v", err, c.leaseDuration, c.webhook.certSecret)
	}
}

// A policy flag that cannot take effect is refused at start, not documented as a fallback.
func TestPoliciesThatCannotTakeEffectAreRefused(t *testing.T) {
	for _, flag := range []string{"--rotation-policy-rayservice=restart", "--rotation-policy-raycluster=replace", "--rotation-policy-rayjob=replace"} {
		if _, err := parseFlags([]string{"--auth-source=raysync/ray-token", "--namespaces=ml", "--leader-elect=false", flag}, func(string) string { return "" }); err == nil ||
			!strings.Contains(err.Error(), "cannot take effect") {
			t.Errorf("%s: %v, want it refused", flag, err)
		}
	}
}

// KubeRay v1.7's mTLS reserves /etc/ray/tls: a mount of the autoscaler's certificate there (or around
// it) would make KubeRay refuse the cluster, so raysync refuses it at start.
func TestAutoscalerTLSMountPathAvoidsKubeRaysTLS(t *testing.T) {
	for path, ok := range map[string]bool{"/etc/ray/tls": false, "/etc/ray/tls/client": false, "/etc/ray": false, "/etc/raysync/autoscaler-tls": true, "/etc/ray/tls2": true} {
		_, err := parseFlags([]string{"--auth-source=raysync/ray-token", "--namespaces=ml", "--leader-elect=false",
			"--autoscaler-tls-secret=raysync/tls", "--autoscaler-tls-mount-path=" + path}, func(string) string { return "" })
		if (err == nil) != ok {
			t.Errorf("%s: %v, want accepted %v", path, err, ok)
		}
	}
}
