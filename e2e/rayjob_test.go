package e2e

import (
	"context"
	"fmt"
	corev1 "k8s.io/api/core/v1"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/standin"
	"github.com/raysync/raysync/internal/kuberay"
)

// rayJob builds a RayJob on a token-auth cluster like rayCluster's, submitted in mode.
func rayJob(ns, name, mode string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ray.io/v1", "kind": "RayJob",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"entrypoint":     `python -c "print('hello from ray')"`,
			"submissionMode": mode,
			"rayClusterSpec": rayCluster(ns, "unused").Object["spec"],
		},
	}}
}

// TestRayJobRunsWithTheCanonicalToken: with raysync running, a RayJob runs to completion in HTTP
// mode (the operator submits and polls with the Secret's token) and in K8s-Job mode (a submitter
// pod presents its own RAY_AUTH_TOKEN to the head), every Ray process on the canonical token.
func TestRayJobRunsWithTheCanonicalToken(t *testing.T) {
	t.Parallel() // with the other Ray-in-the-loop tests, after the serial ones: each in namespaces of its own
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ray := env.StandIn()
		ns, token := env.NamespaceWithToken()
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		modes := map[string]string{"http": "HTTPMode", "k8s": "K8sJobMode"}
		start := time.Now()
		for name, mode := range modes {
			if _, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Create(env.ctx, rayJob(ns, name, mode), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		clusters := map[string]string{}
		for name := range modes {
			var job *unstructured.Unstructured
			err := wait.PollUntilContextTimeout(env.ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
				j, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return false, nil
				}
				job = j
				deploy, _, _ := unstructured.NestedString(j.Object, "status", "jobDeploymentStatus")
				return deploy == "Complete" || deploy == "Failed", nil
			})
			deploy, _, _ := unstructured.NestedString(job.Object, "status", "jobDeploymentStatus")
			status, _, _ := unstructured.NestedString(job.Object, "status", "jobStatus")
			if err != nil || deploy != "Complete" || status != "SUCCEEDED" {
				t.Fatalf("RayJob %s: deployment %q, job %q (%v)", name, deploy, status, err)
			}
			clusters[name], _, _ = unstructured.NestedString(job.Object, "status", "rayClusterName")
		}
		t.Logf("MEASURE rayjob kuberay=%s both_complete_s=%.1f", env.KubeRayVersion, time.Since(start).Seconds())
		env.AssertStartedWith(ns, token, clusters["http"], clusters["k8s"])
		submitters := env.tokenStarts(ns, token, func(s standin.ContainerStart) bool { return s.NodeType == "submitter" })
		if len(submitters) == 0 {
			t.Error("no submitter pod started with a token")
		}
		for pod, n := range submitters {
			if n[0] != n[1] {
				t.Errorf("%s started with another token", pod)
			}
		}
		for name, c := range clusters {
			st, err := ray.Stats(env.ctx, ns, c)
			if err != nil {
				t.Fatal(err)
			}
			if op := st.Requests["operator"]; op.Accepted == 0 || op.Rejected() != 0 {
				t.Errorf("%s: operator requests %+v", name, op)
			}
			if sub := st.Requests["submitter"]; (name == "k8s") != (sub.Accepted > 0) || sub.Rejected() != 0 {
				t.Errorf("%s: submitter requests %+v", name, sub)
			}
		}
	})
}

