package projection

// The rotation ledger: raysync numbers each canonical token it sees (internal/ledger). It writes the
// ledger only when the Secret under its name is raysync's ledger and reads as one: someone else's
// Secret (a flag naming the wrong one) or a ledger it cannot read is reported and left as it is,
// never overwritten nor started afresh (that would renumber the rotations and end the previous
// token's grace at the gateway).

import (
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/raysync/raysync/internal/gateway"
	"github.com/raysync/raysync/internal/ledger"
	"github.com/raysync/raysync/internal/names"
)

// ledgerPlan is what one look at the ledger decides: a write, or why there is none.
type ledgerPlan struct {
	// Write creates or updates the ledger (nil: nothing to write).
	Write Action
	// Rotation is the number the current token gets (0: none recorded now).
	Rotation int
	// Problem says why the ledger is left as it is ("": none); Warning is its Event (on the Secret).
	Problem string
	Warning *RecordEvent
	// Verify: the source, as cached, holds a token the ledger numbered before the newest one. Either it
	// was put back (a rollback, numbered anew) or the source's cache lags the ledger's (they are
	// separate watches, even in one namespace): plan again with the source read live.
	Verify bool
}

// planLedger records the current canonical token in the ledger: the next number for a token it has
// not numbered, the gateway's SHA-256 for one recorded before raysync kept it. A token the ledger
// numbered before its newest is numbered anew only once the source was read live (live): numbering a
// lagging cache's earlier token would start the wave toward it, and make a revocation, compared by
// number, stop matching.
func planLedger(cfg Config, src *sourceView, now time.Time, live bool) ledgerPlan {
	if cfg.Ledger.Name == "" {
		return ledgerPlan{}
	}
	if src.ledgerErr != nil {
		reason, what := names.ReasonLedgerInvalid, "cannot read it"
		if errors.Is(src.ledgerErr, ledger.ErrNotOwned) {
			reason, what = names.ReasonTargetNotOwned, "it is not raysync's"
		}
		msg := fmt.Sprintf("%v: raysync %s, so it leaves it as it is and numbers no rotation until it is fixed "+
			"(or --rotation-ledger names a Secret of its own); the gateway keeps its last table", src.ledgerErr, what)
		return ledgerPlan{Problem: msg, Warning: &RecordEvent{Object: src.ledgerSecret, Type: corev1.EventTypeWarning, Reason: reason, Message: msg}}
	}
	if !src.token.valid() {
		return ledgerPlan{}
	}
	accept := "" // the token's SHA-256, kept only for the gateway (its previous-token grace)
	if cfg.Gateway.enabled() {
		accept = gateway.Digest(src.token.value)
	}
	if _, newest := src.ledger.Current(src.token.digest); !newest && src.ledger.Holds(src.token.digest) && !live {
		return ledgerPlan{Verify: true}
	}
	next, changed := src.ledger.Observed(src.token.digest, accept, now)
	if !changed {
		return ledgerPlan{}
	}
	p := ledgerPlan{Rotation: next[len(next)-1].ID}
	if src.ledgerSecret == nil {
		p.Write = CreateSecret{Secret: ledger.Desired(cfg.Ledger, nil, next)}
	} else {
		p.Write = UpdateSecret{Secret: ledger.Desired(cfg.Ledger, src.ledgerSecret, next)}
	}
	return p
}
