package e2e

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// These tests pin down the kubelet and Ray stand-in itself, on the real API server: other tests
// trust it to refuse a wrong token and to block a container whose Secret is missing.

// TestStandInRunsKubeRayClusters: without raysync, KubeRay's pods are bound, get pod IPs from the
// benchmarking range, become Ready with endpoints, start with the generated Secret's token, and
// the head answers with Ray's HTTP auth through its KubeRay-made Service.
func TestStandInRunsKubeRayClusters(t *testing.T) {
	t.Parallel() // with the other Ray-in-the-loop tests, after the serial ones: each in namespaces of its own
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ray := env.StandIn()
		ns := env.Namespace()
		env.CreateRayCluster(rayCluster(ns, "plain"))
		pods := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=plain", 2, 60*time.Second)
		token := env.secretToken(ns, "plain")
		podRange := netip.MustParsePrefix("198.19.0.0/16")
		var head corev1.Pod
		for _, p := range pods {
			ip, err := netip.ParseAddr(p.Status.PodIP)
			if p.Spec.NodeName != "standin" || err != nil || !podRange.Contains(ip) || p.Status.HostIP != "198.18.0.1" {
				t.Errorf("pod %s: node %q, pod IP %q, host IP %q", p.Name, p.Spec.NodeName, p.Status.PodIP, p.Status.HostIP)
			}
			if p.Labels[kuberay.NodeTypeLabel] == "head" {
				head = p
			}
		}
		env.AssertStartedWith(ns, token, "plain")

		// The EndpointSlice controller lists the head as a ready endpoint of its Service.
		err := wait.PollUntilContextTimeout(env.ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			l, err := env.Kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=plain-head-svc"})
			if err != nil {
				return false, nil
			}
			for _, s := range l.Items {
				for _, ep := range s.Endpoints {
					if ep.TargetRef != nil && ep.TargetRef.UID == head.UID && ep.Conditions.Ready != nil && *ep.Conditions.Ready && ep.Addresses[0] == head.Status.PodIP {
						return true, nil
					}
				}
			}
			return false, nil
		})
		if err != nil {
			t.Error("no ready EndpointSlice endpoint for the head pod")
		}

		url := headURL(ns, "plain-head-svc") + "/api/jobs/"
		for name, c := range map[string]struct {
			headers map[string]string
			want    int
		}{
			"no token":                        {nil, http.StatusUnauthorized},
			"wrong token":                     {map[string]string{"Authorization": "Bearer wrong-" + token}, http.StatusForbidden},
			"Authorization: Bearer":           {map[string]string{"Authorization": "Bearer " + token}, http.StatusOK},
			"X-Ray-Authorization":             {map[string]string{"X-Ray-Authorization": "Bearer " + token}, http.StatusOK},
			"cookie":                          {map[string]string{"Cookie": "ray-authentication-token=" + token}, http.StatusOK},
			"Authorization read before X-Ray": {map[string]string{"Authorization": "Bearer wrong", "X-Ray-Authorization": "Bearer " + token}, http.StatusForbidden},
		} {
			if got := env.rayGet(url, c.headers); got != c.want {
				t.Errorf("%s: HTTP %d, want %d", name, got, c.want)
			}
		}
		st, err := ray.Stats(env.ctx, ns, "plain")
		if err != nil {
			t.Fatal(err)
		}
		if c := st.Requests["client"]; c.Accepted != 3 || c.Unauthenticated != 1 || c.Forbidden != 2 {
			t.Errorf("client requests: %+v", c)
		}
		if w := st.Requests["worker"]; w.Accepted < 2 || w.Rejected() != 0 || st.JoinFailures != 0 {
			t.Errorf("the worker's wait-gcs-ready and raylet should have joined once each: %+v, %d failures", w, st.JoinFailures)
		}
	})
}

// rawRayPod is a pod shaped like KubeRay's Ray pods, made by the test itself: the Ray container
// first, token auth, RAY_AUTH_TOKEN from secret (optional or not).
func rawRayPod(ns, name, nodeType, cluster, secret string, optional bool) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{kuberay.ClusterLabel: cluster, kuberay.NodeTypeLabel: nodeType}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "ray-" + nodeType, Image: "rayproject/ray:2.52.0",
			Env: []corev1.EnvVar{{Name: "RAY_AUTH_MODE", Value: "token"}, {Name: "RAY_AUTH_TOKEN", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: "auth_token", Optional: &optional}}}},
		}}},
	}
}

