package e2e

import (
	"context"
	"regexp"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// The black-box case: a RayService's cluster serves on the current canonical token; its generated
// Secret is deleted; KubeRay re-creates it with a random token. raysync recorded on the RayCluster
// which rotation its containers run on (a number, never the token's digest), so it puts the canonical
// token back and new pods join the cluster: the controller by writing KubeRay's re-created Secret, the
// webhook by creating raysync's own before KubeRay's create goes on. The record survives KubeRay
// re-writing the cluster's annotations (a worker group appended to the RayService): raysync records it
// again.
func TestDeletedSecretUnderTheCurrentTokenIsPutBack(t *testing.T) {
	eachKubeRay(t, func(t *testing.T, env *Env) {
		for _, webhook := range []bool{false, true} {
			mode := map[bool]string{false: "controller", true: "webhook"}[webhook]
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				env := env.With(t)
				ray := env.StandIn()
				// Containers start 1.5 s after their pod, as kubelets do with an image to pull: when
				// KubeRay's Secret wins the race and raysync writes the token into it, a container that
				// started in the second of that write may hold KubeRay's token, and raysync, unable to
				// tell, would rightly report the Secret missing instead.
				ns, token := env.NamespaceAnnotated(map[string]string{framework.StandInStartDelay: "1500ms"}), env.NewToken()
				env.PutSource(ns, "ray-token", tokenData(token))
				args := []string{"--auth-source=" + ns + "/ray-token", "--namespaces=" + ns}
				if webhook {
					args = append(append(args, "--precreate-auth-secrets=false"), env.webhookFor(ns, ns)...)
				}
				s := env.StartSyncer(args...)
				if webhook {
					env.waitCABundle(args)
				}
				if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, "serve", "v1"), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				cluster := env.WaitServiceClusters(ns, "serve", 1, nil)[0].GetName()
				name := kuberay.CheckName(cluster)
				env.WaitSecret(ns, name, 30*time.Second, holds(token))
				env.WaitRayServiceReady(ns, "serve", 120*time.Second, func(active string) bool { return active == cluster })
				if !env.waitRecord(ns, cluster, "1") {
					t.Error("no record of the token on the RayCluster") // and the Secret cannot come back below
				}

				// Delete once the second of the last container start is over: KubeRay's re-created
				// Secret carries the second of its creation, and a container started in that second
				// may have read it (CI saw a worker start in the second of the delete: raysync, rightly,
				// kept the Secret it could not tell from the token its containers run on).
				env.waitForNextSecond(env.WaitPodsReady(ns, kuberay.ClusterLabel+"="+cluster, 2, 60*time.Second))
				sec, took, refused := env.deleteUnderOperator(ray, ns, cluster, token, 0)
				t.Logf("MEASURE secret-restored kuberay=%s mode=%s delete_to_canonical_ms=%d", env.KubeRayVersion, mode, took.Milliseconds())
				if webhook && refused != 0 {
					t.Errorf("the operator's calls were refused %d times: with the webhook, KubeRay's random token never reaches its Secret", refused)
				}
				env.WaitEvent(ns, cluster, "TokenRestored", 10*time.Second)
				if webhook {
					// KubeRay's create never went through (raysync's controller or its webhook created the
					// Secret first): the Secret is raysync's own.
					if len(sec.ManagedFields) != 1 || sec.ManagedFields[0].Manager != "raysync" {
						t.Errorf("the re-created Secret was written by %v, want raysync's create only", managers(sec.ManagedFields))
					}
				}
				s.WaitMetric("raysync_target_in_sync", map[string]string{"namespace": ns, "raycluster": cluster}, 1, 10*time.Second)
				env.assertNewWorkerJoins(ns, cluster)

				if !webhook {
					// KubeRay re-writes a generated cluster's labels and annotations when worker groups
					// are appended to its RayService: the record goes, and raysync writes it again.
					env.appendWorkerGroup(ns, "serve")
					env.waitAnnotation(ns, cluster, "ray.io/num-worker-groups", "2")
					if !env.waitRecord(ns, cluster, "1") {
						t.Fatal("the record was not written again after KubeRay re-wrote the cluster's annotations")
					}
					_, _, refused = env.deleteUnderOperator(ray, ns, cluster, token, refused)
					env.assertNewWorkerJoins(ns, cluster)
				}
				env.assertServesFrom(ns, "serve", cluster)
				env.AssertStartedWith(ns, token, cluster)
				if st, err := ray.Stats(env.ctx, ns, cluster); err != nil {
					t.Fatal(err)
				} else if op := st.Requests["operator"]; op.Rejected() != refused || st.JoinFailures != 0 {
					t.Errorf("cluster %s: operator requests %+v (%d refused while a Secret was re-created), %d GCS join failures", cluster, op, refused, st.JoinFailures)
				}
			})
		}
	})
}

