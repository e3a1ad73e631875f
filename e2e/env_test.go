package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// Env is one test's view of one control plane.
type Env struct {
	*framework.ControlPlane
	t   *testing.T
	ctx context.Context
	// secrets are values that must never appear in raysync's output (see Secret).
	secrets []string
	// lastKubeconfig, lastRelease and lastName: the ServiceAccount kubeconfig, release namespace and
	// install name of the last StartSyncerUnderChart, to start more replicas of that install.
	lastKubeconfig, lastRelease, lastName string
}

func newEnv(t *testing.T, cp *framework.ControlPlane) *Env {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	return &Env{ControlPlane: cp, t: t, ctx: ctx}
}

// With returns the same environment bound to a subtest.
func (e *Env) With(t *testing.T) *Env {
	c := *e
	c.t = t
	return &c
}

// Namespace creates a namespace of the test's own, deleted when the test ends.
func (e *Env) Namespace() string {
	e.t.Helper()
	return e.NamespaceAnnotated(nil)
}

// NamespaceWithoutKubelet creates a namespace whose pods the kubelet stand-in never starts: they
// stay Pending and unbound, for tests about templates and never-started pods.
func (e *Env) NamespaceWithoutKubelet() string {
	e.t.Helper()
	return e.NamespaceAnnotated(map[string]string{framework.StandInStart: "never"})
}

// NamespaceAnnotated creates a namespace with annotations (e.g. the stand-in's start delay).
func (e *Env) NamespaceAnnotated(annotations map[string]string) string {
	e.t.Helper()
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	name := "e2e-" + hex.EncodeToString(b)
	_, err := e.Kube.CoreV1().Namespaces().Create(e.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
		Labels: map[string]string{"raysync.dev/e2e": "true"}, Annotations: annotations}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create namespace: %v", err)
	}
	e.t.Cleanup(func() {
		_ = e.Kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// SupportsSecretName reports whether the installed RayCluster CRD has authOptions.secretName (KubeRay
// v1.6+). A v1.6+ operator whose CRD lacks it fails the test: the harness installed the wrong CRDs, and
// the tests that skip without it would pass on both versions while testing nothing.
func (e *Env) SupportsSecretName() bool {
	return e.requireOnV16(e.crdHasField("spec", "properties", "authOptions", "properties", "secretName"), "authOptions.secretName")
}

// SupportsUpgradeStrategy reports whether the RayCluster CRD has spec.upgradeStrategy (KubeRay v1.6+),
// failing the test as SupportsSecretName does.
func (e *Env) SupportsUpgradeStrategy() bool {
	return e.requireOnV16(e.crdHasField("spec", "properties", "upgradeStrategy"), "spec.upgradeStrategy")
}

func (e *Env) requireOnV16(has bool, field string) bool {
	e.t.Helper()
	if !has && e.KubeRayVersion != "" && !strings.HasPrefix(e.KubeRayVersion, "v1.5.") {
		e.t.Fatalf("KubeRay %s's RayCluster CRD has no %s: the harness installed another version's CRDs", e.KubeRayVersion, field)
	}
	return has
}

func (e *Env) crdHasField(path ...string) bool {
	e.t.Helper()
	crd, err := e.Dynamic.Resource(framework.CRDGVR).Get(e.ctx, "rayclusters.ray.io", metav1.GetOptions{})
	if err != nil {
		e.t.Fatalf("get CRD: %v", err)
	}
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	for _, v := range versions {
		if _, found, _ := unstructured.NestedFieldNoCopy(v.(map[string]any), append([]string{"schema", "openAPIV3Schema", "properties"}, path...)...); found {
			return true
		}
	}
	return false
}

func (e *Env) CreateRayCluster(obj *unstructured.Unstructured) *unstructured.Unstructured {
	e.t.Helper()
	out, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(obj.GetNamespace()).Create(e.ctx, obj, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create RayCluster %s: %v", obj.GetName(), err)
	}
	return out
}

// WaitSecret waits until the Secret exists and cond (if any) holds.
func (e *Env) WaitSecret(ns, name string, timeout time.Duration, cond func(*corev1.Secret) bool) *corev1.Secret {
	e.t.Helper()
	var got *corev1.Secret
	err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		s, err := e.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got = s
		return cond == nil || cond(s), nil
	})
	if err != nil {
		e.t.Fatalf("Secret %s/%s: condition not met within %s (last seen: %s)", ns, name, timeout, describeSecret(got))
	}
	return got
}

