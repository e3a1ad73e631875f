// Package admission serves raysync's mutating admission webhook: Ray pods get raysync's entries at
// creation, and a new cluster's auth Secret is created by raysync itself, with the canonical token,
// before KubeRay's own create goes on. It never rejects a request and is registered with
// failurePolicy Ignore: when it is bypassed the controller repairs as before.
//
// No answer it gives carries a token, or anything derived from one. It does not authenticate its
// caller (on a managed cluster nobody can make the API server present a client certificate), so an
// answer is something anyone who reaches it could read: a Secret's token is written through the API,
// where RBAC decides who reads it, never into a patch.
package admission

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"

	"github.com/raysync/raysync/internal/metrics"
	"github.com/raysync/raysync/internal/names"
	"github.com/raysync/raysync/internal/podtemplate"
)

// Paths the webhook configuration names.
const (
	PodsPath    = "/mutate-pods"
	SecretsPath = "/mutate-secrets"
)

// maxReview bounds a request body (the API server sends at most a few MiB).
const maxReview = 8 << 20

// Decider decides what a pod or a Secret being created gets (projection.Admitter implements it).
type Decider interface {
	// Pod returns the JSON patch a Ray pod being created in ns gets (raw is the pod), its result
	// (names.Admit*) and why.
	Pod(ctx context.Context, ns string, raw []byte) ([]podtemplate.PatchOp, string, string)
	// Secret acts on a Secret being created in ns: it makes sure the cluster's auth Secret exists as
	// raysync's, through the API (nothing when dryRun: the request will not be persisted). It returns
	// no patch: no answer carries a token.
	Secret(ctx context.Context, ns string, raw []byte, dryRun bool) (result, reason string)
}

// Handler answers AdmissionReview requests for pods and Secrets.
func Handler(a Decider, m *metrics.Metrics, log *zap.Logger) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(PodsPath, &review{resource: "pods", decide: func(ctx context.Context, req *admissionv1.AdmissionRequest) ([]podtemplate.PatchOp, string, string) {
		return a.Pod(ctx, req.Namespace, req.Object.Raw)
	}, m: m, log: log})
	mux.Handle(SecretsPath, &review{resource: "secrets", decide: func(ctx context.Context, req *admissionv1.AdmissionRequest) ([]podtemplate.PatchOp, string, string) {
		result, reason := a.Secret(ctx, req.Namespace, req.Object.Raw, req.DryRun != nil && *req.DryRun)
		return nil, result, reason // never a patch for a Secret
	}, m: m, log: log})
	return mux
}

type review struct {
	resource string
	decide   func(ctx context.Context, req *admissionv1.AdmissionRequest) ([]podtemplate.PatchOp, string, string)
	m        *metrics.Metrics
	log      *zap.Logger
}

func (h *review) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { h.m.AdmissionDuration.WithLabelValues(h.resource).Observe(time.Since(start).Seconds()) }()
	var ar admissionv1.AdmissionReview
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReview))
	if err == nil {
		err = json.Unmarshal(body, &ar)
	}
	if err != nil || ar.Request == nil {
		// Without the request's UID there is no answer to give: the API server treats this as a
		// webhook failure and, with failurePolicy Ignore, admits the object unchanged.
		h.m.Admission.WithLabelValues(h.resource, names.AdmitInvalid).Inc()
		h.log.Warn("unreadable admission review", zap.String("resource", h.resource))
		http.Error(w, "unreadable AdmissionReview", http.StatusBadRequest)
		return
	}
	req := ar.Request
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	result, reason := names.AdmitUnchanged, "not a CREATE"
	if req.Operation == admissionv1.Create {
		var ops []podtemplate.PatchOp
		ops, result, reason = h.decide(r.Context(), req)
		if len(ops) > 0 {
			if patch, err := json.Marshal(ops); err == nil {
				pt := admissionv1.PatchTypeJSONPatch
				resp.Patch, resp.PatchType = patch, &pt
			} else {
				result, reason = names.AdmitInvalid, "patch not encodable"
			}
		}
	}
	h.m.Admission.WithLabelValues(h.resource, result).Inc()
	if result == names.AdmitInvalid {
		h.log.Warn("admitted unchanged: object unreadable", zap.String("resource", h.resource), zap.String("namespace", req.Namespace),
			zap.String("name", req.Name), zap.String("reason", reason))
	} else {
		h.log.Debug("admitted", zap.String("resource", h.resource), zap.String("namespace", req.Namespace), zap.String("name", req.Name),
			zap.String("result", result), zap.String("reason", reason))
	}
	out := admissionv1.AdmissionReview{TypeMeta: ar.TypeMeta, Response: resp}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
