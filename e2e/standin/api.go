package standin

import (
	"io"
	"net/http"
	"strings"
)

// APIHandler is the stand-in's read-only JSON endpoint, for tests (through the framework) and for
// people poking at `make dev-cluster` with curl. It shows fingerprints, never tokens.
func (k *Kubelet) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, strings.TrimSpace(`
raysync kubelet and Ray stand-in (read-only; fingerprints are HMACs under a per-control-plane key, never tokens)
  GET /healthz
  GET /v1/clusters                       requests per caller (accepted, 401, 403), GCS join failures, restarts
  GET /v1/clusters/{namespace}/{name}
  GET /v1/pods/{namespace}/{name}        containers: state, restarts, token fingerprint of the current run
  GET /v1/starts/{namespace}             every container start, with the token fingerprint it started with
  GET /v1/proxy                          what the HTTP proxies routed, per caller
  GET /v1/network                        real-Ray pods: the node network's namespace and its clients' hosts file
`)+"\n")
	})
	mux.HandleFunc("GET /v1/network", func(w http.ResponseWriter, _ *http.Request) {
		if k.real == nil {
			http.Error(w, "this stand-in runs no real processes", http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, NetworkReport{NetNS: k.real.net.path(), ClientHosts: k.real.clientHosts(), Venv: k.real.cfg.Venv,
			Sandbox: k.real.cfg.Self, Dir: k.real.cfg.Dir})
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/clusters", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, k.stats.allClusters())
	})
	mux.HandleFunc("GET /v1/clusters/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, k.stats.clusterSnapshot(clusterKey{r.PathValue("namespace"), r.PathValue("name")}))
	})
	mux.HandleFunc("GET /v1/pods/{namespace}/{name}", func(w http.ResponseWriter, r *http.Request) {
		p := k.pod(r.PathValue("namespace"), r.PathValue("name"))
		if p == nil {
			http.Error(w, "the stand-in runs no such pod", http.StatusNotFound)
			return
		}
		writeJSON(w, http.StatusOK, p.report())
	})
	mux.HandleFunc("GET /v1/starts/{namespace}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, k.stats.startsIn(r.PathValue("namespace")))
	})
	mux.HandleFunc("GET /v1/proxy", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, k.stats.proxySnapshot())
	})
	return mux
}

// Proxy is the HTTP proxy for caller: point a client's HTTP_PROXY at it.
func (k *Kubelet) Proxy(caller Caller) http.Handler {
	return &forwardProxy{caller: caller, router: k.router, stats: k.stats, log: k.log}
}
