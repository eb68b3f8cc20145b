package store

import (
	"slices"
	"sync"
	"testing"

	"jobfence/jobs"
)

// OnTransition sees each committed transition once, by its event, and
// nothing for a write that lost or changed nothing.
func TestOnTransitionReportsCommittedEvents(t *testing.T) {
	var mu sync.Mutex
	var got []string
	h := newHarness(t, func(c *Config) {
		c.OnTransition = func(e string) {
			mu.Lock()
			got = append(got, e)
			mu.Unlock()
		}
	})
	events := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
	j := h.admit("hook/a")
	if _, err := h.st.Cancel(h.ctx, j.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	// A second cancel is refused by the transition: nothing is committed.
	if _, err := h.st.Cancel(h.ctx, j.ID, "alice"); err == nil {
		t.Fatal("second cancel succeeded")
	}
	l := h.leader()
	r := h.running(l, "hook/b")
	// A stale revision writes nothing.
	if _, err := h.st.Classify(h.ctx, l, r.ID, r.Revision-1, jobs.CodeNoTrustedResult, "x"); err == nil {
		t.Fatal("stale classify succeeded")
	}
	want := []string{"admit", "cancel", "admit", "mark_running"}
	if e := events(); !slices.Equal(e, want) {
		t.Fatalf("events %v, want %v", e, want)
	}
}
