package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/raysync/raysync/e2e/framework"
	"github.com/raysync/raysync/internal/kuberay"
)

// rayClientReport is what e2e/tools/rayclient prints.
type rayClientReport struct {
	SubmitError, JobID, JobStatus, StatusError, LogsError, ListError, ServeError, DeleteError string
	GotLogs                                                                                   bool
	Listed                                                                                    int
	ServeApps                                                                                 map[string]string
}

// runRayClient runs KubeRay's own dashboard client against url with token, through the stand-in.
func (e *Env) runRayClient(url, token, jobID string) rayClientReport {
	e.t.Helper()
	bin, err := framework.EnsureRayClient(e.ctx, e.t.Logf)
	if err != nil {
		e.t.Fatal(err)
	}
	tokenFile := filepath.Join(e.t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		e.t.Fatal(err)
	}
	out, err := exec.CommandContext(e.ctx, bin, "-url", url, "-proxy", e.StandIn().ClientProxyURL, "-token-file", tokenFile, "-job-id", jobID, "-timeout", "60s").Output()
	if err != nil {
		e.t.Fatalf("rayclient: %v", err)
	}
	var r rayClientReport
	if err := json.Unmarshal(out, &r); err != nil {
		e.t.Fatalf("rayclient output: %v", err)
	}
	return r
}

// TestKubeRayDashboardClient drives an emulated head with a client no one here wrote: KubeRay's own
// Go dashboard client (ray-operator's dashboardclient package, v1.6.1). With the canonical token a
// job is submitted and runs to SUCCEEDED and the Serve application the operator deployed shows
// RUNNING; with a wrong token every call is refused with Ray's status codes.
func TestKubeRayDashboardClient(t *testing.T) {
	t.Parallel() // with the other Ray-in-the-loop tests, after the serial ones: each in namespaces of its own
	eachKubeRay(t, func(t *testing.T, env *Env) {
		ray := env.StandIn()
		ns, token := env.NamespaceWithToken()
		env.StartSyncer("--auth-source="+ns+"/ray-token", "--namespaces="+ns)
		if _, err := env.Dynamic.Resource(kuberay.RayServiceGVR).Namespace(ns).Create(env.ctx, rayService(ns, "svc", "v1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		env.WaitRayServiceReady(ns, "svc", 2*time.Minute, nil)
		url := headURL(ns, "svc-head-svc")

		ok := env.runRayClient(url, token, "canonical-1")
		if ok.SubmitError != "" || ok.StatusError != "" || ok.JobStatus != "SUCCEEDED" || !ok.GotLogs || ok.Listed != 1 || ok.DeleteError != "" {
			t.Errorf("with the canonical token: %+v", ok)
		}
		if ok.ServeError != "" || ok.ServeApps["fruit"] != "RUNNING" {
			t.Errorf("Serve details with the canonical token: %q %v", ok.ServeError, ok.ServeApps)
		}

		bad := env.runRayClient(url, "not-"+token, "wrong-1")
		if !strings.Contains(bad.SubmitError, "403") || !strings.Contains(bad.ServeError, "403") || !strings.Contains(bad.StatusError, "Forbidden") || bad.JobStatus != "" {
			t.Errorf("with a wrong token: %+v", bad)
		}
		for _, r := range []rayClientReport{ok, bad} {
			b, _ := json.Marshal(r)
			if strings.Contains(string(b), token) {
				t.Error("the client's report contains the token")
			}
		}
		active := env.WaitRayServiceReady(ns, "svc", time.Second, nil)
		cluster, _, _ := unstructured.NestedString(active.Object, "status", "activeServiceStatus", "rayClusterName")
		st, err := ray.Stats(env.ctx, ns, cluster)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.Requests["client"]; c.Accepted < 5 || c.Forbidden < 3 || c.Unauthenticated != 0 {
			t.Errorf("client requests at the head: %+v", c)
		}
	})
}
