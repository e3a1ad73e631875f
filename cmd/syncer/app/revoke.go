package app

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

const revokeCommand = "revoke-previous"

// runRevoke is `syncer revoke-previous`: the gateway stops accepting the token before the current one
// now, instead of when its grace period ends. The mark is on the ledger (durable, the same for every
// replica); the next table raysync publishes leaves the previous token out.
func runRevoke(cfg *config, stdout, stderr io.Writer) int {
	kube, err := kubeClient(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "syncer revoke-previous:", err)
		return statusError
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return revokePrevious(ctx, cfg, kube, stdout, stderr)
}

// revokePrevious marks the ledger: the gateway no longer accepts the previous rotation's token. It
// writes only raysync's own ledger, read as one (a Secret under that name that is not raysync's, or a
// ledger it cannot read, is an error: exit 2), with the resourceVersion it read; with --dry-run it
// says what it would do and writes nothing.
func revokePrevious(ctx context.Context, cfg *config, kube kubernetes.Interface, stdout, stderr io.Writer) int {
	n := cfg.rotationLedger
	s, err := kube.CoreV1().Secrets(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(stderr, "syncer revoke-previous: rotation ledger %s: %v\n", n, err)
		return statusError
	}
	l, err := ledger.Read(s)
	if err != nil {
		fmt.Fprintf(stderr, "syncer revoke-previous: %v: left as it is\n", err)
		return statusError
	}
	prev, ok := l.Previous()
	if !ok {
		fmt.Fprintln(stdout, "no previous token: raysync has numbered one rotation so far")
		return statusOutOfSync
	}
	cur := strconv.Itoa(l[len(l)-1].ID)
	if s.Annotations[names.PreviousRevokedAnnotation] == cur {
		fmt.Fprintf(stdout, "the token of rotation %d is already revoked\n", prev.ID)
		return 0
	}
	if cfg.dryRun {
		fmt.Fprintf(stdout, "would revoke the token of rotation %d: the gateway would accept only rotation %s's (and a pending one) (dry run: nothing changed)\n", prev.ID, cur)
		return 0
	}
	s = s.DeepCopy()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[names.PreviousRevokedAnnotation] = cur
	if _, err := kube.CoreV1().Secrets(n.Namespace).Update(ctx, s, metav1.UpdateOptions{FieldManager: "raysync-revoke"}); err != nil {
		fmt.Fprintf(stderr, "syncer revoke-previous: %v\n", err)
		return statusError
	}
	fmt.Fprintf(stdout, "revoked the token of rotation %d: the gateway accepts only rotation %s's (and a pending one) from its next table\n", prev.ID, cur)
	return 0
}
