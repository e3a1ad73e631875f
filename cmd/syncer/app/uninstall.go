package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/raysync/raysync/internal/kuberay"
	"github.com/raysync/raysync/internal/names"
)

// runUninstall is `syncer uninstall [--yes] <the syncer's flags>`: after raysync is stopped (helm
// uninstall), it lists — and with --yes does — what leaves a cluster as if raysync had never run: it
// resumes the clusters raysync suspended for a restart, removes raysync's annotations from RayClusters
// and RayServices, deletes raysync's copies that no RayCluster references (a referenced one is kept:
// pods would fail without it) and raysync's own objects (the rotation ledger, the webhook certificate
// Secret, the Lease). It never touches what raysync does not own. Exit 0 done (or nothing to do), 1 when
// something is left (raysync still running, copies still referenced), 2 error.
func runUninstall(cfg *config, stdout, stderr io.Writer) int {
	left, err := uninstall(cfg, stdout)
	switch {
	case err != nil:
		fmt.Fprintln(stderr, "syncer uninstall:", firstLine(err.Error()))
		return statusError
	case left > 0:
		return statusOutOfSync
	}
	return 0
}

// uninstallStep is one thing uninstall does.
type uninstallStep struct {
	what string // "resume RayCluster ns/x (…)"
	do   func(context.Context) error
}

// raysync's annotations on the objects it acts on (never the RayService template's rotation id: a
// change of that starts a new cluster).
var rotationAnnotations = []string{names.RotationStartedAnnotation, names.RotationTargetAnnotation, names.RotationBlockedAnnotation, names.RotateAnnotation,
	names.RotationAbandonedAnnotation, names.TokenRotationAnnotation, names.TokenWrittenAtAnnotation, names.AdoptedAnnotation}

