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
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"
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

// What one review, and every review at once, may cost. Anyone who reaches the port can send a review
// (the webhook cannot authenticate the API server), and the webhook shares its process with the
// controller: these bounds keep a hostile caller from taking the leader down with it.
const (
	// MaxReviewBytes bounds a review's body. The API server refuses a request body over 3 MiB
	// (apiserver's MaxRequestBodyBytes), and a review carries the object once for a CREATE, plus the
	// request's metadata: 3.5 MiB leaves room for the defaults the API server adds.
	MaxReviewBytes = 3<<20 + 512<<10
	// MaxReviewValues bounds the JSON values in a review (objects, arrays and scalars, counted as
	// openings and commas): a KubeRay head pod's review holds about 600. Decoding is what costs
	// memory (a map or a slice element per value), so this bounds it whatever the bytes look like.
	MaxReviewValues = 20_000
	// MaxReviewDepth bounds how deeply a review nests (a pod nests about 10 deep).
	MaxReviewDepth = 64
	// ReviewBudget is the memory the reviews being read and decoded may hold at once: each reserves
	// reviewCost of its declared length before its body is read, and waits (up to ReviewWait) for room.
	ReviewBudget = 48 << 20
	// ReviewWait is how long a review waits for room in the budget before it is answered 503 (the API
	// server then admits the object unchanged, failurePolicy Ignore, and the controller repairs it).
	ReviewWait = 5 * time.Second
	// BodyTimeout is how long a client has to send a review's body once it has room: the API server
	// sends at most 3.5 MiB at once, so a slower client holds budget only this long.
	BodyTimeout = 5 * time.Second
)

// reviewCost is the memory a review of n bytes may hold while it is decided: its body, the object's
// raw copy in the decoded review, and the values decoded from it (bounded by MaxReviewValues).
func reviewCost(n int64) int64 { return 2*n + 1<<20 }

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

// Handler answers AdmissionReview requests for pods and Secrets, within the bounds above.
func Handler(a Decider, m *metrics.Metrics, log *zap.Logger) http.Handler {
	budget := semaphore.NewWeighted(ReviewBudget)
	mux := http.NewServeMux()
	mux.Handle(PodsPath, &review{resource: "pods", decide: func(ctx context.Context, req *admissionv1.AdmissionRequest) ([]podtemplate.PatchOp, string, string) {
		return a.Pod(ctx, req.Namespace, req.Object.Raw)
	}, m: m, log: log, budget: budget})
	mux.Handle(SecretsPath, &review{resource: "secrets", decide: func(ctx context.Context, req *admissionv1.AdmissionRequest) ([]podtemplate.PatchOp, string, string) {
		result, reason := a.Secret(ctx, req.Namespace, req.Object.Raw, req.DryRun != nil && *req.DryRun)
		return nil, result, reason // never a patch for a Secret
	}, m: m, log: log, budget: budget})
	return mux
}

type review struct {
	resource string
	decide   func(ctx context.Context, req *admissionv1.AdmissionRequest) ([]podtemplate.PatchOp, string, string)
	m        *metrics.Metrics
	log      *zap.Logger
	// budget is shared by every path: what the reviews in hand may hold at once (ReviewBudget).
	budget *semaphore.Weighted
}

func (h *review) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer func() { h.m.AdmissionDuration.WithLabelValues(h.resource).Observe(time.Since(start).Seconds()) }()
	if r.Method != http.MethodPost {
		h.refuse(w, http.StatusMethodNotAllowed, names.AdmitInvalid, "not a POST")
		return
	}
	n := r.ContentLength
	if n > MaxReviewBytes {
		h.refuse(w, http.StatusRequestEntityTooLarge, names.AdmitInvalid, "body over the limit")
		return
	}
	if n < 0 {
		n = MaxReviewBytes // length not declared: reserve the most it may be
	}
	cost := reviewCost(n)
	wctx, cancel := context.WithTimeout(r.Context(), ReviewWait)
	err := h.budget.Acquire(wctx, cost)
	cancel()
	if err != nil {
		h.refuse(w, http.StatusServiceUnavailable, names.AdmitBusy, "no room for another review")
		return
	}
	defer h.budget.Release(cost)
	ar, reason := readReview(w, r, n)
	if ar == nil {
		// Without the request's UID there is no answer to give: the API server treats this as a
		// webhook failure and, with failurePolicy Ignore, admits the object unchanged.
		h.refuse(w, http.StatusBadRequest, names.AdmitInvalid, reason)
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

// refuse answers a request the webhook does not decide on (the API server admits the object
// unchanged: failurePolicy Ignore), counted by result.
func (h *review) refuse(w http.ResponseWriter, code int, result, reason string) {
	h.m.Admission.WithLabelValues(h.resource, result).Inc()
	h.log.Warn("admission review refused", zap.String("resource", h.resource), zap.String("result", result), zap.String("reason", reason))
	http.Error(w, "raysync webhook: "+reason, code)
}

// readReview reads a review of at most n bytes (MaxReviewBytes) within BodyTimeout, checks its shape
// and only then decodes it, typed: the object stays raw bytes until a decider reads what it needs.
func readReview(w http.ResponseWriter, r *http.Request, n int64) (*admissionv1.AdmissionReview, string) {
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(BodyTimeout))
	body := make([]byte, 0, n+1)
	for {
		m, err := r.Body.Read(body[len(body):cap(body)])
		body = body[:len(body)+m]
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, "body unreadable"
		}
		if len(body) == cap(body) {
			return nil, "body longer than declared or over the limit"
		}
	}
	if err := CheckShape(body, MaxReviewValues, MaxReviewDepth); err != nil {
		return nil, err.Error()
	}
	var ar admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &ar); err != nil || ar.Request == nil {
		return nil, "not an AdmissionReview"
	}
	return &ar, ""
}

// CheckShape refuses JSON with more than maxValues values or nesting deeper than maxDepth, without
// decoding it: one pass over the bytes, no allocation. (It does not validate the JSON; the decoder does.)
func CheckShape(b []byte, maxValues, maxDepth int) error {
	values, depth := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			values++
			if depth++; depth > maxDepth {
				return fmt.Errorf("nested deeper than %d", maxDepth)
			}
		case '}', ']':
			depth--
		case ',':
			values++
		}
		if values > maxValues {
			return fmt.Errorf("more than %d JSON values", maxValues)
		}
	}
	return nil
}
