package gateway

import "strings"

// What Ray 2.60 does, read from its wheel (ray/dashboard/http_server_head.py,
// ray/_private/authentication/http_token_authentication.py and grpc_authentication_server_interceptor.py,
// ray/_private/ray_constants.py) and checked against real Ray in e2e (TestRealRayThroughTheGateway).

// What Ray reads a client's token from: the HTTP middleware takes Authorization, then
// X-Ray-Authorization, then the cookie; Ray Client's gRPC interceptor only the authorization
// metadata. Each carries "Bearer <token>" (the cookie the bare token).
const (
	cookieName   = "ray-authentication-token"
	bearerPrefix = "Bearer "
	cookieMaxAge = 30 * 24 * 60 * 60 // Ray's own
)

// The dashboard's answers when its token middleware refuses a request: the only 401 and 403 that
// are about the token. Ray answers 403 for other reasons too (its path cleaning refuses traversal out
// of /static and /logs, browsers may not POST, profiling is off), none of which is the token's fault.
const (
	rayMissingToken = "Unauthorized: Missing authentication token"
	rayInvalidToken = "Forbidden: Invalid authentication token"
)

// rayClientRefusal is Ray Client's (and every Ray gRPC server's) refusal of a token: status
// UNAUTHENTICATED with this message.
const rayClientRefusal = "Invalid or missing authentication token"

// MaxDashboardBody is the largest request body Ray's dashboard accepts (aiohttp's client_max_size,
// ray_constants.DASHBOARD_CLIENT_MAX_SIZE: a job's working_dir package).
const MaxDashboardBody = 100 << 20

// rayOpenExact and rayOpenPrefixes are the paths the dashboard serves without a token
// (public_exact_paths and public_path_prefixes): the page and assets a browser needs to show the
// login, the login itself and health checks.
var (
	rayOpenExact = map[string]bool{"/": true, "/favicon.ico": true, "/api/authentication_mode": true,
		"/api/authenticate": true, "/api/healthz": true, "/api/gcs_healthz": true, "/api/local_raylet_healthz": true,
		"/-/healthz": true}
	rayOpenPrefixes = []string{"/static/"}
)

// RayServesWithoutToken reports whether Ray's dashboard serves path without a token. path is
// compared as Ray's middleware compares aiohttp's request.path: percent-decoded and not normalised,
// which is what Go's URL.Path holds. So "/static/..%2fapi/jobs/" is open to Ray too (its path
// cleaning then refuses it, 403): the gateway forwards such a request without any token, and the
// cluster's credential can never reach a path Ray decides on without one.
func RayServesWithoutToken(path string) bool {
	if rayOpenExact[path] {
		return true
	}
	for _, p := range rayOpenPrefixes {
		if strings.HasPrefix(path, p) {
			return true
		}
	}
	return false
}

// RayOpenPathCases are request targets as a client sends them, and whether Ray 2.60's dashboard
// serves each without a token. RayServesWithoutToken is tested against them here, and e2e checks them
// against real Ray (TestRealRayThroughTheGateway): every row is one Ray and the gateway must agree on.
var RayOpenPathCases = []struct {
	Target string
	Open   bool
}{
	{"/", true},
	{"/favicon.ico", true},
	{"/api/authentication_mode", true},
	{"/api/authenticate", true}, // GET: Ray answers 405, not 401
	{"/api/healthz", true},
	{"/api/gcs_healthz", true},
	{"/api/local_raylet_healthz", true},
	{"/-/healthz", true},
	{"/static/", true},
	{"/static/css/nothing-here.css", true},
	{"/%73tatic/css/nothing-here.css", true}, // Ray decodes before it compares
	{"/static/../api/jobs/", true},           // open to the token check; Ray's path cleaning refuses it
	{"/static/..%2fapi/jobs/", true},
	{"/static/%2e%2e/api/jobs/", true},
	{"/static/%2e%2e%2fapi%2fjobs%2f", true},
	{"/api/jobs/", false},
	{"/api/version", false},
	{"/api/serve/applications/", false},
	{"/api/jobs/%2e%2e/healthz", false}, // not normalised: never /api/healthz
	{"/%61pi/jobs/", false},
	{"/static", false},
	{"/STATIC/css/x.css", false},
	{"//static/css/x.css", false},
	{"/./static/css/x.css", false},
	{"/api/healthz/", false},
	{"/api/healthz%2f", false},
	{"/favicon.ico/", false},
	{"/logs/", false},
	{"/nodes", false},
	{"/index.html", false},
}
