package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/projection"
)

const (
	adoptCommand  = "adopt"
	pauseCommand  = "pause"
	resumeCommand = "resume"
)

const adoptLong = `Lets raysync move clusters it did not adopt: those running on a token raysync did not write (they ran before
raysync was installed, or were created while it was down), which raysync otherwise never replaces or
restarts, whatever their policy (syncer status: not_adopted). Adopted, each moves by its policy through the
paced wave: a RayService's cluster is replaced, a cluster with the restart policy restarted, one with hold
held until syncer rotate.

TARGET (NAMESPACE/NAME or KIND/NAMESPACE/NAME, as syncer rotate takes) adopts one unit: raysync.dev/adopt=true
on the RayService, else on the RayCluster (a RayJob's cluster: raysync may not write RayJobs; put the
annotation on the RayJob in its manifest to adopt the clusters it creates later). namespace/NS adopts every
cluster of a namespace and --all every cluster in scope, those created later included: both write the
control ConfigMap's adopt key (--control), which GitOps can hold instead.

It first says, for each cluster, what adopting it does, and how many clusters' capacity the replacements need
at once (--max-concurrent-rotations); --dry-run says only that. Adoption lasts: a RayService raysync adopted
stays adopted (raysync.dev/adopted), its later clusters move by its policy. Exit 0 adopted (or would be),
1 nothing to adopt, 2 error.`

const pauseLong = `Stops raysync from starting any further replacement or restart, at once, on every replica and across restarts:
it writes paused: "true" (with --reason and the time) into the control ConfigMap (--control), which every
replica reads. Replacements and restarts in flight finish (or are held by their policy's rules); token
projection into new clusters, pull secrets, the autoscaler's TLS and the gateway go on. syncer status,
raysync_rotation_paused and the alert RaysyncRotationPaused show it. syncer resume continues the wave where
it stopped. --dry-run says what it would do. Exit 0 paused (or would be), 1 already paused, 2 error.`

const resumeLong = `Lets raysync start replacements and restarts again after syncer pause (the control ConfigMap's paused:
"false"). The wave continues where it stopped. Exit 0 resumed (or would be), 1 not paused, 2 error.`

// adoption is what adopting one not-adopted cluster does.
type adoption struct {
	cluster projection.ClusterStatus
	action  string // "replaced", "restarted" or "held" (by its policy)
	why     string
}

func adoptionOf(c projection.ClusterStatus) adoption {
	a := adoption{cluster: c}
	switch r := c.Rotation; {
	case r.Unmovable != "":
		a.action, a.why = "held", "raysync cannot move it: "+r.Unmovable
	case r.Policy == names.PolicyReplace:
		a.action, a.why = "replaced", "its RayService "+c.Owner+" starts a new cluster on the current token; traffic switches when it serves"
	case r.Policy == names.PolicyRestart:
		a.action, a.why = "restarted", "every pod stops, then all start on the current token"
	case r.Policy == names.PolicyGateway:
		a.action, a.why = "held", "the gateway policy: clients reach it through the gateway, which accepts the canonical token"
	default:
		a.action, a.why = "held", "its policy is hold: syncer rotate moves it"
		if r.Held != "" {
			a.why = "held: " + r.Held
		}
	}
	return a
}

// capacity says what adopting these clusters costs at once: replacements run a second cluster each
// until traffic switches, restarts take clusters offline, at most maxConcurrent of either at a time.
func capacity(as []adoption, maxConcurrent int) string {
	n := map[string]int{}
	for _, a := range as {
		n[a.action]++
	}
	return fmt.Sprintf("%d cluster(s): %d replaced (%d at a time: the capacity of %d more cluster(s), GPUs included, while they run side by side), "+
		"%d restarted (%d at a time offline), %d held", len(as), n["replaced"], min(n["replaced"], maxConcurrent), min(n["replaced"], maxConcurrent),
		n["restarted"], min(n["restarted"], maxConcurrent), n["held"])
}

func runAdopt(cfg *config, targets []string, stdout, stderr io.Writer) int {
	var err error
	var units []string
	for _, t := range targets {
		if ns, ok := strings.CutPrefix(t, "namespace/"); ok && ns != "" && !strings.Contains(ns, "/") {
			cfg.adoptNamespaces = append(cfg.adoptNamespaces, ns)
		} else {
			units = append(units, t)
		}
	}
	if cfg.all == (len(targets) > 0) || (len(units) > 0 && len(cfg.adoptNamespaces) > 0) {
		err = errors.New("name clusters (NAMESPACE/NAME or KIND/NAMESPACE/NAME), or namespaces (namespace/NS), or give --all: one of the three")
	}
	targets = units
	code := 0
	if err == nil {
		code, err = adopt(cfg, targets, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "syncer adopt:", firstLine(err.Error()))
		return statusError
	}
	return code
}