// deleteUnderOperator deletes a cluster's token Secret, waits until it holds token again, and then
// until the KubeRay operator's calls to the head are accepted again. In controller mode KubeRay
// re-creates the Secret with a random token and raysync writes the token into it right after; the
// operator, which reads the Secret from its cache on every reconcile, may call the head with the
// random token in that window (CI saw 2 refusals). It returns the Secret, the time from the delete to
// the restored Secret, and the operator's calls the head refused since the cluster started; refusals
// beyond refusedSoFar before the delete fail the test.
func (e *Env) deleteUnderOperator(ray *framework.RayStandIn, ns, cluster, token string, refusedSoFar int) (*corev1.Secret, time.Duration, int) {
	e.t.Helper()
	operator := func() standin.RequestCounts {
		st, err := ray.Stats(e.ctx, ns, cluster)
		if err != nil {
			e.t.Fatal(err)
		}
		return st.Requests[standin.CallerOperator]
	}
	before := operator()
	if before.Rejected() != refusedSoFar {
		e.t.Errorf("cluster %s: the operator's calls were refused before the Secret was deleted: %+v", cluster, before)
	}
	name := kuberay.CheckName(cluster)
	start := time.Now()
	deleted := e.deleteSecret(ns, name)
	sec := e.WaitSecret(ns, name, 30*time.Second, func(s *corev1.Secret) bool { return s.UID != deleted && holds(token)(s) })
	took := time.Since(start)
	// Two calls accepted after the restore: the operator's cache holds the token again (one could
	// have been sent before the delete and answered after the restore).
	restored := operator()
	var now standin.RequestCounts
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		now = operator()
		return now.Accepted >= restored.Accepted+2, nil
	})
	if err != nil {
		e.t.Fatalf("cluster %s: the operator's calls were not accepted again after the Secret was restored: %+v", cluster, now)
	}
	return sec, took, now.Rejected()
}

// waitRecord waits until the RayCluster records rotation (a bare number: the record never carries a
// digest of the token), and says whether it did.
func (e *Env) waitRecord(ns, cluster, rotation string) bool {
	e.t.Helper()
	var a map[string]string
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		rc, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(ctx, cluster, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		a = rc.GetAnnotations()
		return a["raysync.dev/token-rotation"] == rotation && a["raysync.dev/token-written-at"] != "", nil
	})
	if err != nil {
		e.t.Logf("RayCluster %s/%s: no record of rotation %s (annotations %v)", ns, cluster, rotation, a)
		return false
	}
	if !regexp.MustCompile(`^[0-9]+$`).MatchString(a["raysync.dev/token-rotation"]) {
		e.t.Errorf("the record is not a bare rotation number: %q", a["raysync.dev/token-rotation"])
	}
	return true
}

// waitAnnotation waits until a RayCluster carries annotation key=value.
func (e *Env) waitAnnotation(ns, cluster, key, value string) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		rc, err := e.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Get(ctx, cluster, metav1.GetOptions{})
		return err == nil && rc.GetAnnotations()[key] == value, nil
	})
	if err != nil {
		e.t.Fatalf("RayCluster %s/%s: annotation %s never became %q", ns, cluster, key, value)
	}
}

// deleteSecret deletes a Secret and returns its UID.
func (e *Env) deleteSecret(ns, name string) types.UID {
	e.t.Helper()
	s, err := e.Kube.CoreV1().Secrets(ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.Kube.CoreV1().Secrets(ns).Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	return s.UID
}

// assertNewWorkerJoins deletes the cluster's worker pods and waits until KubeRay's new ones are Ready
// (a worker that read a token the head refuses never joins).
// It returns once the second of their start is over: a Secret re-created in that very second could
// have been read by them, and raysync could not tell.
func (e *Env) assertNewWorkerJoins(ns, cluster string) {
	e.t.Helper()
	pods := e.WaitPodsReady(ns, kuberay.ClusterLabel+"="+cluster, 2, 60*time.Second)
	for _, p := range pods {
		if p.Labels[kuberay.NodeTypeLabel] == "worker" {
			if err := e.Kube.CoreV1().Pods(ns).Delete(e.ctx, p.Name, metav1.DeleteOptions{}); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	e.waitForNextSecond(e.waitFreshPods(ns, cluster, 2, podUIDs(pods)))
}

// appendWorkerGroup adds a worker group at the end of a RayService's cluster spec: KubeRay updates
// its cluster in place, labels and annotations included.
func (e *Env) appendWorkerGroup(ns, svc string) {
	e.t.Helper()
	err := retryOnConflict(e, func() error {
		rs, err := e.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Get(e.ctx, svc, metav1.GetOptions{})
		if err != nil {
			return err
		}
		groups, _, _ := unstructured.NestedSlice(rs.Object, "spec", "rayClusterConfig", "workerGroupSpecs")
		extra := rayCluster(ns, "unused").Object["spec"].(map[string]any)["workerGroupSpecs"].([]any)[0].(map[string]any)
		extra["groupName"], extra["replicas"] = "more", int64(0)
		if err := unstructured.SetNestedSlice(rs.Object, append(groups, extra), "spec", "rayClusterConfig", "workerGroupSpecs"); err != nil {
			return err
		}
		_, err = e.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Update(e.ctx, rs, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		e.t.Fatalf("append a worker group to RayService %s: %v", svc, err)
	}
}
