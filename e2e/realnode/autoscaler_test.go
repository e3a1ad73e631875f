package realnode

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/raysync/raysync/e2e/framework"
)

// TestRealNodeAutoscalerScalesByX509: seed 001 on the real node. raysync, installed from the
// registry, gives the head's autoscaler container a client certificate (a Secret volume the real
// kubelet mounts) and the head pod mounts no service-account token: Ray's own autoscaler scales the
// worker group up through the kubernetes Service by x509 when a job needs a worker. Then the
// certificate is renewed under another identity and the old identity loses its rights: the
// kubelet's volume refresh brings the new file into the running autoscaler container (measured),
// and a job needing two workers makes the same autoscaler process scale up again — possible only
// with the renewed certificate (Ray's node provider reads the files at every request).
func TestRealNodeAutoscalerScalesByX509(t *testing.T) {
	cp := startNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	rayImage, err := cp.PushRayImage(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	const platform, ns, name = "raysync", "realnode-auto", "auto"
	createNamespaces(ctx, t, cp, platform, ns)
	token := fmt.Sprintf("realnode-auto-token-%d", time.Now().UnixNano())
	if _, err := cp.Kube.CoreV1().Secrets(platform).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ray-token"},
		StringData: map[string]string{"auth_token": token}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	issue := func(user string) map[string][]byte {
		crt, key, ca, err := cp.IssueClientCert(user, nil)
		if err != nil {
			t.Fatal(err)
		}
		return map[string][]byte{"tls.crt": crt, "tls.key": key, "ca.crt": ca}
	}
	grant := func(user string) {
		role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "ray-autoscaler", Namespace: ns}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
			{APIGroups: []string{""}, Resources: []string{"pods/resize"}, Verbs: []string{"patch"}},
			{APIGroups: []string{"ray.io"}, Resources: []string{"rayclusters"}, Verbs: []string{"get", "patch"}}}}
		if _, err := cp.Kube.RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
			t.Fatal(err)
		}
		rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user, Namespace: ns},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
		if _, err := cp.Kube.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const oldUser, newUser = "raysync-e2e-autoscaler-1", "raysync-e2e-autoscaler-2"
	grant(oldUser)
	if _, err := cp.Kube.CoreV1().Secrets(platform).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "autoscaler-tls"},
		Type: corev1.SecretTypeTLS, Data: issue(oldUser)}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	installRaysync(ctx, t, cp, platform, "0.2.0-autoscaler", "namespaces[0]="+ns, "autoscalerTLS.secret="+platform+"/autoscaler-tls", "replicas=1")

	rc := rayCluster(ns, name, rayImage)
	spec := rc.Object["spec"].(map[string]any)
	spec["enableInTreeAutoscaling"] = true
	spec["autoscalerOptions"] = map[string]any{"idleTimeoutSeconds": int64(60),
		"resources": map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "256Mi"}, "limits": map[string]any{"memory": "1Gi"}}}
	head := spec["headGroupSpec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
	head["automountServiceAccountToken"] = false
	delete(head, "imagePullSecrets") // raysync's webhook gives every Ray pod the pull secret
	group := spec["workerGroupSpecs"].([]any)[0].(map[string]any)
	group["replicas"], group["minReplicas"], group["maxReplicas"] = int64(0), int64(0), int64(2)
	delete(group["template"].(map[string]any)["spec"].(map[string]any), "imagePullSecrets")
	t0 := time.Now()
	if _, err := cp.Dynamic.Resource(rayClusterGVR).Namespace(ns).Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	headPod := waitHeadReady(ctx, t, cp, ns, name)
	t.Logf("MEASURE autoscaling RayCluster created (raysync installed) → head Ready: %s", time.Since(t0).Round(time.Millisecond))
	var autoscaler *corev1.Container
	for i, c := range headPod.Spec.Containers {
		if c.Name == "autoscaler" {
			autoscaler = &headPod.Spec.Containers[i]
		}
	}
	if autoscaler == nil {
		t.Fatalf("the head pod has no autoscaler container: %+v", headPod.Spec.Containers)
	}
	certPath := ""
	for _, e := range autoscaler.Env {
		if e.Name == "RAY_KUBERAY_CLIENT_CERT_PATH" {
			certPath = e.Value
		}
	}
	if certPath == "" {
		t.Fatalf("the autoscaler has no RAY_KUBERAY_CLIENT_CERT_PATH: raysync's webhook did not wire its certificate")
	}
	for _, v := range headPod.Spec.Volumes {
		if v.Projected != nil {
			t.Fatalf("the head pod mounts a projected volume %s: the autoscaler must have no service-account token", v.Name)
		}
	}

	jobs := &headAPI{client: cp.ServiceClient(30 * time.Second), base: "http://" + name + "-head-svc." + ns + ".svc.cluster.local:8265", token: token}
	oneWorker := "python -c \"import ray, socket; ray.init(); print('ran on', ray.get(ray.remote(num_cpus=1)(lambda: socket.gethostname()).remote()))\""
	t1 := time.Now()
	if st, logs := jobs.run(ctx, t, oneWorker, 8*time.Minute); st != "SUCCEEDED" || !strings.Contains(logs, "ran on "+name+"-workers-worker-") {
		t.Fatalf("a job needing a worker: %s\n%s\nthe autoscaler says:\n%s", st, logs, containerLogs(ctx, cp, ns, headPod.Name, "autoscaler"))
	}
	t.Logf("MEASURE a job needing a worker → SUCCEEDED (Ray's autoscaler scaled up by x509): %s", time.Since(t1).Round(time.Millisecond))

	// Renew the certificate under another identity; only the new one may scale.
	grant(newUser)
	renewed := issue(newUser)
	src, err := cp.Kube.CoreV1().Secrets(platform).Get(ctx, "autoscaler-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src.Data = renewed
	renewedAt := time.Now()
	if _, err := cp.Kube.CoreV1().Secrets(platform).Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(renewed["tls.crt"]) // a certificate is public; its digest names the file
	want := hex.EncodeToString(sum[:])
	kubectl, err := framework.Kubectl(ctx, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		out, err := exec.CommandContext(ctx, kubectl, "--kubeconfig", cp.Kubeconfig, "-n", ns, "exec", headPod.Name, "-c", "autoscaler", "--",
			"sha256sum", certPath).Output()
		if err != nil {
			return false, nil
		}
		got, _, _ := strings.Cut(string(out), " ")
		return got == want, nil
	}); err != nil {
		t.Fatalf("the renewed certificate never reached the autoscaler container (%s still differs from it)", certPath)
	}
	refreshed := time.Since(renewedAt)
	if err := cp.Kube.RbacV1().RoleBindings(ns).Delete(ctx, oldUser, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("MEASURE renewed certificate written to the source → in the running autoscaler container (raysync's copy, then the kubelet's volume refresh): %s", refreshed.Round(100*time.Millisecond))

	twoWorkers := "python -c \"import ray, time, socket; ray.init(); f = ray.remote(num_cpus=1)(lambda: (time.sleep(20), socket.gethostname())[1]); print('ran on', sorted(set(ray.get([f.remote(), f.remote()]))))\""
	t2 := time.Now()
	if st, logs := jobs.run(ctx, t, twoWorkers, 8*time.Minute); st != "SUCCEEDED" {
		t.Fatalf("a job needing two workers after the renewal: %s\n%s\nthe autoscaler says:\n%s", st, logs, containerLogs(ctx, cp, ns, headPod.Name, "autoscaler"))
	}
	t.Logf("MEASURE a job needing two workers, the old identity's rights revoked → SUCCEEDED: %s", time.Since(t2).Round(time.Millisecond))
	p, err := cp.Kube.CoreV1().Pods(ns).Get(ctx, headPod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.RestartCount != 0 {
			t.Errorf("the head's %s container restarted %d times: the renewal must reach the running autoscaler", c.Name, c.RestartCount)
		}
	}
}

// waitHeadReady waits for the cluster's head pod to be Ready and returns it.
func waitHeadReady(ctx context.Context, t *testing.T, cp *framework.ControlPlane, ns, name string) *corev1.Pod {
	t.Helper()
	var head *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 8*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cp.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/cluster=" + name + ",ray.io/node-type=head"})
		if err != nil || len(list.Items) != 1 {
			return false, nil
		}
		head = &list.Items[0]
		return podReady(head), nil
	}); err != nil {
		t.Fatalf("head of %s/%s never Ready: %v\nevents:\n%s", ns, name, err, events(ctx, cp.Kube, ns))
	}
	return head
}

