package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/raysync/raysync/internal/informer"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

// Exit codes of `syncer status`, usable from cron and CI.
const (
	statusInSync    = 0
	statusOutOfSync = 1
	statusError     = 2
)

// statusReport is `syncer status -o json`. It never contains a token.
type statusReport struct {
	Now      time.Time                  `json:"now"`
	InSync   bool                       `json:"inSync"`
	Sources  []statusSource             `json:"sources"`
	Clusters []projection.ClusterStatus `json:"clusters"`
	// Control is what the control ConfigMap says: the wave paused, namespaces adopted.
	Control projection.ControlStatus `json:"control"`
	// NotAdopted says what adopting every cluster not adopted would do ("" when none is).
	NotAdopted string `json:"notAdopted,omitempty"`
}

type statusSource struct {
	Source   string     `json:"source"`
	Valid    bool       `json:"valid"`
	NotAfter *time.Time `json:"notAfter,omitempty"`
}

// runStatus is `syncer status [-o table|json] <the syncer's flags>`: a read-only report of every
// in-scope RayCluster, computed exactly as the controller computes its metrics.
func runStatus(cfg *config, stdout, stderr io.Writer) int {
	var err error
	if cfg.output != "table" && cfg.output != "json" {
		err = fmt.Errorf("-o %q: want table or json", cfg.output)
	}
	var report *statusReport
	if err == nil {
		report, err = collectStatus(cfg)
	}
	if err == nil {
		if cfg.output == "json" {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			err = enc.Encode(report)
		} else {
			printStatus(stdout, report)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "syncer status:", firstLine(err.Error()))
		return statusError
	}
	if report.InSync {
		return statusInSync
	}
	return statusOutOfSync
}

func collectStatus(cfg *config) (*statusReport, error) {
	rc, err := restConfig(cfg)
	if err != nil {
		return nil, err
	}
	rc.Timeout = 30 * time.Second
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	md, err := metadata.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	caches := informer.New(kube, dyn, md, cfg.informer())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	caches.Start(ctx.Done())
	if !caches.WaitForSync(ctx.Done()) {
		return nil, errors.New("could not list RayClusters, Secrets and Pods within 60s (check --kubeconfig and RBAC)")
	}
	reporter := projection.NewReporter(caches, cfg.projection())
	srcStates, clusters := reporter.Status()
	sort.Slice(clusters, func(i, j int) bool {
		if clusters[i].Namespace != clusters[j].Namespace {
			return clusters[i].Namespace < clusters[j].Namespace
		}
		return clusters[i].RayCluster < clusters[j].RayCluster
	})
	report := &statusReport{Now: time.Now().UTC().Truncate(time.Second), InSync: true, Clusters: clusters}
	for _, s := range srcStates {
		ss := statusSource{Source: s.Source, Valid: s.Valid}
		if !s.NotAfter.IsZero() {
			t := s.NotAfter.UTC()
			ss.NotAfter = &t
		}
		report.Sources = append(report.Sources, ss)
		report.InSync = report.InSync && s.Valid
	}
	var as []adoption
	for _, c := range clusters {
		report.InSync = report.InSync && c.InSync()
		if c.Rotation != nil && c.Rotation.State == names.TokenNotAdopted {
			as = append(as, adoptionOf(c))
		}
	}
	if len(as) > 0 {
		report.NotAdopted = "not adopted (raysync moves nothing of them until adopted: syncer adopt --dry-run): adopting all would move " +
			capacity(as, cfg.maxConcurrentRotation)
	}
	report.Control = reporter.Control()
	report.InSync = report.InSync && !report.Control.Paused && len(report.Control.Problems) == 0
	return report, nil
}

// rotationColumn is a cluster's token rotation state: "current", or "behind 3h (hold)" and the like.
func rotationColumn(r *projection.RotationStatus, now time.Time) string {
	if r == nil {
		return "-"
	}
	if r.State == names.TokenCurrent {
		return r.State
	}
	out := r.State
	if r.State == names.TokenNotAdopted {
		out = "not adopted"
	}
	if r.Since != nil {
		out += " " + now.Sub(*r.Since).Round(time.Second).String()
	}
	out += " (" + r.Policy
	switch {
	case r.Held != "":
		out += ": " + r.Held
	case r.Unmovable != "":
		out += "; raysync cannot move it: " + r.Unmovable
	}
	return out + ")"
}

func printStatus(w io.Writer, r *statusReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tVALID\tEXPIRES")
	for _, s := range r.Sources {
		exp := "-"
		if s.NotAfter != nil {
			exp = s.NotAfter.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%v\t%s\n", s.Source, s.Valid, exp)
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tRAYCLUSTER\tOWNER\tMODE\tTOKEN\tROTATION\tSTALE PODS\tPULL SECRET\tAUTOSCALER TLS")
	for _, c := range r.Clusters {
		owner := "-"
		if c.Owner != "" {
			owner = string(c.OwnerKind) + "/" + c.Owner
		}
		mode := string(c.Mode)
		if mode == "" {
			mode = "-"
		}
		stale := 0
		for _, n := range c.StalePods {
			stale += n
		}
		tls := projection.Display(c.AutoscalerTLS)
		if c.Deferred {
			tls += " (deferred)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", c.Namespace, c.RayCluster, owner, mode,
			projection.Display(c.Token), rotationColumn(c.Rotation, r.Now), stale, projection.Display(c.PullSecret), tls)
	}
	_ = tw.Flush()
	if len(r.Clusters) == 0 {
		fmt.Fprintln(w, "(no RayClusters in scope)")
	}
	var invalid []string
	for _, c := range r.Clusters {
		for _, v := range c.InvalidAnnotations() {
			invalid = append(invalid, c.Namespace+"/"+c.RayCluster+": "+v)
		}
	}
	if len(invalid) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "unreadable raysync annotations (Event InvalidAnnotation; each read the safest way):")
		for _, l := range invalid {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if r.NotAdopted != "" {
		fmt.Fprintln(w)
		fmt.Fprintln(w, r.NotAdopted)
	}
	if lines := controlLines(r.Control, r.Now); len(lines) > 0 {
		fmt.Fprintln(w)
		for _, l := range lines {
			fmt.Fprintln(w, l)
		}
	}
}
