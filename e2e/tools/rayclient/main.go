// Command rayclient drives a Ray head with KubeRay's own Go dashboard client (the ray-operator
// module's dashboardclient package: a client no one in raysync wrote) and prints what each call
// returned as JSON on standard output. The token comes from a file, so it is in no command line;
// it is never printed.
//
//	rayclient -url http://<head svc>.<ns>.svc.cluster.local:8265 -proxy http://127.0.0.1:PORT \
//	    -token-file FILE -job-id ID [-timeout 60s]
//
// It submits a job, polls it until it ends, reads its logs, lists jobs, reads the Serve details
// and deletes the job. Errors are reported per call, not fatal: a refused token shows as the
// client's own error text (which carries Ray's status, e.g. "403 Forbidden").
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/dashboardclient"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
)

// report is what the caller (an e2e test) reads.
type report struct {
	SubmitError string            `json:"submitError,omitempty"`
	JobID       string            `json:"jobId,omitempty"`
	JobStatus   string            `json:"jobStatus,omitempty"`
	StatusError string            `json:"statusError,omitempty"`
	LogsError   string            `json:"logsError,omitempty"`
	GotLogs     bool              `json:"gotLogs"`
	ListError   string            `json:"listError,omitempty"`
	Listed      int               `json:"listed"`
	ServeError  string            `json:"serveError,omitempty"`
	ServeApps   map[string]string `json:"serveApps,omitempty"` // application → status
	DeleteError string            `json:"deleteError,omitempty"`
}

func main() {
	dashboard := flag.String("url", "", "the head's dashboard, http://<service>.<namespace>.svc.cluster.local:8265")
	proxy := flag.String("proxy", "", "HTTP proxy that resolves cluster names (the stand-in's)")
	tokenFile := flag.String("token-file", "", "file holding the token to present")
	jobID := flag.String("job-id", "", "submission id of the job to submit")
	timeout := flag.Duration("timeout", time.Minute, "how long to wait for the job to end")
	flag.Parse()
	token, err := os.ReadFile(*tokenFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rayclient:", err)
		os.Exit(2)
	}
	proxyURL, err := url.Parse(*proxy)
	if err != nil || *dashboard == "" || *jobID == "" {
		fmt.Fprintln(os.Stderr, "rayclient: -url, -proxy and -job-id are required")
		os.Exit(2)
	}
	client := &dashboardclient.RayDashboardClient{}
	// What the operator does (utils.GetRayDashboardClientFunc), with our proxy in place of HTTP_PROXY.
	client.InitClient(&http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}, *dashboard, string(token))

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	r := report{}
	id, err := client.SubmitJobReq(ctx, &utiltypes.RayJobRequest{Entrypoint: "python -c 'print(42)'", SubmissionId: *jobID})
	r.JobID, r.SubmitError = id, errText(err)
	for ctx.Err() == nil {
		info, err := client.GetJobInfo(ctx, *jobID)
		if r.StatusError = errText(err); err != nil {
			break
		}
		r.JobStatus = string(info.JobStatus)
		if rayv1.IsJobTerminal(info.JobStatus) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	logs, err := client.GetJobLog(ctx, *jobID)
	r.LogsError, r.GotLogs = errText(err), logs != nil && *logs != ""
	jobs, err := client.ListJobs(ctx)
	if r.ListError = errText(err); jobs != nil {
		r.Listed = len(*jobs)
	}
	apps, err := client.GetMultiApplicationStatus(ctx)
	if r.ServeError = errText(err); err == nil {
		r.ServeApps = map[string]string{}
		for name, app := range apps {
			r.ServeApps[name] = app.Status
		}
	}
	r.DeleteError = errText(client.DeleteJob(ctx, *jobID))
	_ = json.NewEncoder(os.Stdout).Encode(r)
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
