package standin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Names KubeRay gives things (ray-operator/controllers/ray/utils/constant.go).
const (
	labelCluster         = "ray.io/cluster"
	labelNodeType        = "ray.io/node-type"
	waitGCSReady         = "wait-gcs-ready"
	autoscalerContainer  = "autoscaler"
	envAuthMode          = "RAY_AUTH_MODE"
	envAuthToken         = "RAY_AUTH_TOKEN"
	envDashboardAddress  = "RAY_DASHBOARD_ADDRESS"
	envJobSubmissionID   = "RAY_JOB_SUBMISSION_ID"
	authModeToken        = "token"
	exitTokenMissing     = "TokenAuthEnabledWithoutToken"
	exitGCSUnreachable   = "GCSUnreachable"
	exitGCSUnauthorized  = "GCSAuthenticationFailed"
	exitGCSLost          = "GCSConnectionLost"
	exitJobSubmitFailed  = "JobSubmissionFailed"
	exitCompleted        = "Completed"
	submitterPollPeriod  = 250 * time.Millisecond
	workerHeadPollPeriod = 100 * time.Millisecond
)

// processKind is what a container runs, as far as the stand-in emulates it.
type processKind int

const (
	kindPlain      processKind = iota // anything else: runs until stopped
	kindHead                          // GCS + dashboard + Serve controller
	kindRaylet                        // a worker's raylet: joins its head's GCS
	kindAutoscaler                    // joins its own head's GCS
	kindWaitGCS                       // KubeRay's wait-gcs-ready: polls the head's GCS until it answers
	kindSubmitter                     // `ray job submit` + `ray job logs --follow` against the head
)

// roleOf says whether the stand-in runs a pod, and as what: KubeRay's heads and workers, and RayJob
// submitter pods (a container with RAY_DASHBOARD_ADDRESS and RAY_JOB_SUBMISSION_ID).
func roleOf(pod *corev1.Pod) string {
	switch pod.Labels[labelNodeType] {
	case roleHead:
		return roleHead
	case roleWorker:
		return roleWorker
	}
	for _, c := range pod.Spec.Containers {
		if hasEnv(c.Env, envDashboardAddress) && hasEnv(c.Env, envJobSubmissionID) {
			return roleSubmitter
		}
	}
	return ""
}

func kindOf(p *podRuntime, c *containerRuntime) processKind {
	switch {
	case c.init && c.spec.Name == waitGCSReady:
		return kindWaitGCS
	case c.init:
		return kindPlain
	case hasEnv(c.spec.Env, envDashboardAddress) && hasEnv(c.spec.Env, envJobSubmissionID):
		return kindSubmitter
	case p.role == roleHead && c.index == 0:
		return kindHead
	case p.role == roleHead && c.spec.Name == autoscalerContainer:
		return kindAutoscaler
	case p.role == roleWorker && c.index == 0:
		return kindRaylet
	}
	return kindPlain
}

// rayAuthFromEnv is what a Ray process loads at start: token auth when RAY_AUTH_MODE=token, the
// token from RAY_AUTH_TOKEN. hasToken reports whether the container had a token at all.
func rayAuthFromEnv(fp *Fingerprinter, env map[string]string) (auth rayAuth, hasToken bool) {
	token, hasToken := env[envAuthToken]
	if hasToken {
		auth.token = fp.mac(token)
	}
	auth.enabled = env[envAuthMode] == authModeToken
	return auth, hasToken
}

// execute runs a started container's process until it exits; it returns the exit code and reason.
func (p *podRuntime) execute(c *containerRuntime, env map[string]string, auth rayAuth, hasToken bool) (int, string) {
	kind := kindOf(p, c)
	if kind != kindPlain && auth.enabled && !hasToken {
		// Ray: "Token authentication is enabled but no authentication token was found".
		return 1, exitTokenMissing
	}
	var presented *tokenMAC
	if auth.enabled {
		presented = &auth.token
	}
	switch kind {
	case kindHead:
		if hasToken && env[envAuthMode] == "" {
			auth.enabled = true // Ray 2.59+: `ray start --head` turns token auth on when a token exists
		}
		return p.runHead(c, auth)
	case kindRaylet, kindAutoscaler:
		return p.runRaylet(c, presented)
	case kindWaitGCS:
		return p.runWaitGCS(presented)
	case kindSubmitter:
		return p.runSubmitter(env, presented)
	}
	if c.init {
		return 0, exitCompleted // an init container the stand-in knows nothing about: it did its job
	}
	<-p.ctx.Done()
	return 0, exitCompleted
}

// runHead starts the cluster's GCS, dashboard and Serve controller with the token it loaded.
func (p *podRuntime) runHead(c *containerRuntime, auth rayAuth) (int, string) {
	cfg := p.k.cfg
	h := &head{cluster: p.cluster, pod: p.pod.Name, auth: auth, stopped: make(chan struct{}),
		serve: newServeState(cfg.ServeDeployDelay), jobs: newJobStore(cfg.JobPending, cfg.JobDuration)}
	h.handler = newDashboard(h, p.k.fp, p.k.stats, time.Now)
	p.k.registerHead(h)
	p.mu.Lock()
	p.head = h
	p.mu.Unlock()
	p.setReady(c)
	<-p.ctx.Done()
	p.mu.Lock()
	p.head = nil
	p.mu.Unlock()
	p.k.unregisterHead(h)
	close(h.stopped)
	return 0, exitCompleted
}

