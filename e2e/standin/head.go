package standin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// head is one running Ray head: the token its GCS and dashboard accept, its Serve controller and its
// job manager. It lives as long as the head pod's Ray container runs.
type head struct {
	cluster clusterKey
	pod     string
	auth    rayAuth
	serve   *serveState
	jobs    *jobStore
	stopped chan struct{} // closed when the head's container stops: its workers lose the GCS
	handler http.Handler  // the dashboard (port 8265)
}

// join is a GCS connection (a raylet, wait-gcs-ready, the autoscaler) presenting mac, or no token.
func (h *head) join(mac *tokenMAC) verdict { return h.auth.check(mac) }

type ctxKey int

const (
	callerKey ctxKey = iota
	presentedKey
)

// withCaller tags a request with who makes it; requests without a tag come from CallerClient.
func withCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey, c)
}

func callerOf(ctx context.Context) Caller {
	if c, ok := ctx.Value(callerKey).(Caller); ok {
		return c
	}
	return CallerClient
}

// withPresentedMAC is how a container the stand-in runs presents its token: it holds the MAC, never
// the token. nil presents no token.
func withPresentedMAC(ctx context.Context, mac *tokenMAC) context.Context {
	return context.WithValue(ctx, presentedKey, &presented{mac: mac})
}

type presented struct{ mac *tokenMAC }

// dashboard serves what KubeRay v1.5.1 and v1.6.1 call on a head's port 8265 (Serve's declarative
// API and the Jobs API) behind Ray's token check, plus the public health and auth-mode endpoints.
type dashboard struct {
	head  *head
	fp    *Fingerprinter
	stats *stats
	now   func() time.Time
}

func newDashboard(h *head, fp *Fingerprinter, st *stats, now func() time.Time) http.Handler {
	d := &dashboard{head: h, fp: fp, stats: st, now: now}
	api := http.NewServeMux()
	api.HandleFunc("PUT /api/serve/applications/{$}", d.putServe)
	api.HandleFunc("GET /api/serve/applications/{$}", d.getServe)
	api.HandleFunc("POST /api/jobs/{$}", d.submitJob)
	api.HandleFunc("GET /api/jobs/{$}", d.listJobs)
	api.HandleFunc("GET /api/jobs/{id}", d.getJob)
	api.HandleFunc("DELETE /api/jobs/{id}", d.deleteJob)
	api.HandleFunc("GET /api/jobs/{id}/logs", d.jobLogs)
	api.HandleFunc("POST /api/jobs/{id}/stop", d.stopJob)
	api.HandleFunc("GET /api/version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "4", "ray_version": "2.52.0", "ray_commit": "emulated"})
	})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/authentication_mode", func(w http.ResponseWriter, _ *http.Request) {
		mode := "disabled"
		if h.auth.enabled {
			mode = "token"
		}
		writeJSON(w, http.StatusOK, map[string]string{"authentication_mode": mode})
	})
	mux.HandleFunc("GET /api/gcs_healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "success") })
	// Open without a token, served by the node's agent, not the head's dashboard: 404 here, as in Ray 2.60.
	for _, p := range []string{"/api/healthz", "/api/local_raylet_healthz", "/-/healthz"} {
		mux.HandleFunc(p, http.NotFound)
	}
	mux.HandleFunc("POST /api/authenticate", d.authenticate)
	mux.Handle("/", d.authenticated(notFromABrowser(api)))
	return mux
}

// authenticate is Ray's login for browsers: it checks the Authorization header only and, for the
// right token, sets the cookie to the token the client presented.
func (d *dashboard) authenticate(w http.ResponseWriter, r *http.Request) {
	h := http.Header{}
	if v := r.Header.Get("Authorization"); v != "" {
		h.Set("Authorization", v)
	}
	var mac *tokenMAC
	token, ok := presentedToken(h)
	if ok {
		m := d.fp.mac(token)
		mac = &m
	}
	switch v := d.head.auth.check(mac); v {
	case unauthenticated:
		http.Error(w, "Unauthorized: Missing authentication token", v.httpStatus())
	case forbidden:
		http.Error(w, "Forbidden: Invalid authentication token", v.httpStatus())
	default:
		http.SetCookie(w, &http.Cookie{Name: rayAuthCookie, Value: token, HttpOnly: true, MaxAge: 2592000, Path: "/", SameSite: http.SameSiteStrictMode})
		writeJSON(w, http.StatusOK, map[string]string{"status": "authenticated", "message": "Token is valid"})
	}
}