func (e *Env) createPod(p *corev1.Pod) {
	e.t.Helper()
	if _, err := e.Kube.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestStandInKubeletSemantics drives the stand-in with pods the test makes itself.
func TestStandInKubeletSemantics(t *testing.T) {
	t.Parallel() // with the other Ray-in-the-loop tests, after the serial ones: each in namespaces of its own
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ray := env.StandIn()
		ns := env.Namespace()
		tokenA, tokenB := env.NewToken(), env.NewToken()
		env.PutSecret(ns, "head-token", corev1.SecretTypeOpaque, tokenData(tokenA))

		t.Run("a missing Secret or key blocks the container, an optional one does not", func(t *testing.T) {
			env := env.With(t)
			env.createPod(rawRayPod(ns, "blocked", "head", "missing", "not-yet", false))
			noKey := rawRayPod(ns, "no-key", "head", "no-key", "head-token", false)
			noKey.Spec.Containers[0].Env[1].ValueFrom.SecretKeyRef.Key = "token"
			env.createPod(noKey)
			env.createPod(rawRayPod(ns, "optional", "head", "optional", "never", true))
			for _, name := range []string{"blocked", "no-key"} {
				env.WaitPod(ns, name, 30*time.Second, "in CreateContainerConfigError", func(p *corev1.Pod) bool {
					return p.Status.Phase == corev1.PodPending && containerWaiting(p, "ray-head") == "CreateContainerConfigError"
				})
			}
			// Token auth without a token: Ray refuses to start (the container fails), but it was created.
			env.WaitPod(ns, "optional", 30*time.Second, "created without the optional variable", func(p *corev1.Pod) bool {
				return restartCount(p, "ray-head") >= 1
			})
			env.PutSecret(ns, "not-yet", corev1.SecretTypeOpaque, tokenData(tokenB))
			env.WaitPodsReady(ns, kuberay.ClusterLabel+"=missing", 1, 30*time.Second)
		})

		t.Run("env is resolved once, when the container is created", func(t *testing.T) {
			env := env.With(t)
			env.createPod(rawRayPod(ns, "head", "head", "raw", "head-token", false))
			head := env.WaitPodsReady(ns, kuberay.ClusterLabel+"=raw", 1, 30*time.Second)[0]
			env.PutSecret(ns, "head-token", corev1.SecretTypeOpaque, tokenData(tokenB))
			url := "http://" + head.Status.PodIP + ":8265/api/jobs/"
			// A request with the new value is refused: the running head still has the old one.
			if got := env.rayGet(url, map[string]string{"Authorization": "Bearer " + tokenB}); got != http.StatusForbidden {
				t.Errorf("the Secret's new value: HTTP %d, want 403", got)
			}
			if got := env.rayGet(url, map[string]string{"Authorization": "Bearer " + tokenA}); got != http.StatusOK {
				t.Errorf("the value the head started with: HTTP %d, want 200", got)
			}
			tokens, err := ray.ContainerTokens(env.ctx, ns, "head")
			if err != nil {
				t.Fatal(err)
			}
			if tokens["ray-head"] != ray.Fingerprint(tokenA) {
				t.Error("the running head's token changed with its Secret")
			}
		})

		t.Run("a worker with another token than its head's restarts with back-off", func(t *testing.T) {
			env := env.With(t)
			env.PutSecret(ns, "worker-token", corev1.SecretTypeOpaque, tokenData(env.NewToken()))
			env.createPod(rawRayPod(ns, "worker", "worker", "raw", "worker-token", false))
			env.WaitPod(ns, "worker", 60*time.Second, "restarted twice", func(p *corev1.Pod) bool {
				return restartCount(p, "ray-worker") >= 2 && p.Status.ContainerStatuses[0].LastTerminationState.Terminated != nil
			})
			st, err := ray.Stats(env.ctx, ns, "raw")
			if err != nil {
				t.Fatal(err)
			}
			if st.JoinFailures < 2 || st.Restarts < 2 {
				t.Errorf("stats: %d join failures, %d restarts", st.JoinFailures, st.Restarts)
			}
			var starts []time.Time
			all, _ := ray.Starts(env.ctx, ns)
			for _, s := range all {
				if s.Pod == "worker" {
					starts = append(starts, s.StartedAt)
				}
			}
			if len(starts) < 3 || starts[2].Sub(starts[1]) <= starts[1].Sub(starts[0]) {
				t.Errorf("restarts do not back off: %d starts", len(starts))
			}
			// A restarted container resolves its env again: with the head's token, it joins.
			env.PutSecret(ns, "worker-token", corev1.SecretTypeOpaque, tokenData(tokenA))
			env.WaitPod(ns, "worker", 60*time.Second, "Ready", podReady)
			tokens, _ := ray.ContainerTokens(env.ctx, ns, "worker")
			if tokens["ray-worker"] != ray.Fingerprint(tokenA) {
				t.Error("the restarted worker did not start with the Secret's new value")
			}
		})

		t.Run("private registry images need pull credentials", func(t *testing.T) {
			env := env.With(t)
			env.PutSecret(ns, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
			private := func(name string, pullSecrets ...string) *corev1.Pod {
				p := rawRayPod(ns, name, "head", name, "head-token", false)
				p.Spec.Containers[0].Image = framework.PrivateRegistry + "/ml/ray:2.52.0"
				for _, s := range pullSecrets {
					p.Spec.ImagePullSecrets = append(p.Spec.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
				}
				return p
			}
			env.createPod(private("no-creds"))
			env.createPod(private("with-creds", "regcred"))
			env.WaitPod(ns, "no-creds", 30*time.Second, "failing to pull", func(p *corev1.Pod) bool {
				return p.Spec.NodeName != "" && pullFailing(p)
			})
			env.WaitPod(ns, "with-creds", 30*time.Second, "Ready", podReady)
		})

		t.Run("a namespace annotated start=never keeps its pods Pending", func(t *testing.T) {
			env := env.With(t)
			never := env.NamespaceWithoutKubelet()
			env.createPod(rawRayPod(never, "idle", "head", "idle", "x", true))
			env.createPod(rawRayPod(ns, "after", "head", "after", "head-token", false))
			env.WaitPod(ns, "after", 30*time.Second, "Ready", podReady) // created later, started
			p, err := env.Kube.CoreV1().Pods(never).Get(env.ctx, "idle", metav1.GetOptions{})
			if err != nil || p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending || len(p.Status.ContainerStatuses) != 0 {
				t.Errorf("pod in a start=never namespace: %v %s", err, describePods([]corev1.Pod{derefPod(p)}))
			}
		})
	})
}
