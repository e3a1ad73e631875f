package standin

import (
	"net/http"
	"strings"
)

// Ray's names for where an HTTP client puts the token (python/ray/_private/authentication).
const (
	rayAuthorizationHeader = "X-Ray-Authorization"
	rayAuthCookie          = "ray-authentication-token"
	bearerPrefix           = "Bearer "
)

// presentedToken finds the token a request carries, where Ray's HTTP servers look for it and in
// their order: Authorization, then X-Ray-Authorization, then the cookie. The first source present
// wins, even when a later one would have held the right token; a header without the exact "Bearer "
// prefix presents a token that matches none (Ray 2.60 answers 403). Checked against real Ray
// (TestEmulationMatchesRealRay).
func presentedToken(h http.Header) (string, bool) {
	for _, name := range []string{"Authorization", rayAuthorizationHeader} {
		if v := h.Get(name); v != "" {
			if t, ok := strings.CutPrefix(v, bearerPrefix); ok {
				return t, true
			}
			return malformedToken, true
		}
	}
	if c, err := (&http.Request{Header: h}).Cookie(rayAuthCookie); err == nil && c.Value != "" {
		return c.Value, true
	}
	return "", false
}

// malformedToken stands for a credential that is not "Bearer <token>": no token equals it.
const malformedToken = "\x00not a bearer token"

// verdict is what a Ray server makes of the token a caller presented.
type verdict string

const (
	accepted        verdict = "accepted"
	unauthenticated verdict = "unauthenticated" // HTTP 401: no token
	forbidden       verdict = "forbidden"       // HTTP 403: a token, not the one
)

func (v verdict) httpStatus() int {
	switch v {
	case unauthenticated:
		return http.StatusUnauthorized
	case forbidden:
		return http.StatusForbidden
	}
	return http.StatusOK
}

// rayAuth is what one Ray process loaded when it started: whether token auth is on and the MAC of
// the one token it accepts. It never changes for the life of the process.
type rayAuth struct {
	enabled bool
	token   tokenMAC
}

// check judges a presented token (nil: none presented).
func (a rayAuth) check(presented *tokenMAC) verdict {
	switch {
	case !a.enabled:
		return accepted
	case presented == nil:
		return unauthenticated
	case presented.equal(a.token):
		return accepted
	}
	return forbidden
}
