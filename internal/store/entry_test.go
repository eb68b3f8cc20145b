package store

import (
	"reflect"
	"testing"

	"jobfence/jobs"
)

// TestResolvedJobsKeptAsSummaries: the view keeps a decoded record only for
// active jobs; a resolved job is a summary, and Get and List still answer
// with the whole record as etcd holds it, in order, across pages.
func TestResolvedJobsKeptAsSummaries(t *testing.T) {
	h := newHarness(t, nil)
	l := h.leader()
	pending := h.admit("keep/pending")
	cancelled, err := h.st.Cancel(h.ctx, h.admit("keep/cancelled").ID, "bob")
	if err != nil {
		t.Fatal(err)
	}
	run := h.running(l, "keep/committed")
	committed, applied, err := h.st.CompleteWithResult(h.ctx, run.ID, envelopeFor(run, jobs.CodeExitCommitted, intp(0), jobs.ProofChildReaped))
	if err != nil || !applied || !committed.Resolved || committed.Slot.Held {
		t.Fatalf("complete: %+v applied=%v err=%v", committed, applied, err)
	}

	h.st.mu.RLock()
	_, pendingActive := h.st.v.active[pending.ID]
	_, cancelledActive := h.st.v.active[cancelled.ID]
	_, committedActive := h.st.v.active[committed.ID]
	entries := len(h.st.v.jobs)
	h.st.mu.RUnlock()
	if !pendingActive || cancelledActive || committedActive || entries != 3 {
		t.Fatalf("active: pending %v cancelled %v committed %v; %d entries", pendingActive, cancelledActive, committedActive, entries)
	}

	// The summary read from a stored record is the summary of the decoded
	// record; an active record is left to the whole decode.
	for _, j := range []*jobs.Job{pending, cancelled, committed} {
		resp, err := h.cli.Get(h.ctx, h.st.k.job(j.ID))
		if err != nil {
			t.Fatal(err)
		}
		kv := resp.Kvs[0]
		full, err := decodeJob(j.ID, kv.Value, kv.ModRevision)
		if err != nil {
			t.Fatal(err)
		}
		e, ok, err := summarizeRecord(j.ID, kv.Value, kv.ModRevision)
		if err != nil || ok != !active(full) || (ok && e != summarize(full)) {
			t.Fatalf("%s: summary %+v ok=%v err=%v, decoded %+v", j.ID, e, ok, err, summarize(full))
		}
	}
	if _, _, err := summarizeRecord(committed.ID, []byte(`{"id":"x","state":"COMMITTED","resolved":true}`), 9); err == nil {
		t.Fatal("a record under another id's key was summarized")
	}
	if _, _, err := summarizeRecord(committed.ID, []byte(`{"id":"`+committed.ID+`","state":"DONE","resolved":true}`), 9); err == nil {
		t.Fatal("a record with an unknown state was summarized")
	}

	for _, want := range []*jobs.Job{pending, cancelled, committed} {
		got, err := h.st.Get(h.ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := h.st.load(h.ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, stored) || got.State != want.State || got.Revision != want.Revision {
			t.Fatalf("Get %s:\n%+v\nstored:\n%+v", want.ID, got, stored)
		}
	}

	// Newest first, one per page, whole records.
	var seen []*jobs.Job
	next := ""
	for range 4 {
		page, n, err := h.st.List(h.ctx, ListFilter{Limit: 1, PageToken: next})
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, page...)
		if next = n; next == "" {
			break
		}
	}
	if len(seen) != 3 || seen[0].ID != committed.ID || seen[1].ID != cancelled.ID || seen[2].ID != pending.ID {
		t.Fatalf("pages: %v", ids(seen))
	}
	if seen[0].Result == nil || seen[0].Result.Code != jobs.CodeExitCommitted || len(seen[0].History) != len(committed.History) {
		t.Fatalf("listed resolved record is not whole: %+v", seen[0])
	}
	resolved := true
	page, _, err := h.st.List(h.ctx, ListFilter{Resolved: &resolved, State: jobs.NotCommitted, Scope: " KEEP "})
	if err != nil || len(page) != 1 || page[0].ID != cancelled.ID {
		t.Fatalf("filtered list: %v %v", ids(page), err)
	}
	if c := h.st.Counts(); c[jobs.Pending] != 1 || c[jobs.NotCommitted] != 1 || c[jobs.Committed] != 1 {
		t.Fatalf("counts %v", c)
	}

	// Retention reads the record it removes; the summary goes with it.
	removed, err := h.st.RemoveResolved(h.ctx, committed.UpdatedAt.Add(1), 10)
	if err != nil || removed != 2 {
		t.Fatalf("removed %d: %v", removed, err)
	}
	if _, err := h.st.Get(h.ctx, cancelled.ID); err != jobs.ErrNotFound {
		t.Fatalf("removed job: %v", err)
	}
	if page, _, _ := h.st.List(h.ctx, ListFilter{}); len(page) != 1 || page[0].ID != pending.ID {
		t.Fatalf("after retention: %v", ids(page))
	}
}

func ids(js []*jobs.Job) []string {
	var out []string
	for _, j := range js {
		out = append(out, j.ID)
	}
	return out
}
