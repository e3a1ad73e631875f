package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raysync/raysync/internal/kuberay"
)

// These tests pin down what stock KubeRay does with token auth, without raysync running.
// raysync is built on these facts; if a KubeRay release changes them, these fail first.

func TestKubeRayGeneratedAuthSecret(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		// KubeRay accepts names of at most 53 characters that are DNS-1035 labels (so never a leading
		// digit); CheckName's digit and punctuation rules apply to what is left after keeping the last 50.
		for name, clusterName := range map[string]string{
			"normal":                  "facts-normal",
			"53 chars, hyphen at cut": "fac-" + strings.Repeat("x", 49),
			"52 chars, digit at cut":  "fa1" + strings.Repeat("y", 49),
			"51 chars, letter at cut": "fz" + strings.Repeat("z", 49),
		} {
			t.Run(name, func(t *testing.T) {
				env := env.With(t)
				rc := env.CreateRayCluster(rayCluster(ns, clusterName))
				secretName := kuberay.CheckName(clusterName)
				if name != "normal" && len(secretName) != 50 {
					t.Fatalf("test case does not exercise CheckName: %q", clusterName)
				}
				s := env.WaitSecret(ns, secretName, 30*time.Second, nil)
				if len(s.Data[kuberay.AuthTokenKey]) != 44 || len(s.Data) != 1 {
					t.Errorf("generated Secret: want one key auth_token of 44 bytes, got %s", describeSecret(s))
				}
				if s.Labels[kuberay.ClusterLabel] != clusterName {
					t.Errorf("label %s = %q, want %q", kuberay.ClusterLabel, s.Labels[kuberay.ClusterLabel], clusterName)
				}
				owner := metav1.GetControllerOf(s)
				if owner == nil || owner.UID != rc.GetUID() || owner.Kind != "RayCluster" || owner.BlockOwnerDeletion == nil || !*owner.BlockOwnerDeletion {
					t.Errorf("want controller ownerReference to RayCluster %s with blockOwnerDeletion, got %+v", rc.GetUID(), s.OwnerReferences)
				}
				// Head and worker pods read RAY_AUTH_TOKEN from that Secret.
				pods := env.WaitPods(ns, clusterName, 2, 30*time.Second)
				for _, p := range pods {
					for _, c := range p.Spec.Containers {
						if ref, key := authTokenSecretRef(c); ref != secretName || key != kuberay.AuthTokenKey {
							t.Errorf("pod %s container %s: RAY_AUTH_TOKEN from %q/%q, want %q/auth_token", p.Name, c.Name, ref, key, secretName)
						}
					}
				}
			})
		}
	})
}

func TestKubeRayRejectsNamesRaysyncSkips(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		for _, name := range []string{strings.Repeat("n", 54), "x" + strings.Repeat("1", 62)} {
			if kuberay.ValidClusterName(name) {
				t.Fatalf("ValidClusterName(%q) = true", name)
			}
			env.CreateRayCluster(rayCluster(ns, name))
		}
		env.CreateRayCluster(rayCluster(ns, "marker"))
		env.WaitPods(ns, "marker", 2, 30*time.Second)
		l, err := env.Kube.CoreV1().Secrets(ns).List(env.ctx, metav1.ListOptions{LabelSelector: kuberay.ClusterLabel})
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Items) != 1 || l.Items[0].Name != "marker" {
			t.Errorf("KubeRay created auth Secrets for invalid names: %d Secrets", len(l.Items))
		}
	})
}

func TestKubeRayUsesPreexistingSecretAsIs(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		pre := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "facts-pre", Namespace: ns},
			Data:       map[string][]byte{kuberay.AuthTokenKey: []byte("preexisting-token-for-facts-test")},
		}
		created, err := env.Kube.CoreV1().Secrets(ns).Create(env.ctx, pre, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		env.CreateRayCluster(rayCluster(ns, "facts-pre"))
		env.WaitPods(ns, "facts-pre", 2, 30*time.Second)
		s, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, "facts-pre", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if string(s.Data[kuberay.AuthTokenKey]) != "preexisting-token-for-facts-test" || len(s.OwnerReferences) != 0 || s.ResourceVersion != created.ResourceVersion {
			t.Errorf("KubeRay changed a pre-existing Secret: %s", describeSecret(s))
		}
	})
}

func TestKubeRayAuthSecretGarbageCollected(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ns := env.Namespace()
		env.CreateRayCluster(rayCluster(ns, "facts-gc"))
		env.WaitSecret(ns, "facts-gc", 30*time.Second, nil)
		if err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Delete(env.ctx, "facts-gc", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		env.WaitSecretGone(ns, "facts-gc", 30*time.Second)
	})
}

func TestKubeRaySecretNameCreatesNoSecret(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		if !env.SupportsSecretName() {
			t.Skip("authOptions.secretName needs KubeRay v1.6+")
		}
		ns := env.Namespace()
		env.CreateRayCluster(rayCluster(ns, "facts-ref", withSecretName("shared-token")))
		pods := env.WaitPods(ns, "facts-ref", 2, 30*time.Second)
		for _, p := range pods {
			if ref, _ := authTokenSecretRef(p.Spec.Containers[0]); ref != "shared-token" {
				t.Errorf("pod %s reads RAY_AUTH_TOKEN from %q, want shared-token", p.Name, ref)
			}
		}
		for _, n := range []string{"facts-ref", "shared-token"} {
			if _, err := env.Kube.CoreV1().Secrets(ns).Get(env.ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Secret %s: want NotFound, got %v", n, err)
			}
		}
		if env.ControlPlane.Ray != nil {
			// So the kubelet cannot create the Ray containers.
			for _, p := range pods {
				env.WaitPod(ns, p.Name, 30*time.Second, "in CreateContainerConfigError", func(p *corev1.Pod) bool {
					return anyWaiting(p, "CreateContainerConfigError")
				})
			}
		}
	})
}
