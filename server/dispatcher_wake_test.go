package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"jobfence/internal/metrics"
	"jobfence/jobs"
)

// roundCounter counts started rounds: the deadline sweep is every round's
// first phase.
type roundCounter struct{ n atomic.Int64 }

func (r *roundCounter) ObservePhase(phase string, _ time.Duration) {
	if phase == metrics.PhaseDeadline {
		r.n.Add(1)
	}
}

// runWoken runs a dispatcher whose interval never ticks within a test, so
// every round after the first is one a read-model change started.
func runWoken(t *testing.T, h *harness) *roundCounter {
	t.Helper()
	rc := &roundCounter{}
	d, err := NewDispatcher(DispatcherOptions{
		Config: h.cfg, Store: h.st, Agents: h.agents, Now: h.clock.Now, Phases: rc,
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, h.l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	})
	waitFor(t, "the first round", func() bool { return rc.n.Load() >= 1 })
	return rc
}

// An admission is dispatched without waiting for the interval, and so is
// the job that waited for the slot a result frees.
func TestDispatcherWakesOnAdmissionAndFreedSlot(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.Interval = time.Hour })
	h.agent("a1", "e1", 1)
	runWoken(t, h)

	j1 := h.admit("wh/wake1")
	waitFor(t, "the admitted job dispatched", func() bool { return h.get(j1.ID).State == jobs.Running })
	j2 := h.admit("wh/wake2")
	j1 = h.get(j1.ID)
	if st := h.get(j2.ID).State; st != jobs.Pending {
		t.Fatalf("second job is %s while the agent's only slot is held", st)
	}
	if _, _, err := h.report(j1, h.agents.sent()[0].Secret, jobs.CodeExitCommitted, jobs.PhaseNativeReturn,
		intp(0), jobs.ProofChildReaped); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the waiting job dispatched into the freed slot", func() bool { return h.get(j2.ID).State == jobs.Running })
	if n := len(h.agents.sent()); n != 2 {
		t.Fatalf("%d sends, want one per job", n)
	}
}

// A change after which nothing can be dispatched starts no round: an
// admission with no agent to take it waits, and the agent's arrival is what
// dispatches it.
func TestDispatcherIgnoresChangesThatCannotDispatch(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.Interval = time.Hour })
	rc := runWoken(t, h)

	j := h.admit("wh/noagent")
	h.agent("a1", "e1", 1)
	waitFor(t, "dispatch once the agent registered", func() bool { return h.get(j.ID).State == jobs.Running })
	if n := rc.n.Load(); n != 2 {
		t.Fatalf("%d rounds, want 2 (the first, then the agent's arrival)", n)
	}
}