// containerLogs is the tail of a container's log (for failures).
func containerLogs(ctx context.Context, cp *framework.ControlPlane, ns, pod, container string) string {
	b, err := cp.Kube.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, TailLines: ptr(int64(40))}).DoRaw(ctx)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// headAPI is Ray's Jobs API on a head's dashboard, reached by the Service's name through the
// harness's service proxy, with a token.
type headAPI struct {
	client      *http.Client
	base, token string
}

func (h *headAPI) call(ctx context.Context, method, path string, body any) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base+path, r)
	if err != nil {
		return 0, nil, err
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// run submits entrypoint as a job, waits until it ends, and returns its status and logs.
func (h *headAPI) run(ctx context.Context, t *testing.T, entrypoint string, timeout time.Duration) (string, string) {
	t.Helper()
	var id string
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		code, body, err := h.call(ctx, http.MethodPost, "/api/jobs/", map[string]any{"entrypoint": entrypoint})
		if err != nil || code != http.StatusOK {
			return false, nil // the dashboard may still be starting
		}
		var sub struct {
			SubmissionID string `json:"submission_id"`
		}
		_ = json.Unmarshal(body, &sub)
		id = sub.SubmissionID
		return id != "", nil
	}); err != nil {
		t.Fatalf("job submission never accepted: %v", err)
	}
	var status string
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		code, body, err := h.call(ctx, http.MethodGet, "/api/jobs/"+id, nil)
		if err != nil || code != http.StatusOK {
			return false, nil
		}
		var j struct{ Status string }
		_ = json.Unmarshal(body, &j)
		status = j.Status
		return status == "SUCCEEDED" || status == "FAILED" || status == "STOPPED", nil
	})
	_, body, _ := h.call(ctx, http.MethodGet, "/api/jobs/"+id+"/logs", nil)
	var logs struct{ Logs string }
	_ = json.Unmarshal(body, &logs)
	return status, logs.Logs
}
