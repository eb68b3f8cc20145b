package store

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/jobs"
)

// A list longer than one page reads every key exactly once, at one
// revision: a fresh replica's view holds every record as decodeJob reads
// it (interned strings compare equal), every fence, and its cursor is the
// list's revision, not that of a page.
func TestRelistPagesWholeKeyspace(t *testing.T) {
	h := newHarness(t, nil)
	const n = 2*relistPage + 37 // pages end mid-family and on odd counts
	now := h.st.now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	ids := make([]string, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				id, err := newJobID()
				if err != nil {
					errs <- err
					return
				}
				ids[i] = id
				tg, err := jobs.ParseTarget(fmt.Sprintf("scope%d/t%d", i%3, i))
				if err != nil {
					errs <- err
					return
				}
				j, _ := jobs.Admit(jobs.AdmitParams{ID: id, Target: tg, Spec: admitInput(t, "s/x").Spec, QuotaToken: quotaToken(0, 0)},
					jobs.Meta{Actor: "loader", At: now})
				if i%2 == 0 {
					if j, _, err = jobs.Cancel(j, jobs.Meta{Actor: "loader", At: now}); err != nil {
						errs <- err
						return
					}
				}
				val, err := encodeJob(j)
				if err != nil {
					errs <- err
					return
				}
				ops := []clientv3.Op{clientv3.OpPut(h.st.k.job(id), string(val))}
				if i%2 == 1 {
					ops = append(ops, clientv3.OpPut(h.st.k.fence(tg.Key()), id))
				}
				if _, err := h.cli.Txn(h.ctx).Then(ops...).Commit(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	other, err := New(Config{Client: h.cli, Prefix: h.prefix, Defaults: testDefaults})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = other.Run(rctx) }()
	defer func() { cancel(); <-done }()
	if err := other.WaitSynced(h.ctx, 0); err != nil {
		t.Fatal(err)
	}
	resp, err := h.cli.Get(h.ctx, h.prefix+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if c := other.Cursor(); c.Revision != resp.Header.Revision {
		t.Fatalf("cursor %d after the list, etcd at %d with no write since", c.Revision, resp.Header.Revision)
	}
	other.mu.RLock()
	defer other.mu.RUnlock()
	if len(other.v.jobs) != n || len(other.v.fences) != n/2 {
		t.Fatalf("view has %d jobs and %d fences, want %d and %d", len(other.v.jobs), len(other.v.fences), n, n/2)
	}
	for _, kv := range resp.Kvs {
		p, err := h.st.k.parse(string(kv.Key))
		if err != nil || p.kind != kindJob {
			continue
		}
		want, err := decodeJob(p.id, kv.Value, kv.ModRevision)
		if err != nil {
			t.Fatal(err)
		}
		if got := other.v.jobs[p.id]; got != summarize(want) {
			t.Fatalf("job %s in the view:\n%+v\nstored:\n%+v", p.id, got, want)
		}
		if got, ok := other.v.active[p.id]; active(want) && (!ok || !reflect.DeepEqual(got, want)) {
			t.Fatalf("active job %s in the view:\n%+v\nstored:\n%+v", p.id, got, want)
		}
	}
}

// Admit answers with the record exactly as a read of it returns it.
func TestAdmitAnswersTheStoredRecord(t *testing.T) {
	h := newHarness(t, nil)
	in := admitInput(t, "s/answer")
	in.Spec.Env = map[string]string{"A": "1"}
	got, created, err := h.st.Admit(h.ctx, in)
	if err != nil || !created {
		t.Fatalf("admit: created=%v err=%v", created, err)
	}
	resp, err := h.cli.Get(h.ctx, h.st.k.job(got.ID))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("stored record: %v %d", err, len(resp.Kvs))
	}
	want, err := decodeJob(got.ID, resp.Kvs[0].Value, resp.Kvs[0].ModRevision)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("admit answered\n%+v\nthe stored record reads\n%+v", got, want)
	}
	if got.Revision == 0 || got.History[0].Revision != got.Revision {
		t.Fatalf("revisions not filled: %d / %d", got.Revision, got.History[0].Revision)
	}
}

// ActiveJobs sees exactly the jobs that are unresolved or hold a slot, as
// the watch changes them and after a fresh list.
func TestActiveJobsFollowResolution(t *testing.T) {
	h := newHarness(t, nil)
	kept := h.admit("s/kept")
	gone := h.admit("s/gone")
	if _, err := h.st.Cancel(h.ctx, gone.ID, "bob"); err != nil {
		t.Fatal(err)
	}
	check := func(st *Store) {
		t.Helper()
		var ids []string
		for _, j := range st.ActiveJobs(nil) {
			ids = append(ids, j.ID)
		}
		if !reflect.DeepEqual(ids, []string{kept.ID}) {
			t.Fatalf("active %v, want only %s", ids, kept.ID)
		}
		n := 0
		for _, c := range st.Counts() {
			n += c
		}
		if n != 2 {
			t.Fatalf("%d jobs in the view, want 2", n)
		}
		if got := st.ActiveJobs(func(j *jobs.Job) bool { return j.State == jobs.Running }); len(got) != 0 {
			t.Fatalf("filter ignored: %v", got)
		}
	}
	check(h.st)
	other, err := New(Config{Client: h.cli, Prefix: h.prefix, Defaults: testDefaults})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = other.Run(rctx) }()
	defer func() { cancel(); <-done }()
	if err := other.WaitSynced(h.ctx, 0); err != nil {
		t.Fatal(err)
	}
	check(other)
}
