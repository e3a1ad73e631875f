package standin

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
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
		p.tunnel(w, r)
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

// tunnel is HTTP CONNECT to a real pod's port (Ray Client's gRPC on 10001, or anything else a real
// process serves), dialled from the node network. Emulated pods serve plain HTTP only.
func (p *forwardProxy) tunnel(w http.ResponseWriter, r *http.Request) {
	target := r.URL.Host // CONNECT host:port
	if target == "" {
		target = r.Host
	}
	dest, err := p.router.resolve(target, "", nil)
	if err != nil || dest.pod == nil || dest.pod.real == nil {
		if err == nil {
			err = errors.New("an emulated pod serves plain HTTP only; tunnels reach real pods")
		}
		http.Error(w, "stand-in proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	dest.pod.mu.Lock()
	ip := dest.pod.ip
	dest.pod.mu.Unlock()
	up, err := dest.pod.k.dialPod(r.Context(), net.JoinHostPort(ip, strconv.Itoa(dest.port)))
	if err != nil {
		http.Error(w, "stand-in proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "stand-in proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	_, _ = down.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n"))
	if n := buf.Reader.Buffered(); n > 0 {
		b, _ := buf.Peek(n)
		_, _ = up.Write(b)
	}
	p.stats.proxied(p.caller, func(c *ProxyCounts) { c.ToService++ })
	splice(down, up)
	down.Close()
	up.Close()
}
