package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

// runRotate is `syncer rotate TARGET... | --all <the syncer's flags>`: it asks the running raysync to
// move the named clusters (or every cluster behind) to the current token now, whatever their policy:
// a RayService's cluster is replaced, any other cluster restarted, paced with the rest of the wave. It
// says what it will do to each target before it marks anything (annotation raysync.dev/rotate, which
// raysync clears when it starts, so each request moves a cluster once); a target that is not behind,
// or that raysync cannot move, is refused: nothing is marked for it and the exit code is 1.
func runRotate(cfg *config, targets []string, stdout, stderr io.Writer) int {
	var err error
	if cfg.all == (len(targets) > 0) {
		err = errors.New("name clusters (NAMESPACE/NAME, or rayservice/NAMESPACE/NAME and the like) or give --all, not both and not neither")
	}
	var refused int
	if err == nil {
		refused, err = rotate(cfg, targets, stdout)
	}
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "syncer rotate:", firstLine(err.Error()))
		return statusError
	case refused > 0:
		return statusOutOfSync
	}
	return 0
}

// rotateDecision is what `syncer rotate` does to one RayCluster.
type rotateDecision struct {
	cluster types.NamespacedName
	action  string // "replaced" or "restarted"; "" when refused
	why     string
}

// decideRotation says what a request does to a cluster, from where it stands (what the controller
// would make of the mark).
func decideRotation(c projection.ClusterStatus) rotateDecision {
	d := rotateDecision{cluster: types.NamespacedName{Namespace: c.Namespace, Name: c.RayCluster}}
	r := c.Rotation
	switch {
	case r == nil:
		d.why = "raysync does not manage this cluster's token (token state " + projection.Display(c.Token) + ")"
	case r.State == names.TokenCurrent:
		d.why = "not behind: it runs on the current canonical token; nothing to do"
	case r.State == names.TokenRotating || r.State == names.TokenBlocked:
		d.why = "already " + r.State + ": its replacement or restart is in flight"
	case r.Unmovable != "":
		// Whatever its policy: a restart of a cluster whose Secret others run on would never end.
		d.why = "raysync cannot move it: " + r.Unmovable
	case r.Move == names.PolicyReplace:
		d.action = "replaced"
		d.why = "its RayService " + c.Owner + " starts a new cluster on the current token; traffic switches when it serves"
	default:
		d.action = "restarted"
		d.why = "every pod stops, then all start on the current token"
		if c.OwnerKind == names.OwnerRayJob {
			d.why += " (not while its RayJob " + c.Owner + " runs)"
		}
	}
	return d
}

// resolveTargets turns what a user names into RayClusters: NAMESPACE/NAME is a RayCluster, else the
// clusters of a RayService or RayJob of that name; KIND/NAMESPACE/NAME says which.
func resolveTargets(report *statusReport, targets []string) (map[string][]projection.ClusterStatus, error) {
	out := map[string][]projection.ClusterStatus{}
	for _, t := range targets {
		parts := strings.Split(t, "/")
		kind := ""
		if len(parts) == 3 {
			kind, parts = strings.ToLower(parts[0]), parts[1:]
		}
		if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
			return nil, fmt.Errorf("%q: want NAMESPACE/NAME or KIND/NAMESPACE/NAME (kind raycluster, rayservice or rayjob)", t)
		}
		ns, name := parts[0], parts[1]
		byKind := map[string][]projection.ClusterStatus{}
		for _, c := range report.Clusters {
			if c.Namespace != ns {
				continue
			}
			if c.RayCluster == name {
				byKind["raycluster"] = append(byKind["raycluster"], c)
			}
			if c.Owner == name && c.OwnerKind != "" {
				k := strings.ToLower(string(c.OwnerKind))
				byKind[k] = append(byKind[k], c)
			}
		}
		switch {
		case kind != "" && kind != "raycluster" && kind != "rayservice" && kind != "rayjob":
			return nil, fmt.Errorf("%q: unknown kind %q (raycluster, rayservice or rayjob)", t, kind)
		case kind != "":
			out[t] = byKind[kind]
		case len(byKind) > 1:
			return nil, fmt.Errorf("%q names more than one kind of object: say which, e.g. rayservice/%s/%s", t, ns, name)
		default:
			for _, cs := range byKind {
				out[t] = cs
			}
		}
		if len(out[t]) == 0 {
			return nil, fmt.Errorf("%q: no RayCluster, RayService or RayJob of that name is in raysync's scope", t)
		}
	}
	return out, nil
}

// rotate decides, says and marks; it returns how many targets were refused.
func rotate(cfg *config, targets []string, stdout io.Writer) (int, error) {
	report, err := collectStatus(cfg)
	if err != nil {
		return 0, err
	}
	rc, err := restConfig(cfg)
	if err != nil {
		return 0, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return requestRotations(ctx, cfg, report, targets, dyn, stdout)
}

// requestRotations decides from report, says what it will do to each target, and marks the clusters
// it moves (with --dry-run it says what it would do and marks nothing).
func requestRotations(ctx context.Context, cfg *config, report *statusReport, targets []string, dyn dynamic.Interface, stdout io.Writer) (int, error) {
	var decisions []rotateDecision
	refused := 0
	if cfg.all {
		for _, c := range report.Clusters {
			if d := decideRotation(c); d.action != "" {
				decisions = append(decisions, d)
			}
		}
		if len(decisions) == 0 {
			fmt.Fprintln(stdout, "no cluster is behind the current token")
			return 0, nil
		}
	} else {
		resolved, err := resolveTargets(report, targets)
		if err != nil {
			return 0, err
		}
		for _, t := range targets {
			moved := false
			var notes []rotateDecision
			for _, c := range resolved[t] {
				d := decideRotation(c)
				if d.action != "" {
					decisions, moved = append(decisions, d), true
				} else {
					notes = append(notes, d)
				}
			}
			if !moved {
				refused++
				for _, d := range notes {
					fmt.Fprintf(stdout, "%s: refused: %s\n", d.cluster, d.why)
				}
			}
		}
	}
	will := "will be"
	if cfg.dryRun {
		will = "would be"
	}
	for _, d := range decisions {
		fmt.Fprintf(stdout, "%s: %s %s: %s\n", d.cluster, will, d.action, d.why)
	}
	if len(decisions) == 0 {
		return refused, nil
	}
	if cfg.dryRun {
		fmt.Fprintln(stdout, "(dry run: nothing marked)")
		return refused, nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		names.RotateAnnotation: time.Now().UTC().Format(time.RFC3339)}}})
	for _, d := range decisions {
		if _, err := dyn.Resource(kuberay.RayClusterGVR).Namespace(d.cluster.Namespace).Patch(ctx, d.cluster.Name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: "raysync-rotate"}); err != nil {
			return refused, fmt.Errorf("mark RayCluster %s: %w", d.cluster, err)
		}
		fmt.Fprintf(stdout, "%s: rotation requested\n", d.cluster)
	}
	return refused, nil
}