func uninstall(cfg *config, stdout io.Writer) (left int, err error) {
	rc, err := restConfig(cfg)
	if err != nil {
		return 0, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return 0, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return uninstallWith(ctx, cfg, kube, dyn, stdout)
}

// uninstallWith is uninstall with its clients. It writes only with --yes and without --dry-run.
func uninstallWith(ctx context.Context, cfg *config, kube kubernetes.Interface, dyn dynamic.Interface, stdout io.Writer) (left int, err error) {
	ns := cfg.leaderElectionNS
	if ns == "" {
		ns = cfg.authSource.Namespace
	}
	act := cfg.yes && !cfg.dryRun
	running := false
	if lease, err := kube.CoordinationV1().Leases(ns).Get(ctx, cfg.name, metav1.GetOptions{}); err == nil && lease.Spec.RenewTime != nil &&
		time.Since(lease.Spec.RenewTime.Time) < 2*cfg.leaseDuration {
		fmt.Fprintf(stdout, "raysync is running (Lease %s/%s renewed %s ago): stop it first (helm uninstall, or scale it to 0), then run this again\n",
			ns, cfg.name, time.Since(lease.Spec.RenewTime.Time).Round(time.Second))
		if act {
			return 1, nil
		}
		// A dry run still says what uninstall would do once raysync is stopped (the guide's step 1
		// runs before helm uninstall); it exits 1, as nothing can be done yet.
		running = true
	}
	var steps []uninstallStep
	var kept []string
	scopes := cfg.namespaces
	if cfg.allNamespaces {
		scopes = []string{metav1.NamespaceAll}
	}
	for _, scope := range scopes {
		s, k, err := scopeSteps(ctx, kube, dyn, scope)
		if err != nil {
			return 0, err
		}
		steps, kept = append(steps, s...), append(kept, k...)
	}
	own, ownKept := ownSteps(ctx, kube, cfg, ns)
	steps, kept = append(steps, own...), append(kept, ownKept...)
	verb := "would "
	if act {
		verb = ""
	}
	for _, s := range steps {
		if act {
			if err := s.do(ctx); err != nil && !apierrors.IsNotFound(err) {
				return 0, fmt.Errorf("%s: %w", s.what, err)
			}
		}
		fmt.Fprintf(stdout, "%s%s\n", verb, s.what)
	}
	for _, k := range kept {
		fmt.Fprintln(stdout, "keep "+k)
	}
	if len(steps) == 0 && len(kept) == 0 {
		fmt.Fprintln(stdout, "nothing of raysync's is left")
	}
	switch {
	case cfg.dryRun && len(steps) > 0:
		fmt.Fprintln(stdout, "(dry run: nothing changed; run again with --yes and without --dry-run to do it)")
	case !act && len(steps) > 0:
		fmt.Fprintln(stdout, "(dry run: run again with --yes to do it)")
	}
	if running {
		return max(len(kept), 1), nil
	}
	return len(kept), nil
}

// scopeSteps is what uninstall does in one watched namespace ("" all): clusters, RayServices, copies.
func scopeSteps(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, scope string) (steps []uninstallStep, kept []string, err error) {
	clusters, err := dyn.Resource(kuberay.RayClusterGVR).Namespace(scope).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list RayClusters: %w", err)
	}
	referenced := map[types.NamespacedName][]string{} // Secret -> RayClusters that name it
	for i := range clusters.Items {
		rc := &clusters.Items[i]
		for _, n := range secretsNamedBy(rc) {
			key := types.NamespacedName{Namespace: rc.GetNamespace(), Name: n}
			referenced[key] = append(referenced[key], rc.GetName())
		}
		if s := annotationStep(dyn, kuberay.RayClusterGVR, rc, true); s != nil {
			steps = append(steps, *s)
		}
	}
	services, err := dyn.Resource(kuberay.RayServiceGVR).Namespace(scope).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list RayServices: %w", err)
	}
	for i := range services.Items {
		if s := annotationStep(dyn, kuberay.RayServiceGVR, &services.Items[i], false); s != nil {
			steps = append(steps, *s)
		}
	}
	copies, err := kube.CoreV1().Secrets(scope).List(ctx, metav1.ListOptions{LabelSelector: names.ManagedByLabel + "=" + names.ManagedByValue})
	if err != nil {
		return nil, nil, fmt.Errorf("list raysync's copies: %w", err)
	}
	for i := range copies.Items {
		s := copies.Items[i]
		kind, ok := names.ParseKind(s.Annotations[names.KindAnnotation])
		if !ok {
			continue // the rotation ledger and anything else is not a copy
		}
		key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
		if users := referenced[key]; len(users) > 0 {
			sort.Strings(users)
			kept = append(kept, fmt.Sprintf("Secret %s (raysync's %s copy): RayCluster %v names it; its pods would not start without it", key, kind, users))
			continue
		}
		uid, rv := s.UID, s.ResourceVersion
		steps = append(steps, uninstallStep{what: fmt.Sprintf("delete Secret %s (raysync's %s copy; no RayCluster names it)", key, kind),
			do: func(ctx context.Context) error {
				return kube.CoreV1().Secrets(key.Namespace).Delete(ctx, key.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
			}})
	}
	// The gateway's addresses (<name>-gw ExternalName Services raysync keeps; the gateway is gone).
	addrs, err := kube.CoreV1().Services(scope).List(ctx, metav1.ListOptions{LabelSelector: names.ManagedByLabel + "=" + names.ManagedByValue})
	if err != nil {
		return nil, nil, fmt.Errorf("list raysync's gateway addresses: %w", err)
	}
	for i := range addrs.Items {
		svc := addrs.Items[i]
		if svc.Annotations[names.KindAnnotation] != names.KindGatewayAddress {
			continue
		}
		uid, rv := svc.UID, svc.ResourceVersion
		steps = append(steps, uninstallStep{what: fmt.Sprintf("delete Service %s/%s (raysync's gateway address)", svc.Namespace, svc.Name),
			do: func(ctx context.Context) error {
				return kube.CoreV1().Services(svc.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
			}})
	}
	return steps, kept, nil
}

// secretsNamedBy lists the Secrets a RayCluster's pods read by name: its token Secret and the pull
// secrets and volumes of its templates.
func secretsNamedBy(rc *unstructured.Unstructured) []string {
	var out []string
	if a := kuberay.ReadAuthOptions(rc); a.Err == nil && a.TokenAuth() {
		if a.SecretName != "" {
			out = append(out, a.SecretName)
		}
	}
	var specs []map[string]any
	if head, ok, _ := unstructured.NestedMap(rc.Object, "spec", "headGroupSpec", "template", "spec"); ok {
		specs = append(specs, head)
	}
	groups, _, _ := unstructured.NestedSlice(rc.Object, "spec", "workerGroupSpecs")
	for _, g := range groups {
		if spec, ok, _ := unstructured.NestedMap(g.(map[string]any), "template", "spec"); ok {
			specs = append(specs, spec)
		}
	}
	for _, spec := range specs {
		for _, field := range []string{"imagePullSecrets", "volumes"} {
			list, _ := spec[field].([]any)
			for _, e := range list {
				m, _ := e.(map[string]any)
				if n, ok := m["name"].(string); ok && field == "imagePullSecrets" {
					out = append(out, n)
				}
				if sec, ok := m["secret"].(map[string]any); ok {
					if n, ok := sec["secretName"].(string); ok {
						out = append(out, n)
					}
				}
			}
		}
	}
	return out
}

// annotationStep removes raysync's annotations from obj and, for a RayCluster raysync suspended for a
// restart, resumes it; nil when there is nothing of raysync's on it.
func annotationStep(dyn dynamic.Interface, gvr schema.GroupVersionResource, obj *unstructured.Unstructured, cluster bool) *uninstallStep {
	ann := obj.GetAnnotations()
	var mine []string
	for _, a := range rotationAnnotations {
		if _, ok := ann[a]; ok {
			mine = append(mine, a)
		}
	}
	if len(mine) == 0 {
		return nil
	}
	patch := map[string]any{"metadata": map[string]any{"resourceVersion": obj.GetResourceVersion()}}
	removals := map[string]any{}
	for _, a := range mine {
		removals[a] = nil
	}
	patch["metadata"].(map[string]any)["annotations"] = removals
	what := fmt.Sprintf("remove raysync's annotations %v from %s %s/%s", mine, obj.GetKind(), obj.GetNamespace(), obj.GetName())
	suspended, _, _ := unstructured.NestedBool(obj.Object, "spec", "suspend")
	if cluster && suspended && slices.Contains(mine, names.RotationStartedAnnotation) {
		patch["spec"] = map[string]any{"suspend": false}
		what = fmt.Sprintf("resume RayCluster %s/%s (raysync suspended it to restart it) and remove raysync's annotations %v", obj.GetNamespace(), obj.GetName(), mine)
	}
	b, _ := json.Marshal(patch)
	ns, name := obj.GetNamespace(), obj.GetName()
	return &uninstallStep{what: what, do: func(ctx context.Context) error {
		_, err := dyn.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, b, metav1.PatchOptions{FieldManager: names.FieldManager})
		return err
	}}
}

