package standin

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
)

// forwardProxy is an HTTP proxy (what HTTP_PROXY points at) for one caller. It routes absolute-URI
// requests by Host to the emulated server behind it and answers itself: it never dials anything,
// so no packet leaves loopback whatever address a client asks for. Unknown hosts get 502.
type forwardProxy struct {
	caller Caller
	router *router
	stats  *stats
	log    *slog.Logger
}

func (p *forwardProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		http.Error(w, "the stand-in proxies plain HTTP only (Ray's dashboard and Serve); no tunnels", http.StatusMethodNotAllowed)
		return
	}
	if !r.URL.IsAbs() {
		http.Error(w, "this is an HTTP proxy: send absolute-URI requests (set HTTP_PROXY)", http.StatusBadRequest)
		return
	}
	dest, err := p.router.resolve(r.URL.Host, "", nil)
	if err != nil {
		p.stats.proxied(p.caller, func(c *ProxyCounts) {
			if errors.Is(err, errUnknownHost) {
				c.UnknownHost++
			} else {
				c.Refused++
			}
		})
		p.log.Debug("proxy: no route", "caller", string(p.caller), "host", r.URL.Host, "err", err)
		http.Error(w, "stand-in proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	p.stats.proxied(p.caller, func(c *ProxyCounts) {
		if dest.byPodIP {
			c.ToPodIP++
		} else {
			c.ToService++
		}
	})
	in := r.Clone(withCaller(r.Context(), p.caller))
	in.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	in.RequestURI = in.URL.RequestURI()
	in.Header.Del("Proxy-Connection")
	in.Header.Del("Proxy-Authorization")
	dest.handler.ServeHTTP(w, in)
}
