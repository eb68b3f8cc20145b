package server

import (
	"testing"
	"time"

	"jobfence/internal/store"
	"jobfence/jobs"
)

// An agent the cluster has no record of proves nothing: the epoch sweep
// leaves the slot of an UNKNOWN job dispatched to it held, and the rounds
// that find nothing provable write nothing.
func TestEpochSweepIgnoresAMissingAgent(t *testing.T) {
	h := newHarness(t, nil)
	j := h.admit("wh/ghost")
	run, err := h.st.MarkRunning(h.ctx, h.l, j.ID, j.Revision, store.MarkRunningInput{
		AgentID: "ghost", AgentEpoch: "e1", AgentAddress: "http://127.0.0.1:1",
		InvocationID: "0193a0c0-0000-4000-8000-0000000000aa", SecretHash: jobs.HashSecret("s"),
		Deadline: h.clock.Now().Add(time.Minute),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.st.Agents()) != 0 {
		t.Fatal("the harness registered an agent; the case needs none")
	}
	h.clock.Advance(61 * time.Second)
	h.round() // deadline sweep: UNKNOWN, slot held
	got := h.get(j.ID)
	if got.State != jobs.Unknown || !got.Slot.Held || got.Revision == run.Revision {
		t.Fatalf("after the deadline: state %s slot %+v", got.State, got.Slot)
	}
	before := h.rev()
	h.round()
	h.round()
	if after := h.rev(); after != before {
		t.Fatalf("rounds over a missing agent wrote: revision %d -> %d", before, after)
	}
	if got := h.get(j.ID); !got.Slot.Held || got.Slot.Proof != jobs.ProofNone {
		t.Fatalf("a missing agent released the slot: %+v", got.Slot)
	}
	if n := len(h.agents.sent()); n != 0 {
		t.Fatalf("sent %d dispatches to no agent", n)
	}
}
