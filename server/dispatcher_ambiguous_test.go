package server

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"

	"jobfence/internal/store"
	"jobfence/jobs"
)

// ambiguousStore answers MarkRunning with an error whose outcome is unknown,
// as etcd can when the connection drops around a transaction; apply says
// whether the transaction landed before the error.
type ambiguousStore struct {
	DispatchStore
	fail  atomic.Bool
	apply bool
}

func (s *ambiguousStore) MarkRunning(ctx context.Context, l store.Leadership, id string, rev int64, in store.MarkRunningInput) (*jobs.Job, error) {
	if !s.fail.Load() {
		return s.DispatchStore.MarkRunning(ctx, l, id, rev, in)
	}
	if s.apply {
		if _, err := s.DispatchStore.MarkRunning(ctx, l, id, rev, in); err != nil {
			return nil, err
		}
	}
	return nil, errors.New("etcd: etcdserver: request timed out")
}

func (h *harness) useStore(ds DispatchStore) {
	h.t.Helper()
	d, err := NewDispatcher(DispatcherOptions{Config: h.cfg, Store: ds, Agents: h.agents, Now: h.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		h.t.Fatal(err)
	}
	h.d = d
	h.tm = h.newTerm()
}

// A markRunning that landed although the store answered an error leaves
// the job RUNNING under an identity nobody received; the next round proves
// that through the tombstone (NOT_COMMITTED) instead of waiting for the
// deadline to call it UNKNOWN. Nothing is ever sent for it.
func TestAmbiguousMarkRunningIsSettledByTombstone(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	as := &ambiguousStore{DispatchStore: h.st, apply: true}
	as.fail.Store(true)
	h.useStore(as)
	j := h.admit("wh/ambiguous")
	h.round()
	got := h.get(j.ID)
	if got.State != jobs.Running || len(h.agents.sent()) != 0 {
		t.Fatalf("after the ambiguous markRunning: state %s, sends %d", got.State, len(h.agents.sent()))
	}
	inv := got.Dispatch.InvocationID
	h.round()
	got = h.get(j.ID)
	if got.State != jobs.NotCommitted || got.Result.Code != jobs.CodeTombstoned || got.Slot.Held || got.Slot.Proof != jobs.ProofNotEnqueued {
		t.Fatalf("next round: state %s result %+v slot %+v", got.State, got.Result, got.Slot)
	}
	if asked := h.agents.asked(); len(asked) != 1 || asked[0] != inv {
		t.Fatalf("tombstone queries %v, want one for %s", asked, inv)
	}
	if n := len(h.agents.sent()); n != 0 {
		t.Fatalf("the job was sent %d times", n)
	}
}

// When the ambiguous markRunning did not land, the job is still PENDING:
// the next round asks no agent and dispatches it once, with a fresh identity.
func TestAmbiguousMarkRunningThatDidNotLandDispatchesOnce(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	as := &ambiguousStore{DispatchStore: h.st}
	as.fail.Store(true)
	h.useStore(as)
	j := h.admit("wh/ambiguous")
	h.round()
	if got := h.get(j.ID); got.State != jobs.Pending || len(h.agents.sent()) != 0 {
		t.Fatalf("after the failed markRunning: state %s, sends %d", got.State, len(h.agents.sent()))
	}
	as.fail.Store(false)
	h.round()
	got := h.get(j.ID)
	if got.State != jobs.Running || len(h.agents.sent()) != 1 || len(h.agents.asked()) != 0 {
		t.Fatalf("next round: state %s, sends %d, tombstone queries %d", got.State, len(h.agents.sent()), len(h.agents.asked()))
	}
	if sent := h.agents.sent()[0]; sent.Job.Dispatch.InvocationID != got.Dispatch.InvocationID {
		t.Fatalf("sent invocation %s, recorded %s", sent.Job.Dispatch.InvocationID, got.Dispatch.InvocationID)
	}
}