func adopt(cfg *config, targets []string, stdout io.Writer) (int, error) {
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
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return adoptClusters(ctx, cfg, report, targets, kube, dyn, stdout)
}

// adoptClusters decides from report, says what adopting does to each cluster, and adopts (with
// --dry-run it only says).
func adoptClusters(ctx context.Context, cfg *config, report *statusReport, targets []string, kube kubernetes.Interface, dyn dynamic.Interface, stdout io.Writer) (int, error) {
	notAdopted := func(c projection.ClusterStatus) bool {
		return c.Rotation != nil && c.Rotation.State == names.TokenNotAdopted
	}
	var chosen []projection.ClusterStatus
	switch {
	case len(targets) > 0:
		resolved, err := resolveTargets(report, targets)
		if err != nil {
			return 0, err
		}
		for _, t := range targets {
			for _, c := range resolved[t] {
				if notAdopted(c) {
					chosen = append(chosen, c)
				} else {
					fmt.Fprintf(stdout, "%s/%s: nothing to adopt: %s\n", c.Namespace, c.RayCluster, notAdoptedWhy(c))
				}
			}
		}
	default:
		for _, c := range report.Clusters {
			if notAdopted(c) && (cfg.all || slices.Contains(cfg.adoptNamespaces, c.Namespace)) {
				chosen = append(chosen, c)
			}
		}
	}
	will := "will be"
	if cfg.dryRun {
		will = "would be"
	}
	var as []adoption
	for _, c := range chosen {
		a := adoptionOf(c)
		as = append(as, a)
		owner := ""
		if c.Owner != "" {
			owner = " (" + string(c.OwnerKind) + " " + c.Namespace + "/" + c.Owner + ")"
		}
		fmt.Fprintf(stdout, "%s/%s%s: %s %s: %s\n", c.Namespace, c.RayCluster, owner, will, a.action, a.why)
	}
	if len(targets) > 0 && len(as) == 0 {
		return statusOutOfSync, nil
	}
	if len(as) > 0 {
		fmt.Fprintf(stdout, "adopting %s\n", capacity(as, cfg.maxConcurrentRotation))
	} else {
		fmt.Fprintln(stdout, "no cluster there runs on a token raysync did not write")
	}
	if cfg.dryRun {
		fmt.Fprintln(stdout, "(dry run: nothing changed)")
		return 0, nil
	}
	if len(targets) == 0 {
		// Clusters created there later are adopted too: the ConfigMap says so, not each unit.
		return 0, adoptInControl(ctx, cfg, kube, stdout)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{names.AdoptAnnotation: "true"}}})
	done := map[string]bool{}
	for _, a := range as {
		c := a.cluster
		gvr, name := kuberay.RayClusterGVR, c.RayCluster
		if c.OwnerKind == names.OwnerRayService {
			gvr, name = kuberay.RayServiceGVR, c.Owner
		}
		key := gvr.Resource + "/" + c.Namespace + "/" + name
		if done[key] {
			continue
		}
		done[key] = true
		if _, err := dyn.Resource(gvr).Namespace(c.Namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "raysync-adopt"}); err != nil {
			return 0, fmt.Errorf("annotate %s: %w", key, err)
		}
		fmt.Fprintf(stdout, "annotated %s %s=true\n", key, names.AdoptAnnotation)
	}
	return 0, nil
}

func notAdoptedWhy(c projection.ClusterStatus) string {
	if c.Rotation == nil {
		return "raysync does not manage its token (token state " + projection.Display(c.Token) + ")"
	}
	return "it is " + c.Rotation.State + " (only a cluster on a token raysync did not write needs adopting)"
}