// notFromABrowser refuses what Ray takes for browser traffic (a Mozilla user agent, or the headers
// browsers send) on any method but GET, as Ray's dashboard does against cross-site requests.
func notFromABrowser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		browser := strings.HasPrefix(r.Header.Get("User-Agent"), "Mozilla") || r.Header.Get("Origin") != "" || r.Header.Get("Referer") != "" ||
			r.Header.Get("Sec-Fetch-Mode") != "" || r.Header.Get("Sec-Fetch-Site") != ""
		if browser && r.Method != http.MethodGet && r.Method != http.MethodHead {
			http.Error(w, fmt.Sprintf("'%s' method not allowed for browser traffic.", r.Method), http.StatusMethodNotAllowed)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authenticated applies Ray's HTTP token check and counts the verdict for the caller.
func (d *dashboard) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var mac *tokenMAC
		if p, ok := r.Context().Value(presentedKey).(*presented); ok {
			mac = p.mac
		} else if token, ok := presentedToken(r.Header); ok {
			m := d.fp.mac(token)
			mac = &m
		}
		v := d.head.auth.check(mac)
		d.stats.request(d.head.cluster, callerOf(r.Context()), v)
		switch v {
		case unauthenticated:
			http.Error(w, "Unauthorized: Missing authentication token", v.httpStatus())
		case forbidden:
			http.Error(w, "Forbidden: Invalid authentication token", v.httpStatus())
		default:
			next.ServeHTTP(w, r)
		}
	})
}

func (d *dashboard) putServe(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = d.head.serve.apply(body, d.now())
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (d *dashboard) getServe(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.head.serve.details(d.now()))
}

func (d *dashboard) submitJob(w http.ResponseWriter, r *http.Request) {
	var req jobRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Entrypoint == "" {
		http.Error(w, "invalid job submission: an entrypoint is required", http.StatusBadRequest)
		return
	}
	id, err := d.head.jobs.submit(req, d.now())
	if errors.Is(err, errDuplicateSubmission) {
		// Ray answers 500 here; KubeRay's client looks for this sentence.
		http.Error(w, "Job with submission_id "+id+" already exists. Please use a different submission_id.", http.StatusInternalServerError)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"job_id": id, "submission_id": id})
}

func (d *dashboard) listJobs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, d.head.jobs.list(d.now()))
}

func (d *dashboard) getJob(w http.ResponseWriter, r *http.Request) {
	info, ok := d.head.jobs.get(r.PathValue("id"), d.now())
	if !ok {
		http.Error(w, "Job "+r.PathValue("id")+" does not exist", http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

func (d *dashboard) jobLogs(w http.ResponseWriter, r *http.Request) {
	logs, ok := d.head.jobs.logs(r.PathValue("id"), d.now())
	if !ok {
		http.Error(w, "Job "+r.PathValue("id")+" does not exist", http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"logs": logs})
}

func (d *dashboard) stopJob(w http.ResponseWriter, r *http.Request) {
	stopped, ok := d.head.jobs.stop(r.PathValue("id"), d.now())
	if !ok {
		http.Error(w, "Job "+r.PathValue("id")+" does not exist", http.StatusNotFound)
		return
	}
	writeJSON(w, http.StatusOK, map[string]bool{"stopped": stopped})
}

func (d *dashboard) deleteJob(w http.ResponseWriter, r *http.Request) {
	status, ok := d.head.jobs.remove(r.PathValue("id"), d.now())
	switch {
	case !ok:
		http.Error(w, "Job "+r.PathValue("id")+" does not exist", http.StatusNotFound)
	case !terminal(status):
		http.Error(w, "Attempted to delete job with id '"+r.PathValue("id")+"', but it is in a non-terminal state "+status+".", http.StatusBadRequest)
	default:
		writeJSON(w, http.StatusOK, map[string]bool{"deleted": true})
	}
}

// serveProxy is a Ray Serve HTTP proxy (port 8000 on every node once Serve runs): health check
// and the applications' routes. It needs no token: Ray's token auth covers the dashboard and GCS.
func serveProxy(serve *serveState, cluster string, now func() time.Time) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/-/healthz" {
			_, _ = io.WriteString(w, "success")
			return
		}
		if r.URL.Path == "/-/routes" {
			routes := map[string]string{}
			for name, app := range serve.details(now()).Applications {
				routes[app.RoutePrefix] = name
			}
			writeJSON(w, http.StatusOK, routes)
			return
		}
		app, status, ok := serve.route(r.URL.Path, now())
		switch {
		case !ok:
			http.Error(w, "Path '"+r.URL.Path+"' not found. Ping http://.../-/routes for available routes.", http.StatusNotFound)
		case status != appRunning:
			http.Error(w, "application "+app+" is "+status, http.StatusServiceUnavailable)
		default:
			_, _ = io.WriteString(w, "emulated Serve application "+app+" on RayCluster "+cluster+"\n")
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
