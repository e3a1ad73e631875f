package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

const rotateCommand = "rotate"

// runRotate is `syncer rotate NAMESPACE/NAME... | --all <the syncer's flags>`: it asks the running
// raysync to move the named clusters (or every cluster behind) to the current token now, whatever
// their policy: a RayService's cluster is replaced, any other cluster restarted, paced with the rest
// of the wave. It marks each RayCluster (annotation raysync.dev/rotate); raysync clears the mark when
// it starts, so each request moves a cluster exactly once.
func runRotate(args []string, stdout, stderr io.Writer) int {
	var clusters []types.NamespacedName
	var rest []string
	all := false
	for _, a := range args {
		switch {
		case a == "--all" || a == "-all":
			all = true
		case a == "-h" || a == "--help" || a == "-help":
			rotateUsage(stdout)
			return 0
		case !strings.HasPrefix(a, "-"):
			nn, err := parseNamespacedName("rotate", a)
			if err != nil {
				fmt.Fprintln(stderr, "syncer rotate:", err)
				return statusError
			}
			clusters = append(clusters, nn)
		default:
			rest = append(rest, a)
		}
	}
	err := rotate(clusters, all, rest, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "syncer rotate:", firstLine(err.Error()))
		return statusError
	}
	return 0
}

func rotate(clusters []types.NamespacedName, all bool, flags []string, stdout io.Writer) error {
	if all == (len(clusters) > 0) {
		return errors.New("name clusters (NAMESPACE/NAME) or give --all, not both and not neither")
	}
	var cfg *config
	var err error
	if all {
		// Which clusters are behind is what `syncer status` says: it needs the same scope flags.
		if cfg, err = parseFlags(append(flags, "--leader-elect=false"), os.Getenv); err != nil {
			return err
		}
		report, err := collectStatus(cfg)
		if err != nil {
			return err
		}
		for _, c := range report.Clusters {
			if c.Rotation != nil && (c.Rotation.State == names.TokenBehind || c.Rotation.State == names.TokenBlocked) {
				clusters = append(clusters, types.NamespacedName{Namespace: c.Namespace, Name: c.RayCluster})
			}
		}
	} else {
		cfg = &config{}
		fs := flag.NewFlagSet("rotate", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.StringVar(&cfg.kubeconfig, "kubeconfig", "", "kubeconfig file")
		if err := fs.Parse(flags); err != nil {
			return err
		}
	}
	rc, err := restConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{
		names.RotateAnnotation: time.Now().UTC().Format(time.RFC3339)}}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range clusters {
		if _, err := dyn.Resource(kuberay.RayClusterGVR).Namespace(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: "raysync-rotate"}); err != nil {
			return fmt.Errorf("mark RayCluster %s: %w", c, err)
		}
		fmt.Fprintf(stdout, "%s: rotation requested\n", c)
	}
	if len(clusters) == 0 {
		fmt.Fprintln(stdout, "no cluster is behind the current token")
	}
	return nil
}

func rotateUsage(w io.Writer) {
	fmt.Fprint(w, `usage: syncer rotate NAMESPACE/NAME... [--kubeconfig FILE]
       syncer rotate --all --auth-source=NAMESPACE/NAME (--namespaces=a,b | --all-namespaces) [flags]

Asks the running raysync to move the named RayClusters (or, with --all, every cluster behind the
current canonical token) to the current token now, whatever their rotation policy: a RayService's
cluster is replaced (KubeRay's zero-downtime upgrade), any other cluster restarted as a whole. raysync
paces these with the rest of the wave (--max-concurrent-rotations) and never touches a RayJob's
cluster while its job runs. Each request moves a cluster once; "syncer status" shows the progress.
`)
}