// runRaylet joins the head's GCS with the container's token. `ray start` waits a while for a GCS
// that is not up yet, fails on a token the GCS refuses, and dies when the GCS goes away.
func (p *podRuntime) runRaylet(c *containerRuntime, presented *tokenMAC) (int, string) {
	deadline := time.Now().Add(p.k.cfg.JoinTimeout)
	var h *head
	for h = p.k.headOf(p.cluster); h == nil; h = p.k.headOf(p.cluster) {
		if time.Now().After(deadline) {
			return 1, exitGCSUnreachable
		}
		if !sleep(p.ctx, workerHeadPollPeriod) {
			return 0, exitCompleted
		}
	}
	v := h.join(presented)
	p.k.stats.request(p.cluster, CallerWorker, v)
	if v != accepted {
		p.k.stats.joinFailure(p.cluster)
		p.k.log.Info("GCS refused a node's token", "pod", p.String(), "container", c.spec.Name, "verdict", string(v))
		return 1, exitGCSUnauthorized
	}
	p.setReady(c)
	select {
	case <-p.ctx.Done():
		return 0, exitCompleted
	case <-h.stopped:
		return 1, exitGCSLost
	}
}

// runWaitGCS is KubeRay's wait-gcs-ready loop: `ray health-check` against the head every few
// seconds until it succeeds. A refused token is retried forever (the pod stays initializing).
func (p *podRuntime) runWaitGCS(presented *tokenMAC) (int, string) {
	for {
		if h := p.k.headOf(p.cluster); h != nil {
			v := h.join(presented)
			p.k.stats.request(p.cluster, CallerWorker, v)
			if v == accepted {
				return 0, exitCompleted
			}
			p.k.stats.joinFailure(p.cluster)
		}
		if !sleep(p.ctx, p.k.cfg.GCSRetry) {
			return 0, exitCompleted
		}
	}
}

// runSubmitter is KubeRay's K8s-Job-mode submitter: `ray job status` (submit unless the job
// exists), then follow the job until it ends, all against RAY_DASHBOARD_ADDRESS with its own token.
func (p *podRuntime) runSubmitter(env map[string]string, presented *tokenMAC) (int, string) {
	addr := strings.TrimPrefix(env[envDashboardAddress], "http://")
	id := env[envJobSubmissionID]
	deadline := time.Now().Add(p.k.cfg.JoinTimeout)
	call := func(method, path string, body any) (int, []byte, error) {
		dest, err := p.k.router.resolve(addr, p.pod.Namespace, p)
		for err != nil && time.Now().Before(deadline) && sleep(p.ctx, workerHeadPollPeriod) {
			dest, err = p.k.router.resolve(addr, p.pod.Namespace, p) // the CLI retries a dashboard not up yet
		}
		if err != nil {
			return 0, nil, err
		}
		var buf bytes.Buffer
		if body != nil {
			_ = json.NewEncoder(&buf).Encode(body)
		}
		req := httptest.NewRequestWithContext(withPresentedMAC(withCaller(p.ctx, CallerSubmitter), presented), method, path, &buf)
		rec := httptest.NewRecorder()
		dest.handler.ServeHTTP(rec, req)
		return rec.Code, rec.Body.Bytes(), nil
	}
	status := func() (string, error) {
		code, body, err := call(http.MethodGet, "/api/jobs/"+id, nil)
		switch {
		case err != nil:
			return "", err
		case code == http.StatusNotFound:
			return "", errJobNotFound
		case code != http.StatusOK:
			return "", fmt.Errorf("job status: HTTP %d", code)
		}
		var info jobInfo
		if err := json.Unmarshal(body, &info); err != nil {
			return "", fmt.Errorf("job status: %w", err)
		}
		return info.Status, nil
	}
	_, err := status()
	if errors.Is(err, errJobNotFound) {
		var code int
		code, _, err = call(http.MethodPost, "/api/jobs/", jobRequest{Entrypoint: entrypointOf(p.pod), SubmissionID: id})
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("job submission: HTTP %d", code)
		}
	}
	for err == nil {
		var st string
		if st, err = status(); err == nil && terminal(st) {
			return 0, exitCompleted
		}
		if !sleep(p.ctx, submitterPollPeriod) {
			return 0, exitCompleted
		}
	}
	p.k.log.Info("job submitter failed", "pod", p.String(), "err", err)
	return 1, exitJobSubmitFailed
}

var errJobNotFound = errors.New("job not found")

// entrypointOf finds the job's entrypoint in the submitter's shell script: KubeRay puts it after
// the last "--" of `ray job submit ... -- <entrypoint> ;`.
func entrypointOf(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		script := strings.Join(c.Args, " ")
		if i := strings.LastIndex(script, " -- "); i >= 0 {
			ep, _, _ := strings.Cut(script[i+len(" -- "):], " ;")
			if ep = strings.TrimSpace(ep); ep != "" {
				return ep
			}
		}
	}
	return "emulated-entrypoint"
}

func hasEnv(env []corev1.EnvVar, name string) bool {
	for _, e := range env {
		if e.Name == name {
			return true
		}
	}
	return false
}