// TestNewClusterRaceAtStartDelay measures what matters about the new-cluster race: which token
// the containers of a burst of new clusters actually started with. With a start delay of 100 ms
// (far below a real image pull), none may start with KubeRay's random token.
func TestNewClusterRaceAtStartDelay(t *testing.T) {
	t.Parallel() // with the other Ray-in-the-loop tests, after the serial ones: each in namespaces of its own
	eachKubeRay(t, func(t *testing.T, env *Env) {
		env.StandIn()
		ns := env.NamespaceAnnotated(map[string]string{"standin.raysync.dev/start-delay": "100ms"})
		token := env.NewToken()
		env.PutSource(ns, "ray-token", tokenData(token))
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		const n = 10
		errs := make(chan error, n)
		for i := range n {
			go func() {
				_, err := env.Dynamic.Resource(kuberay.RayClusterGVR).Namespace(ns).Create(env.ctx, rayCluster(ns, fmt.Sprintf("burst-%d", i)), metav1.CreateOptions{})
				errs <- err
			}()
		}
		for range n {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		env.WaitPodsReady(ns, "ray.io/is-ray-node=yes", 2*n, 2*time.Minute)
		var starts, other int
		for _, c := range env.tokenStarts(ns, token, nil) {
			starts += c[0]
			other += c[0] - c[1]
		}
		t.Logf("MEASURE race kuberay=%s clusters=%d start_delay=100ms container_starts=%d non_canonical=%d", env.KubeRayVersion, n, starts, other)
		if starts < 3*n || other != 0 {
			t.Errorf("%d of %d container starts used a non-canonical token", other, starts)
		}
	})
}

// Issue 36 item 2: a RayJob's submitter in K8sJobMode (the default) runs the Ray image in a Job's pod
// whose default template has no pull secret, whatever the head's. In a namespace without registry
// credentials, with the private Ray image and raysync's pull secret and webhook, the submitter pod is
// born with the pull secret and the job succeeds (HTTPMode, which has no submitter pod, alongside).
// Before, the submitter sat in ImagePullBackOff while its cluster was healthy. One KubeRay version: the
// submitter's shape is the same in v1.5.1 and v1.6.1 (common.GetSubmitterTemplate).
func TestRayJobSubmitterFromAPrivateRegistry(t *testing.T) {
	cp := newestKubeRay()
	if cp == nil || cp.External {
		t.Skip("needs the local control plane")
	}
	t.Parallel()
	env := newEnv(t, cp)
	env.StandIn()
	src, ns := env.Namespace(), env.Namespace()
	token := env.NewToken()
	env.PutSource(src, "ray-token", tokenData(token))
	env.PutSecret(src, "regcred", corev1.SecretTypeDockerConfigJson, map[string][]byte{".dockerconfigjson": []byte(env.Secret(dockerConfig))})
	args := append([]string{"--auth-source=" + src + "/ray-token", "--namespaces=" + ns, "--pull-secret=" + src + "/regcred"}, env.webhookFor(src, ns)...)
	env.StartSyncer(args...)
	env.waitCABundle(args)
	for _, mode := range []string{"K8sJobMode", "HTTPMode"} {
		job := rayJob(ns, strings.ToLower(strings.TrimSuffix(mode, "Mode")), mode)
		withPrivateImage(job.Object["spec"].(map[string]any)["rayClusterSpec"].(map[string]any))
		if _, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Create(env.ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"k8sjob", "http"} {
		var deploy, status string
		err := wait.PollUntilContextTimeout(env.ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			j, err := env.Dynamic.Resource(kuberay.RayJobGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			deploy, _, _ = unstructured.NestedString(j.Object, "status", "jobDeploymentStatus")
			status, _, _ = unstructured.NestedString(j.Object, "status", "jobStatus")
			return deploy == "Complete" || deploy == "Failed", nil
		})
		if err != nil || status != "SUCCEEDED" {
			pods, _ := env.Kube.CoreV1().Pods(ns).List(env.ctx, metav1.ListOptions{})
			t.Fatalf("RayJob %s: deployment %q, job %q (%v)\n%s", name, deploy, status, err, describePods(pods.Items))
		}
	}
	pods, err := env.Kube.CoreV1().Pods(ns).List(env.ctx, metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=k8sjob"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("no submitter pod: %v", err)
	}
	for _, p := range pods.Items {
		if len(p.Spec.ImagePullSecrets) != 1 || p.Spec.ImagePullSecrets[0].Name != "regcred" {
			t.Errorf("submitter pod %s: imagePullSecrets %v, want regcred from its birth", p.Name, p.Spec.ImagePullSecrets)
		}
		if pullFailing(&p) {
			t.Errorf("submitter pod %s failed to pull", p.Name)
		}
	}
}