// WaitGone waits until the Secret no longer exists.
func (e *Env) WaitSecretGone(ns, name string, timeout time.Duration) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := e.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		e.t.Fatalf("Secret %s/%s still exists after %s", ns, name, timeout)
	}
}

// WaitPods waits until the cluster has at least n Pod objects and returns them.
func (e *Env) WaitPods(ns, cluster string, n int, timeout time.Duration) []corev1.Pod {
	e.t.Helper()
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		l, err := e.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + cluster})
		if err != nil {
			return false, nil
		}
		pods = l.Items
		return len(pods) >= n, nil
	})
	if err != nil {
		e.t.Fatalf("cluster %s/%s: want %d pods, have %d after %s", ns, cluster, n, len(pods), timeout)
	}
	return pods
}

// describeSecret names a Secret's shape for failure messages, never its values.
func describeSecret(s *corev1.Secret) string {
	if s == nil {
		return "<none>"
	}
	var keys []string
	for k, v := range s.Data {
		keys = append(keys, fmt.Sprintf("%s(%d bytes)", k, len(v)))
	}
	return fmt.Sprintf("keys=[%s] labels=%v annotations=%v owners=%d", strings.Join(keys, ","), s.Labels, s.Annotations, len(s.OwnerReferences))
}

// rayCluster builds a minimal token-auth RayCluster (one head, one worker) as KubeRay v1.5.1+ accepts it.
func rayCluster(ns, name string, mutate ...any) *unstructured.Unstructured {
	spec := map[string]any{
		"rayVersion":  "2.52.0",
		"authOptions": map[string]any{"mode": "token"},
		"headGroupSpec": map[string]any{
			"rayStartParams": map[string]any{},
			"template": map[string]any{"spec": map[string]any{"containers": []any{
				map[string]any{"name": "ray-head", "image": "rayproject/ray:2.52.0"},
			}}},
		},
		"workerGroupSpecs": []any{map[string]any{
			"groupName": "workers", "replicas": int64(1), "minReplicas": int64(0), "maxReplicas": int64(3),
			"rayStartParams": map[string]any{},
			"template": map[string]any{"spec": map[string]any{"containers": []any{
				map[string]any{"name": "ray-worker", "image": "rayproject/ray:2.52.0"},
			}}},
		}},
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayCluster",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     spec,
	}}
	for _, m := range mutate {
		switch m := m.(type) {
		case func(map[string]any):
			m(spec)
		case func(*unstructured.Unstructured):
			m(u)
		}
	}
	return u
}

func withSecretName(name string) func(map[string]any) {
	return func(spec map[string]any) { spec["authOptions"].(map[string]any)["secretName"] = name }
}

// authTokenSecretRef returns the Secret name a container's RAY_AUTH_TOKEN comes from ("" if none).
func authTokenSecretRef(c corev1.Container) (name, key string) {
	for _, e := range c.Env {
		if e.Name == "RAY_AUTH_TOKEN" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			name, key = e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	return name, key
}

// withLabels labels a RayCluster built by rayCluster.
func withLabels(l map[string]string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { u.SetLabels(l) }
}

// serveConfig is a RayService's Serve application; the stand-in's head deploys it.
const serveConfig = `applications:
  - name: fruit
    route_prefix: /fruit
    import_path: fruit.deployment_graph
    deployments:
      - name: MangoStand
`

// rayService builds a RayService whose clusters use token auth and serve one application; old
// clusters go 3 s after a switch.
func rayService(ns, name, version string) *unstructured.Unstructured {
	spec := rayCluster(ns, "unused").Object["spec"]
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayService",
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": map[string]any{"version": version}},
		"spec": map[string]any{
			"rayClusterDeletionDelaySeconds": int64(3),
			"serveConfigV2":                  serveConfig,
			"rayClusterConfig":               spec,
		},
	}}
}

// withPrivateImage makes every Ray container pull from the private registry: the stand-in pulls
// it only for pods whose imagePullSecrets hold credentials for it.
func withPrivateImage(spec map[string]any) {
	templates := []map[string]any{spec["headGroupSpec"].(map[string]any)}
	for _, g := range spec["workerGroupSpecs"].([]any) {
		templates = append(templates, g.(map[string]any))
	}
	for _, t := range templates {
		for _, c := range t["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any) {
			c.(map[string]any)["image"] = framework.PrivateRegistry + "/ml/ray:2.52.0"
		}
	}
}

