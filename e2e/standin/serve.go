package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Serve application statuses as Ray's REST API reports them.
const (
	appDeploying = "DEPLOYING"
	appRunning   = "RUNNING"
)

// serveApp is one declared Serve application.
type serveApp struct {
	Name        string   `json:"name"`
	RoutePrefix string   `json:"route_prefix"`
	ImportPath  string   `json:"import_path"`
	Deployments []string `json:"-"`
	config      string   // its declaration, to tell a redeploy from a repeat
	deployedAt  time.Time
}

// serveState is a head's Serve controller: what was deployed and when. It lives as long as the head
// (no GCS fault tolerance): a new head starts with no applications.
type serveState struct {
	mu          sync.Mutex
	apps        map[string]*serveApp
	deployDelay time.Duration // DEPLOYING → RUNNING
}

func newServeState(deployDelay time.Duration) *serveState {
	return &serveState{apps: map[string]*serveApp{}, deployDelay: deployDelay}
}

// serveConfig is the body of PUT /api/serve/applications/ (KubeRay sends serveConfigV2 as JSON).
type serveConfig struct {
	Applications []json.RawMessage `json:"applications"`
}

type appConfig struct {
	Name        string `json:"name"`
	RoutePrefix string `json:"route_prefix"`
	ImportPath  string `json:"import_path"`
	Deployments []struct {
		Name string `json:"name"`
	} `json:"deployments"`
}

// apply declares the applications in body, as Serve's declarative API does: unchanged applications
// keep running, changed or new ones deploy again, missing ones are deleted.
func (s *serveState) apply(body []byte, now time.Time) error {
	var cfg serveConfig
	if err := json.Unmarshal(body, &cfg); err != nil {
		return fmt.Errorf("invalid Serve config: %w", err)
	}
	next := map[string]*serveApp{}
	for _, raw := range cfg.Applications {
		var a appConfig
		if err := json.Unmarshal(raw, &a); err != nil {
			return fmt.Errorf("invalid Serve application: %w", err)
		}
		if a.ImportPath == "" {
			return errors.New("invalid Serve application: import_path is required")
		}
		app := &serveApp{Name: a.Name, RoutePrefix: a.RoutePrefix, ImportPath: a.ImportPath, config: string(raw), deployedAt: now}
		if app.Name == "" {
			app.Name = "default"
		}
		if app.RoutePrefix == "" {
			app.RoutePrefix = "/"
		}
		if _, dup := next[app.Name]; dup {
			return fmt.Errorf("invalid Serve config: application name %q is used twice", app.Name)
		}
		for _, d := range a.Deployments {
			app.Deployments = append(app.Deployments, d.Name)
		}
		if len(app.Deployments) == 0 {
			app.Deployments = []string{deploymentFromImportPath(a.ImportPath)}
		}
		next[app.Name] = app
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, app := range next {
		if old, ok := s.apps[name]; ok && old.config == app.config {
			next[name] = old
		}
	}
	s.apps = next
	return nil
}

// deploymentFromImportPath names the deployment of "module.sub:app" or "module.sub.app" (app).
func deploymentFromImportPath(p string) string {
	if i := strings.LastIndexAny(p, ":."); i >= 0 {
		return p[i+1:]
	}
	return p
}

func (s *serveState) status(app *serveApp, now time.Time) string {
	if now.Sub(app.deployedAt) < s.deployDelay {
		return appDeploying
	}
	return appRunning
}

// serveDetails is GET /api/serve/applications/ (the fields KubeRay reads, and a few more).
type serveDetails struct {
	DeployMode    string                `json:"deploy_mode"`
	ProxyLocation string                `json:"proxy_location"`
	Applications  map[string]appDetails `json:"applications"`
}

type appDetails struct {
	Name           string                       `json:"name"`
	RoutePrefix    string                       `json:"route_prefix"`
	Status         string                       `json:"status"`
	Message        string                       `json:"message"`
	LastDeployedAt float64                      `json:"last_deployed_time_s"`
	Deployments    map[string]deploymentDetails `json:"deployments"`
}

type deploymentDetails struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message"`
}

func (s *serveState) details(now time.Time) serveDetails {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := serveDetails{DeployMode: "MULTI_APP", ProxyLocation: "EveryNode", Applications: map[string]appDetails{}}
	for name, app := range s.apps {
		status := s.status(app, now)
		depStatus := "HEALTHY"
		if status == appDeploying {
			depStatus = "UPDATING"
		}
		ad := appDetails{Name: name, RoutePrefix: app.RoutePrefix, Status: status,
			LastDeployedAt: float64(app.deployedAt.UnixMilli()) / 1000, Deployments: map[string]deploymentDetails{}}
		for _, dep := range app.Deployments {
			ad.Deployments[dep] = deploymentDetails{Name: dep, Status: depStatus}
		}
		d.Applications[name] = ad
	}
	return d
}

// running reports whether Serve has been started on the cluster (its proxies answer then).
func (s *serveState) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.apps) > 0
}

// route finds the application whose route prefix is the longest match of path.
func (s *serveState) route(path string, now time.Time) (name, status string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.apps))
	for n := range s.apps {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(s.apps[names[i]].RoutePrefix) > len(s.apps[names[j]].RoutePrefix) })
	for _, n := range names {
		if p := s.apps[n].RoutePrefix; path == p || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			return n, s.status(s.apps[n], now), true
		}
	}
	return "", "", false
}
