package projection

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clienttesting "k8s.io/client-go/testing"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

func templatedCluster(name string, opts ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	rc := rayCluster(name)
	rc.Object["spec"].(map[string]any)["headGroupSpec"] = map[string]any{"template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "ray-head", "image": "registry.example/ray:1"}},
	}}}
	rc.Object["spec"].(map[string]any)["workerGroupSpecs"] = []any{map[string]any{"groupName": "gpu", "template": map[string]any{"spec": map[string]any{
		"containers": []any{map[string]any{"name": "ray-worker", "image": "registry.example/ray:1"}},
	}}}}
	for _, o := range opts {
		o(rc)
	}
	return rc
}

func autoscaling(rc *unstructured.Unstructured) {
	rc.Object["spec"].(map[string]any)["enableInTreeAutoscaling"] = true
}

func setPath(v any, path ...string) func(*unstructured.Unstructured) {
	return func(rc *unstructured.Unstructured) { _ = unstructured.SetNestedField(rc.Object, v, path...) }
}

func TestDesiredTemplates(t *testing.T) {
	tlsCfg := &TLSTemplate{SecretName: "client-tls", MountPath: "/etc/raysync/autoscaler-tls", HasCA: true,
		APIServer: &APIServer{Host: "proxy.example", Port: 6443}}
	tests := map[string]struct {
		rc          *unstructured.Unstructured
		cfg         TemplateConfig
		wantChanged bool
		wantErr     string
		check       func(*testing.T, *unstructured.Unstructured)
	}{
		"pull secret added to head and every worker": {
			rc: templatedCluster("c"), cfg: TemplateConfig{PullSecrets: []string{"regcred"}}, wantChanged: true,
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
			cfg: TemplateConfig{PullSecrets: []string{"regcred"}}, wantChanged: true, // the worker still lacks it
			check: func(t *testing.T, u *unstructured.Unstructured) {
				l, _, _ := unstructured.NestedSlice(u.Object, "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")
				if len(l) != 2 || l[0].(map[string]any)["name"] != "team-cred" {
					t.Errorf("head imagePullSecrets = %v", l)
				}
			},
		},
		"already in place: no change": {
			rc: func() *unstructured.Unstructured {
				u, _, _ := desiredTemplates(templatedCluster("c", autoscaling), TemplateConfig{PullSecrets: []string{"regcred"}, TLS: tlsCfg})
				return u
			}(),
			cfg: TemplateConfig{PullSecrets: []string{"regcred"}, TLS: tlsCfg},
		},
		"TLS only on autoscaling clusters": {
			rc: templatedCluster("c"), cfg: TemplateConfig{TLS: tlsCfg},
		},
		"TLS: volume, read-only mount, env": {
			rc:  templatedCluster("c", autoscaling, setPath([]any{map[string]any{"name": "USER_VAR", "value": "kept"}}, "spec", "autoscalerOptions", "env")),
			cfg: TemplateConfig{TLS: tlsCfg}, wantChanged: true,
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
			cfg: TemplateConfig{TLS: &TLSTemplate{SecretName: "client-tls", MountPath: "/m"}}, wantChanged: true,
			check: func(t *testing.T, u *unstructured.Unstructured) {
				env, _, _ := unstructured.NestedSlice(u.Object, "spec", "autoscalerOptions", "env")
				if len(env) != 2 || env[0].(map[string]any)["value"] != "/m/tls.crt" {
					t.Errorf("env = %v", env)
				}
			},
		},
		"workerGroupSpecs of the wrong type: error, no panic": {
			rc: templatedCluster("c", setPath("oops", "spec", "workerGroupSpecs")), cfg: TemplateConfig{PullSecrets: []string{"r"}}, wantErr: "workerGroupSpecs",
		},
		"imagePullSecrets of the wrong type": {
			rc:  templatedCluster("c", setPath("regcred", "spec", "headGroupSpec", "template", "spec", "imagePullSecrets")),
			cfg: TemplateConfig{PullSecrets: []string{"r"}}, wantErr: "imagePullSecrets is not a list",
		},
		"template of the wrong type": {
			rc: templatedCluster("c", setPath(int64(3), "spec", "headGroupSpec", "template")), cfg: TemplateConfig{PullSecrets: []string{"r"}}, wantErr: "template is not an object",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			orig := tc.rc.DeepCopy()
			got, changed, err := desiredTemplates(tc.rc, tc.cfg)
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
				t.Fatal("desiredTemplates mutated its input (a cached object)")
			}
			if tc.check != nil {
				tc.check(t, got)
			}
			if again, changed, _ := desiredTemplates(got, tc.cfg); changed || !equalJSON(again.Object, got.Object) {
				t.Error("not idempotent")
			}
		})
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