// adoptInControl adds the namespaces (or all) to the control ConfigMap's adopt key.
func adoptInControl(ctx context.Context, cfg *config, kube kubernetes.Interface, stdout io.Writer) error {
	return updateControl(ctx, cfg, kube, func(data map[string]string) (bool, string) {
		have := strings.FieldsFunc(data[names.ControlAdoptKey], func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' })
		add := cfg.adoptNamespaces
		if cfg.all {
			add = []string{"all"}
		}
		changed := false
		for _, n := range add {
			if !slices.Contains(have, n) {
				have, changed = append(have, n), true
			}
		}
		data[names.ControlAdoptKey] = strings.Join(have, ",")
		return changed, fmt.Sprintf("adopted in %s: %s=%s", cfg.control, names.ControlAdoptKey, data[names.ControlAdoptKey])
	}, stdout)
}

// updateControl changes the control ConfigMap's data with change (which says whether it changed
// anything, and what it did), with the resourceVersion it read.
func updateControl(ctx context.Context, cfg *config, kube kubernetes.Interface, change func(map[string]string) (bool, string), stdout io.Writer) error {
	n := cfg.control
	if n.Name == "" {
		return errors.New("--control is \"-\": there is no control ConfigMap")
	}
	cm, err := kube.CoreV1().ConfigMaps(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("the control ConfigMap %s does not exist: the chart and the kustomize base create it (or create it yourself: kubectl -n %s create configmap %s)", n, n.Namespace, n.Name)
	}
	if err != nil {
		return fmt.Errorf("control ConfigMap %s: %w", n, err)
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	changed, what := change(cm.Data)
	if !changed {
		fmt.Fprintln(stdout, "already so: "+what)
		return nil
	}
	if _, err := kube.CoreV1().ConfigMaps(n.Namespace).Update(ctx, cm, metav1.UpdateOptions{FieldManager: "raysync-control"}); err != nil {
		return fmt.Errorf("update the control ConfigMap %s: %w", n, err)
	}
	fmt.Fprintln(stdout, what)
	return nil
}

// runPause is `syncer pause` (paused true) and `syncer resume` (false).
func runPause(cfg *config, paused bool, stdout, stderr io.Writer) int {
	name := pauseCommand
	if !paused {
		name = resumeCommand
	}
	kube, err := kubeClient(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "syncer %s: %v\n", name, err)
		return statusError
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code, err := pause(ctx, cfg, kube, paused, stdout)
	if err != nil {
		fmt.Fprintf(stderr, "syncer %s: %s\n", name, firstLine(err.Error()))
		return statusError
	}
	return code
}

func pause(ctx context.Context, cfg *config, kube kubernetes.Interface, paused bool, stdout io.Writer) (int, error) {
	code := 0
	change := func(data map[string]string) (bool, string) {
		if was := data[names.ControlPausedKey]; (was == "true") == paused && (was == "" || was == "true" || was == "false") {
			code = statusOutOfSync
			if paused {
				return false, "the wave is paused (" + names.ControlPausedKey + ": true)"
			}
			return false, "the wave is not paused"
		}
		if !paused {
			data[names.ControlPausedKey] = "false"
			delete(data, names.ControlReasonKey)
			delete(data, names.ControlPausedAtKey)
			return true, "resumed: raysync starts replacements and restarts again, where the wave stopped"
		}
		data[names.ControlPausedKey] = "true"
		data[names.ControlPausedAtKey] = time.Now().UTC().Format(time.RFC3339)
		if cfg.reason != "" {
			data[names.ControlReasonKey] = cfg.reason
		}
		return true, "paused: raysync starts no replacement or restart; those in flight finish (syncer status shows them)"
	}
	if cfg.dryRun {
		cm, err := kube.CoreV1().ConfigMaps(cfg.control.Namespace).Get(ctx, cfg.control.Name, metav1.GetOptions{})
		if err != nil {
			return 0, fmt.Errorf("control ConfigMap %s: %w", cfg.control, err)
		}
		data := map[string]string{}
		for k, v := range cm.Data {
			data[k] = v
		}
		changed, what := change(data)
		if changed {
			fmt.Fprintln(stdout, "would be "+what+" (dry run: nothing changed)")
		} else {
			fmt.Fprintln(stdout, "already so: "+what)
		}
		return code, nil
	}
	return code, updateControl(ctx, cfg, kube, change, stdout)
}

// controlLines says what the control ConfigMap does, for syncer status.
func controlLines(c projection.ControlStatus, now time.Time) []string {
	var out []string
	if c.Paused {
		l := "PAUSED: raysync starts no replacement or restart (those in flight finish)"
		if c.Since != nil {
			l += ", since " + c.Since.Format(time.RFC3339) + " (" + now.Sub(*c.Since).Round(time.Second).String() + ")"
		}
		if c.Reason != "" {
			l += ": " + c.Reason
		}
		out = append(out, l+"; syncer resume continues the wave")
	}
	switch {
	case c.AdoptAll:
		out = append(out, "adopted: every namespace in scope")
	case len(c.Adopt) > 0:
		out = append(out, "adopted namespaces: "+strings.Join(c.Adopt, ", "))
	}
	for _, p := range c.Problems {
		out = append(out, "control ConfigMap: "+p)
	}
	return out
}
