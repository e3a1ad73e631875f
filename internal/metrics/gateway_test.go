package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestPreviousTokenLastUsedWhileASessionIsOpen: a Ray Client session on the previous token that
// began an hour ago and is still open uses the token now; once it ends, its end is the last use.
func TestPreviousTokenLastUsedWhileASessionIsOpen(t *testing.T) {
	g := NewGateway()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	g.Now = func() time.Time { return now }
	if v := testutil.ToFloat64(g.PreviousLastUsed); v != 0 {
		t.Errorf("before any use: %v, want 0", v)
	}
	g.Observe("grpc", "forwarded", "previous", 0.001)
	g.Observe("http", "forwarded", "current", 0.001) // another credential changes nothing
	g.Done("current")
	now = now.Add(time.Hour)
	if v := testutil.ToFloat64(g.PreviousLastUsed); v != float64(now.Unix()) {
		t.Errorf("an hour into an open session: %v, want now (%d)", v, now.Unix())
	}
	g.Done("previous")
	ended := now
	now = now.Add(time.Hour)
	if v := testutil.ToFloat64(g.PreviousLastUsed); v != float64(ended.Unix()) {
		t.Errorf("an hour after the session ended: %v, want its end (%d)", v, ended.Unix())
	}
}