var pullSource = types.NamespacedName{Namespace: tokenSrc.Namespace, Name: "regcred"}

func pullSecretSource() *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: tokenSrc.Namespace}, Type: corev1.SecretTypeDockerConfigJson,
		Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{"registry.example":{"auth":"dTpw"}}}`)}}
}

func rayPod(name, cluster string, opts ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), ResourceVersion: "1",
		CreationTimestamp: metav1.NewTime(time.Now().Add(-time.Minute)),
		Labels:            map[string]string{kuberay.ClusterLabel: cluster, kuberay.NodeTypeLabel: "worker"},
		OwnerReferences:   []metav1.OwnerReference{*metav1.NewControllerRef(rayCluster(cluster), kuberay.RayClusterGVK)}},
		Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-worker"}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending}}
	for _, o := range opts {
		o(p)
	}
	return p
}

func running(p *corev1.Pod) {
	p.Status.Phase = corev1.PodRunning
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "ray-worker",
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(time.Now())}}}}
}

func withPullSecret(p *corev1.Pod) {
	p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
}

func TestSyncPodConfig(t *testing.T) {
	fixed, _, _ := desiredTemplates(templatedCluster("c1"), TemplateConfig{PullSecrets: []string{"regcred"}})
	recreate := func(rc *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(rc.Object, "Recreate", "spec", "upgradeStrategy", "type")
	}
	managedCopy := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns,
		Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
		Annotations: map[string]string{names.SourceAnnotation: pullSource.String(), names.KindAnnotation: string(names.KindPullSecret)}},
		Type: corev1.SecretTypeDockerConfigJson, Data: pullSecretSource().Data}
	tests := map[string]struct {
		rc            *unstructured.Unstructured
		objs          []runtime.Object
		allowRecreate bool
		noRecycle     bool
		wantActions   []string
		wantEvent     string
	}{
		"copy created and templates patched": {
			rc: templatedCluster("c1"), objs: []runtime.Object{pullSecretSource()},
			wantActions: []string{"create secrets regcred", "patch rayclusters c1"}, wantEvent: names.ReasonTemplatePatched,
		},
		"template fixed: pending pod without the entry is recycled": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1")},
			wantActions: []string{"delete pods p1"}, wantEvent: names.ReasonPodRecycled,
		},
		"pending pod too young (KubeRay may not have seen it yet): not yet": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", func(p *corev1.Pod) { p.CreationTimestamp = metav1.Now() })},
		},
		"recycling off": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1")}, noRecycle: true,
		},
		"running pod is never deleted, only reported": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", running)},
			wantEvent: names.ReasonStalePodConfig,
		},
		"pod already carrying the entry is left alone": {
			rc: fixed, objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", withPullSecret)},
		},
		"foreign Secret with the copy's name: untouched, not referenced": {
			rc: templatedCluster("c1"),
			objs: []runtime.Object{pullSecretSource(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: ns},
				Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte(`{"auths":{}}`)}}},
			wantActions: []string{"create secrets regcred"}, wantEvent: names.ReasonTargetNotOwned,
		},
		"invalid source: nothing written": {
			rc: templatedCluster("c1"),
			objs: []runtime.Object{&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "regcred", Namespace: tokenSrc.Namespace},
				Type: corev1.SecretTypeDockerConfigJson, Data: map[string][]byte{".dockerconfigjson": []byte(`{`)}}},
		},
		"Recreate with a running pod: deferred": {
			rc: templatedCluster("c1", recreate), objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", running)},
			wantEvent: names.ReasonTemplatePatchDeferred,
		},
		"Recreate without running pods: patched at once": {
			rc: templatedCluster("c1", recreate), objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1")},
			wantActions: []string{"patch rayclusters c1"}, wantEvent: names.ReasonTemplatePatched,
		},
		"Recreate with --allow-recreate: patched": {
			rc: templatedCluster("c1", recreate), objs: []runtime.Object{pullSecretSource(), managedCopy, rayPod("p1", "c1", running)},
			allowRecreate: true, wantActions: []string{"patch rayclusters c1"}, wantEvent: names.ReasonTemplatePatched,
		},
		"skip annotation": {
			rc:   templatedCluster("c1", func(u *unstructured.Unstructured) { u.SetAnnotations(map[string]string{names.SkipAnnotation: "true"}) }),
			objs: []runtime.Object{pullSecretSource()},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := newPodHarness(t, tc.rc, PodOptions{PullSecrets: []types.NamespacedName{pullSource}, RecyclePending: !tc.noRecycle,
				AllowRecreate: tc.allowRecreate}, tc.objs...)
			h.sync(t, "c1")
			if got := strings.Join(h.allWrites(), ","); got != strings.Join(tc.wantActions, ",") {
				t.Errorf("writes = [%s], want [%s]", got, strings.Join(tc.wantActions, ","))
			}
			events := h.events()
			if tc.wantEvent == "" && len(events) > 0 || tc.wantEvent != "" && (len(events) == 0 || !strings.Contains(strings.Join(events, "|"), " "+tc.wantEvent+" ")) {
				t.Errorf("events = %v, want %q", events, tc.wantEvent)
			}
			for _, a := range h.allActions() {
				if p, ok := a.(clienttesting.PatchAction); ok && !strings.Contains(string(p.GetPatch()), `"resourceVersion"`) {
					t.Errorf("patch without resourceVersion precondition: %s", p.GetPatch())
				}
			}
		})
	}
}

func TestTemplateReappliedAfterWipe(t *testing.T) {
	orig := templatedCluster("c1")
	h := newPodHarness(t, orig, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, pullSecretSource())
	h.sync(t, "c1")
	waitFor(t, func() bool {
		rc, _ := h.ctrl.caches.RayCluster(ns, "c1")
		_, ch, _ := desiredTemplates(rc, TemplateConfig{PullSecrets: []string{"regcred"}})
		return !ch
	})
	if v := testutilValue(h.metrics.TemplateReapplied); v != 0 {
		t.Fatalf("first patch counted as re-applied")
	}
	// KubeRay wipes the spec (operator upgrade, worker group appended): raysync puts its entries back.
	cur, _ := h.ctrl.caches.RayCluster(ns, "c1")
	wiped := cur.DeepCopy()
	wiped.Object["spec"] = orig.DeepCopy().Object["spec"]
	if _, err := h.dyn.Resource(kuberay.RayClusterGVR).Namespace(ns).Update(context.Background(), wiped, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		rc, _ := h.ctrl.caches.RayCluster(ns, "c1")
		_, ch, _ := desiredTemplates(rc, TemplateConfig{PullSecrets: []string{"regcred"}})
		return ch
	})
	h.sync(t, "c1")
	if v := testutilValue(h.metrics.TemplateReapplied); v != 1 {
		t.Fatalf("raysync_template_reapplied_total = %v, want 1", v)
	}
}

func TestPruneManagedPodCopies(t *testing.T) {
	managed := func(name, kind string, src types.NamespacedName) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("u-" + name), ResourceVersion: "1",
			Labels:      map[string]string{names.ManagedByLabel: names.ManagedByValue},
			Annotations: map[string]string{names.SourceAnnotation: src.String(), names.KindAnnotation: kind}}}
	}
	t.Run("last cluster gone: copy pruned", func(t *testing.T) {
		h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, managed("regcred", string(names.KindPullSecret), pullSource))
		if err := h.ctrl.syncNamespace(context.Background(), ns); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(h.allWrites(), ","); got != "delete secrets regcred" {
			t.Errorf("writes = %s", got)
		}
	})
	t.Run("cluster in namespace: kept", func(t *testing.T) {
		h := newPodHarness(t, templatedCluster("c1"), PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, managed("regcred", string(names.KindPullSecret), pullSource))
		_ = h.ctrl.syncNamespace(context.Background(), ns)
		if w := h.allWrites(); len(w) > 0 {
			t.Errorf("writes = %v", w)
		}
	})
	t.Run("unreferenced copy of a source raysync is no longer configured with: pruned", func(t *testing.T) {
		h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}},
			managed("other", string(names.KindPullSecret), types.NamespacedName{Namespace: "x", Name: "other"}))
		_ = h.ctrl.syncNamespace(context.Background(), ns)
		if got := strings.Join(h.allWrites(), ","); got != "delete secrets other" {
			t.Errorf("writes = [%s], want [delete secrets other]", got)
		}
	})
	t.Run("--prune=false", func(t *testing.T) {
		h := newPodHarness(t, nil, PodOptions{PullSecrets: []types.NamespacedName{pullSource}}, managed("regcred", string(names.KindPullSecret), pullSource))
		h.ctrl.cfg.Prune = false
		_ = h.ctrl.syncNamespace(context.Background(), ns)
		if w := h.allWrites(); len(w) > 0 {
			t.Errorf("writes = %v", w)
		}
	})
}
