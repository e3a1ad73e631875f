package podtemplate

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/internal/validate"
)

func TestDesiredTemplates(t *testing.T) {
	tlsCfg := &TLS{SecretName: "client-tls", MountPath: "/etc/raysync/autoscaler-tls", HasCA: true,
		APIServer: &validate.APIServer{Host: "proxy.example", Port: 6443}}
	tests := map[string]struct {
		rc          *unstructured.Unstructured
		cfg         Config
		wantChanged bool
		wantErr     string
		check       func(*testing.T, *unstructured.Unstructured)
	}{
		"pull secret added to head and every worker": {
			rc: templatedCluster("c"), cfg: Config{PullSecrets: []string{"regcred"}}, wantChanged: true,
			check: func(t *testing.T, u *unstructured.Unstructured) {
				for _, p := range [][]string{{"spec", "headGroupSpec", "template", "spec"}} {
					l, _, _ := unstructured.NestedSlice(u.Object, append(p, "imagePullSecrets")...)
					if len(l) != 1 || l[0].(map[string]any)["name"] != "regcred" {
						t.Errorf("head imagePullSecrets = %v", l)
					}
				}
				w, _, _ := unstructured.NestedSlice(u.Object, "spec", "workerGroupSpecs")
				l, _, _ := unstructured.NestedSlice(w[0].(map[string]any), "template", "spec", "imagePullSecrets")
				if len(l) != 1 {
					t.Errorf("worker imagePullSecrets = %v", l)
				}
			},
		},
		"existing entries kept, no duplicates": {
			rc: templatedCluster("c", setPath([]any{map[string]any{"name": "team-cred"}, map[string]any{"name": "regcred"}},
				"spec", "headGroupSpec", "template", "spec", "imagePullSecrets")),
			cfg: Config{PullSecrets: []string{"regcred"}}, wantChanged: true, // the worker still lacks it
			check: func(t *testing.T, u *unstructured.Unstructured) {
				l, _, _ := unstructured.NestedSlice(u.Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")
				if len(l) != 2 || l[0].(map[string]any)["name"] != "team-cred" {
					t.Errorf("head imagePullSecrets = %v", l)
				}
			},
		},
		"already in place: no change": {
			rc: func() *unstructured.Unstructured {
				u, _, _ := Desired(templatedCluster("c", autoscaling), Config{PullSecrets: []string{"regcred"}, TLS: tlsCfg})
				return u
			}(),
			cfg: Config{PullSecrets: []string{"regcred"}, TLS: tlsCfg},
		},
		"TLS only on autoscaling clusters": {
			rc: templatedCluster("c"), cfg: Config{TLS: tlsCfg},
		},
		"TLS: volume, read-only mount, env": {
			rc:  templatedCluster("c", autoscaling, setPath([]any{map[string]any{"name": "USER_VAR", "value": "kept"}}, "spec", "autoscalerOptions", "env")),
			cfg: Config{TLS: tlsCfg}, wantChanged: true,
			check: func(t *testing.T, u *unstructured.Unstructured) {
				vols, _, _ := unstructured.NestedSlice(u.Object, "spec", "headGroupSpec", "template", "spec", "volumes")
				if len(vols) != 1 || vols[0].(map[string]any)["secret"].(map[string]any)["secretName"] != "client-tls" {
					t.Errorf("volumes = %v", vols)
				}
				mounts, _, _ := unstructured.NestedSlice(u.Object, "spec", "autoscalerOptions", "volumeMounts")
				if len(mounts) != 1 || mounts[0].(map[string]any)["mountPath"] != "/etc/raysync/autoscaler-tls" || mounts[0].(map[string]any)["readOnly"] != true {
					t.Errorf("mounts = %v", mounts)
				}
				env, _, _ := unstructured.NestedSlice(u.Object, "spec", "autoscalerOptions", "env")
				got := map[string]string{}
				for _, e := range env {
					got[e.(map[string]any)["name"].(string)] = e.(map[string]any)["value"].(string)
				}
				want := map[string]string{"USER_VAR": "kept",
					EnvClientCertPath: "/etc/raysync/autoscaler-tls/tls.crt", EnvClientKeyPath: "/etc/raysync/autoscaler-tls/tls.key",
					EnvCACertPath: "/etc/raysync/autoscaler-tls/ca.crt", EnvServiceHost: "proxy.example", EnvServicePortHTTPS: "6443"}
				for k, v := range want {
					if got[k] != v {
						t.Errorf("env %s = %q, want %q", k, got[k], v)
					}
				}
				// Ray containers are unchanged.
				c, _, _ := unstructured.NestedSlice(u.Object, "spec", "headGroupSpec", "template", "spec", "containers")
				if len(c[0].(map[string]any)) != 2 {
					t.Errorf("head container changed: %v", c[0])
				}
			},
		},
		"wrong env value is corrected": {
			rc:  templatedCluster("c", autoscaling, setPath([]any{map[string]any{"name": EnvClientCertPath, "value": "/wrong"}}, "spec", "autoscalerOptions", "env")),
			cfg: Config{TLS: &TLS{SecretName: "client-tls", MountPath: "/m"}}, wantChanged: true,
			check: func(t *testing.T, u *unstructured.Unstructured) {
				env, _, _ := unstructured.NestedSlice(u.Object, "spec", "autoscalerOptions", "env")
				if len(env) != 2 || env[0].(map[string]any)["value"] != "/m/tls.crt" {
					t.Errorf("env = %v", env)
				}
			},
		},
		"workerGroupSpecs of the wrong type: error, no panic": {
			rc: templatedCluster("c", setPath("oops", "spec", "workerGroupSpecs")), cfg: Config{PullSecrets: []string{"r"}}, wantErr: "workerGroupSpecs",
		},
		"imagePullSecrets of the wrong type": {
			rc:  templatedCluster("c", setPath("regcred", "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")),
			cfg: Config{PullSecrets: []string{"r"}}, wantErr: "imagePullSecrets is not a list",
		},
		"template of the wrong type": {
			rc: templatedCluster("c", setPath(int64(3), "spec", "headGroupSpec", "template")), cfg: Config{PullSecrets: []string{"r"}}, wantErr: "template is not an object",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			orig := tc.rc.DeepCopy()
			got, changed, err := Desired(tc.rc, tc.cfg)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || changed != tc.wantChanged {
				t.Fatalf("changed = %v, err = %v; want changed %v", changed, err, tc.wantChanged)
			}
			if !equalJSON(orig.Object, tc.rc.Object) {
				t.Fatal("Desired mutated its input (a cached object)")
			}
			if tc.check != nil {
				tc.check(t, got)
			}
			if again, changed, _ := Desired(got, tc.cfg); changed || !equalJSON(again.Object, got.Object) {
				t.Error("not idempotent")
			}
		})
	}
}