// ownSteps deletes raysync's own objects in its namespace: the rotation ledger, the webhook's
// certificate Secret, the gateway's table and the Lease, each only when it is raysync's, with its UID
// and resourceVersion as preconditions. kept says why a Lease of raysync's name is not deleted.
func ownSteps(ctx context.Context, kube kubernetes.Interface, cfg *config, ns string) (steps []uninstallStep, kept []string) {
	secret := func(n types.NamespacedName, what string, ours func(*corev1.Secret) bool) {
		s, err := kube.CoreV1().Secrets(n.Namespace).Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || !ours(s) {
			return
		}
		uid, rv := s.UID, s.ResourceVersion
		steps = append(steps, uninstallStep{what: fmt.Sprintf("delete Secret %s (%s)", n, what), do: func(ctx context.Context) error {
			return kube.CoreV1().Secrets(n.Namespace).Delete(ctx, n.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		}})
	}
	secret(cfg.rotationLedger, "raysync's rotation ledger", func(s *corev1.Secret) bool {
		return s.Labels[names.ManagedByLabel] == names.ManagedByValue && s.Annotations[names.KindAnnotation] == names.KindRotationLedger
	})
	certSecret := cfg.webhook.certSecret
	if certSecret.Name == "" {
		certSecret = types.NamespacedName{Namespace: ns, Name: cfg.name + "-webhook-tls"}
	}
	secret(certSecret, "raysync's webhook certificate", func(s *corev1.Secret) bool {
		return s.Annotations[names.KindAnnotation] == names.KindWebhookCertificate
	})
	table := cfg.gateway.Table
	if table.Name == "" {
		table = types.NamespacedName{Namespace: ns, Name: cfg.name + "-gateway"}
	}
	secret(table, "raysync's gateway table", func(s *corev1.Secret) bool {
		return s.Labels[names.ManagedByLabel] == names.ManagedByValue && s.Annotations[names.KindAnnotation] == names.KindGatewayTable
	})
	if lease, err := kube.CoordinationV1().Leases(ns).Get(ctx, cfg.name, metav1.GetOptions{}); err == nil {
		if why := notRaysyncsLease(lease); why != "" {
			kept = append(kept, fmt.Sprintf("Lease %s/%s: %s", ns, cfg.name, why))
		} else {
			uid, rv := lease.UID, lease.ResourceVersion
			steps = append(steps, uninstallStep{what: fmt.Sprintf("delete Lease %s/%s (raysync's leader election)", ns, cfg.name), do: func(ctx context.Context) error {
				return kube.CoordinationV1().Leases(ns).Delete(ctx, cfg.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
			}})
		}
	}
	return steps, kept
}

// raysyncIdentity is how raysync names a Lease holder: its hostname, "_", a UUID.
var raysyncIdentity = regexp.MustCompile(`^[^_\s]+_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// notRaysyncsLease says why a Lease of raysync's name is not raysync's ("": it is): raysync marks
// its Lease (label raysync.dev/managed-by); one from an earlier raysync is known by its holder's
// identity (hostname_UUID; a released Lease has none and is kept).
func notRaysyncsLease(l *coordinationv1.Lease) string {
	if l.Labels[names.ManagedByLabel] == names.ManagedByValue {
		return ""
	}
	if h := l.Spec.HolderIdentity; h != nil && raysyncIdentity.MatchString(*h) {
		return ""
	}
	return fmt.Sprintf("not marked as raysync's (label %s=%s) and its holder is not a raysync replica: left as it is", names.ManagedByLabel, names.ManagedByValue)
}