// WaitServiceClusters waits until the RayService has at least n clusters matching keep (nil keeps all).
func (e *Env) WaitServiceClusters(ns, svc string, n int, keep func(*unstructured.Unstructured) bool) []*unstructured.Unstructured {
	e.t.Helper()
	var out []*unstructured.Unstructured
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/originated-from-cr-name=" + svc})
		if err != nil {
			return false, nil
		}
		out = out[:0]
		for i := range l.Items {
			if keep == nil || keep(&l.Items[i]) {
				out = append(out, &l.Items[i])
			}
		}
		return len(out) >= n, nil
	})
	if err != nil {
		e.t.Fatalf("RayService %s/%s: want %d clusters, have %d", ns, svc, n, len(out))
	}
	return out
}

func (e *Env) PatchRayService(ns, name, mergePatch string) {
	e.t.Helper()
	if _, err := e.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Patch(e.ctx, name, types.MergePatchType, []byte(mergePatch), metav1.PatchOptions{}); err != nil {
		e.t.Fatalf("patch RayService %s: %v", name, err)
	}
}

func (e *Env) DeleteRayCluster(ns, name string) {
	e.t.Helper()
	if err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatalf("delete RayCluster %s: %v", name, err)
	}
}

// secretListRV is a resourceVersion to start a watch from "now".
func (e *Env) secretListRV(ns string) string {
	e.t.Helper()
	l, err := e.Kube.CoreV1().Secrets(ns).List(e.ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.ResourceVersion
}

// Consistently checks f every 200 ms for d and fails the test at the first error: a "never" claim
// looked at over its window, not once.
func (e *Env) Consistently(d time.Duration, f func() error) {
	e.t.Helper()
	for end := time.Now().Add(d); ; time.Sleep(200 * time.Millisecond) {
		if err := f(); err != nil {
			e.t.Fatalf("within %s: %v", d, err)
		}
		if time.Now().After(end) {
			return
		}
	}
}

// secretChangesSince replays every change to Secrets of ns since resourceVersion rv (a watch from rv
// delivers each one, in order, as long as etcd has not compacted them away: minutes) and returns them as
// "TYPE name", those of the named Secrets only when names are given. It ends at a marker Secret it
// writes itself, so every change before the call is in. A test claiming nothing was written over a
// window checks the whole window this way, not one look at its end.
func (e *Env) secretChangesSince(ns, rv string, names ...string) []string {
	e.t.Helper()
	w, err := e.Kube.CoreV1().Secrets(ns).Watch(e.ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Stop()
	marker, err := e.Kube.CoreV1().Secrets(ns).Create(e.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{GenerateName: "window-end-"}}, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() {
		_ = e.Kube.CoreV1().Secrets(ns).Delete(context.Background(), marker.Name, metav1.DeleteOptions{})
	}()
	var changes []string
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				e.t.Fatal("the watch replaying the window ended early")
			}
			if ev.Type == watch.Error {
				e.t.Fatalf("the watch replaying the window: %v (compacted?)", ev.Object)
			}
			s, ok := ev.Object.(*corev1.Secret)
			if !ok {
				continue
			}
			if s.Name == marker.Name {
				return changes
			}
			if len(names) == 0 || slices.Contains(names, s.Name) {
				changes = append(changes, string(ev.Type)+" "+s.Name)
			}
		case <-timeout:
			e.t.Fatal("the watch replaying the window never delivered its end marker")
		}
	}
}

// WaitEventMessage waits for an Event from raysync with reason on object whose message contains substr.
func (e *Env) WaitEventMessage(ns, object, reason string, timeout time.Duration, substr string) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		for _, ev := range e.Events(ns, "raysync", reason) {
			if ev.InvolvedObject.Name == object && strings.Contains(ev.Message, substr) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		e.t.Fatalf("no %s Event on %s/%s mentioning %q within %s", reason, ns, object, substr, timeout)
	}
}

func retryOnConflict(e *Env, f func() error) error {
	var err error
	for i := 0; i < 10; i++ {
		if err = f(); !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}
