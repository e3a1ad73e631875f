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
// their order: Authorization: Bearer, then X-Ray-Authorization, then the cookie. The first source
// present wins, even when a later one would have held the right token.
func presentedToken(h http.Header) (string, bool) {
	if v, ok := strings.CutPrefix(h.Get("Authorization"), bearerPrefix); ok {
		return v, true
	}
	if v := h.Get(rayAuthorizationHeader); v != "" {
		return strings.TrimPrefix(v, bearerPrefix), true
	}
	if c, err := (&http.Request{Header: h}).Cookie(rayAuthCookie); err == nil && c.Value != "" {
		return c.Value, true
	}
	return "", false
}

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
