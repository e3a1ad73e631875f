package app

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/raysync/raysync/internal/gateway"
)

func TestGatewayLimitFlags(t *testing.T) {
	env := func(k string) string { return map[string]string{"POD_NAMESPACE": "raysync"}[k] }
	c, err := parseGatewayFlags(nil, env)
	if err != nil || c.limits != gateway.DefaultLimits() {
		t.Fatalf("defaults: %+v, %v", c.limits, err)
	}
	c, err = parseGatewayFlags([]string{"--max-connections=10", "--idle-timeout=1m", "--body-timeout=30s", "--header-timeout=5s"}, env)
	if err != nil || c.limits.MaxConnections != 10 || c.limits.IdleTimeout != time.Minute || c.limits.BodyTimeout != 30*time.Second ||
		c.limits.HeaderTimeout != 5*time.Second || c.limits.MaxBodyBytes != gateway.MaxDashboardBody {
		t.Fatalf("limits: %+v, %v", c.limits, err)
	}
	for _, bad := range [][]string{{"--max-connections=0"}, {"--idle-timeout=0s"}, {"--body-timeout=-1s"}, {"--header-timeout=0"}} {
		if _, err := parseGatewayFlags(bad, env); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
}

// TestGatewayWarnsWhenClusterTokensWouldGoThroughAProxy: with HTTP_PROXY set and NO_PROXY not covering
// the heads' Service names, the gateway says at start that every cluster token would go through the
// proxy (naming the proxy without its credentials); with NO_PROXY covering .svc, or no proxy, nothing.
func TestGatewayWarnsWhenClusterTokensWouldGoThroughAProxy(t *testing.T) {
	proxy, _ := url.Parse("http://user:secret-password@proxy.corp:3128")
	unless := func(noProxy ...string) func(*http.Request) (*url.URL, error) {
		return func(r *http.Request) (*url.URL, error) {
			for _, suffix := range noProxy {
				if strings.HasSuffix(r.URL.Hostname(), suffix) {
					return nil, nil
				}
			}
			return proxy, nil
		}
	}
	for name, tc := range map[string]struct {
		proxy func(*http.Request) (*url.URL, error)
		warn  bool
	}{
		"no proxy":                          {func(*http.Request) (*url.URL, error) { return nil, nil }, false},
		"a proxy, NO_PROXY without .svc":    {unless("localhost", "127.0.0.1"), true},
		"a proxy, NO_PROXY covering .svc":   {unless(".svc", ".svc.corp.local"), false},
		"a proxy, NO_PROXY for the domain":  {unless(".svc.corp.local"), false},
		"a proxy, NO_PROXY for another one": {unless(".svc.cluster.local"), true},
	} {
		w := proxyWarning(tc.proxy, "corp.local")
		if (w != "") != tc.warn {
			t.Errorf("%s: warning %q, want one: %v", name, w, tc.warn)
		}
		if strings.Contains(w, "secret-password") || strings.Contains(w, "user") {
			t.Errorf("%s: the warning names the proxy's credentials", name)
		}
		if tc.warn && (!strings.Contains(w, "NO_PROXY") || !strings.Contains(w, "proxy.corp:3128") || !strings.Contains(w, ".svc.corp.local")) {
			t.Errorf("%s: the warning %q does not say what to do", name, w)
		}
	}
}
