package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"jobfence/internal/etcdtest"
	"jobfence/jobs"
)

func TestMain(m *testing.M) {
	code := m.Run()
	etcdtest.Shutdown()
	os.Exit(code)
}

type harness struct {
	t      testing.TB
	ctx    context.Context
	cli    *clientv3.Client
	st     *Store
	prefix string
	stop   func() // stops Run and waits for it
}

var testDefaults = jobs.Defaults{MemoryBytes: 64 << 20, MaxMemoryBytes: 1 << 30, Pids: 64, DeadlineSeconds: 600}

// newHarness starts a Store on the shared embedded etcd under a fresh
// prefix and checks, when the test ends, that Run and every goroutine the
// test started have stopped.
func newHarness(t testing.TB, mod func(*Config)) *harness {
	t.Helper()
	cli := etcdtest.New(t)
	warmLessor.Do(func() {
		// The client's keep-alive loops start with its first KeepAlive and
		// live as long as the client: start them before the leak baseline.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		g, err := cli.Grant(ctx, 5)
		if err == nil {
			kctx, kcancel := context.WithCancel(ctx)
			var ka <-chan *clientv3.LeaseKeepAliveResponse
			if ka, err = cli.KeepAlive(kctx, g.ID); err == nil {
				// The first answer proves both ends of the stream run.
				if _, ok := <-ka; !ok {
					err = errors.New("keep-alive channel closed")
				}
			}
			kcancel()
		}
		if err == nil {
			_, err = cli.Revoke(ctx, g.ID)
		}
		if err != nil {
			t.Fatalf("lease warm-up: %v", err)
		}
	})
	if tt, ok := t.(*testing.T); ok {
		ignore := goleak.IgnoreCurrent()
		// The embedded member's own stream handlers serve this process's
		// shared client; a leak of ours shows on the client side.
		server := goleak.IgnoreAnyFunction("go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc.(*LeaseServer).LeaseKeepAlive")
		tt.Cleanup(func() { goleak.VerifyNone(tt, ignore, server) })
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	prefix := etcdtest.Prefix(t)
	cfg := Config{Client: cli, Prefix: prefix, Defaults: testDefaults, ReplicaID: "r1"}
	if mod != nil {
		mod(&cfg)
	}
	st, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, ctx: ctx, cli: cli, st: st, prefix: prefix}
	h.stop = h.run()
	t.Cleanup(func() { h.stop(); cancel() })
	if err := st.WaitSynced(ctx, 0); err != nil {
		t.Fatal(err)
	}
	return h
}

// run starts the read model and returns a function that stops it.
func (h *harness) run() func() {
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.st.Run(rctx); err != nil {
			h.t.Errorf("Run: %v", err)
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// etcdRev is etcd's current revision; a write anywhere moves it.
func (h *harness) etcdRev() int64 {
	h.t.Helper()
	resp, err := h.cli.Get(h.ctx, "/rev-probe")
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// keysUnder lists the keys of one family straight from etcd.
func (h *harness) keysUnder(family string) map[string]string {
	h.t.Helper()
	resp, err := h.cli.Get(h.ctx, h.prefix+"/"+family+"/", clientv3.WithPrefix())
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = string(kv.Value)
	}
	return out
}

func (h *harness) admit(target string) *jobs.Job {
	h.t.Helper()
	j, created, err := h.st.Admit(h.ctx, admitInput(h.t, target))
	if err != nil || !created {
		h.t.Fatalf("admit %s: created=%v err=%v", target, created, err)
	}
	return j
}

func admitInput(t testing.TB, target string) AdmitInput {
	t.Helper()
	sub := jobs.Submission{Target: target, Command: []string{"/bin/true"},
		Outcome: &jobs.SubmissionOutcome{NotCommittedExitCodes: []int{3}}}
	tg, spec, err := sub.Validate(testDefaults)
	if err != nil {
		t.Fatal(err)
	}
	return AdmitInput{Target: tg, Spec: spec, Actor: "alice"}
}

func (h *harness) leader() Leadership {
	h.t.Helper()
	el, err := NewElector(h.cli, h.prefix, "r1", 5*time.Second)
	if err != nil {
		h.t.Fatal(err)
	}
	l, err := el.Campaign(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = el.Close() })
	return l
}

var warmLessor sync.Once

const secret = "00112233445566778899aabbccddeeff"

func (h *harness) running(l Leadership, target string) *jobs.Job {
	h.t.Helper()
	j := h.admit(target)
	r, err := h.st.MarkRunning(h.ctx, l, j.ID, j.Revision, MarkRunningInput{
		AgentID: "agent-1", AgentEpoch: "epoch-1", AgentAddress: "http://127.0.0.1:1",
		InvocationID: "inv-" + j.ID, SecretHash: jobs.HashSecret(secret), Deadline: time.Now().Add(time.Hour),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func envelopeFor(j *jobs.Job, code jobs.ResultCode, exit *int, proof jobs.Proof) jobs.ResultEnvelope {
	return jobs.ResultEnvelope{
		DispatchRevision: j.Dispatch.DispatchRevision, InvocationID: j.Dispatch.InvocationID,
		AgentEpoch: j.Dispatch.AgentEpoch, Secret: secret,
		Code: code, Phase: jobs.PhaseNativeReturn, ExitCode: exit, Proof: proof,
	}
}

func intp(i int) *int { return &i }

func TestAdmitRecordsFenceQuotaAndHistory(t *testing.T) {
	h := newHarness(t, nil)
	j := h.admit("Warehouse.Orders/IDX_Customer")
	if j.State != jobs.Pending || j.Revision == 0 || len(j.History) != 1 ||
		j.History[0].Event != jobs.EventAdmit || j.History[0].Revision != j.Revision {
		t.Fatalf("admitted %+v history %+v", j, j.History)
	}
	got, err := h.st.Get(h.ctx, j.ID)
	if err != nil || got.Revision != j.Revision || got.Target.Display != "Warehouse.Orders/IDX_Customer" {
		t.Fatalf("Get: %+v %v", got, err)
	}
	fences := h.st.Fences()
	if len(fences) != 1 || fences[0].Target != "warehouse.orders/idx_customer" || fences[0].JobID != j.ID || fences[0].State != jobs.Pending {
		t.Fatalf("fences %+v", fences)
	}
	g, per := h.st.QuotaUse()
	if g != 1 || per["warehouse.orders"] != 1 {
		t.Fatalf("quota use %d %v", g, per)
	}
	if n := len(h.keysUnder("quota/global")) + len(h.keysUnder("quota/scope")); n != 2 {
		t.Fatalf("%d quota keys in etcd, want 2", n)
	}

	before := h.etcdRev()
	_, _, err = h.st.Admit(h.ctx, admitInput(t, "  WAREHOUSE.orders / idx_customer "))
	var fh *jobs.FenceHeldError
	if !errors.As(err, &fh) || fh.HolderJobID != j.ID {
		t.Fatalf("second admission: %v", err)
	}
	if after := h.etcdRev(); after != before {
		t.Fatalf("a refused admission moved the revision %d -> %d", before, after)
	}
}

func TestConcurrentAdmissionsOneTarget(t *testing.T) {
	h := newHarness(t, nil)
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, _, errs[i] = h.st.Admit(h.ctx, admitInput(t, fmt.Sprintf("s/T%d", 0))) })
	}
	wg.Wait()
	ok, fenced := 0, 0
	for _, err := range errs {
		var fh *jobs.FenceHeldError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &fh):
			fenced++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 1 || fenced != n-1 {
		t.Fatalf("%d admitted, %d fenced; want 1 and %d", ok, fenced, n-1)
	}
	if len(h.keysUnder("jobs")) != 1 || len(h.keysUnder("fences")) != 1 {
		t.Fatal("etcd holds more than one job or fence")
	}
}

func TestConcurrentAdmissionsScopeQuota(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.QuotaPerScope = 10 })
	const n = 64
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { _, _, errs[i] = h.st.Admit(h.ctx, admitInput(t, fmt.Sprintf("scope/target-%d", i))) })
	}
	wg.Wait()
	ok, exhausted := 0, 0
	for _, err := range errs {
		var qe *jobs.QuotaExhaustedError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &qe) && qe.Scope == "scope" && !qe.Global:
			exhausted++
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 10 || exhausted != n-10 {
		t.Fatalf("%d admitted, %d exhausted; want 10 and %d", ok, exhausted, n-10)
	}
	if got := len(h.keysUnder("quota/scope")); got != 10 {
		t.Fatalf("%d scope tokens in etcd, want 10", got)
	}
}

func TestGlobalQuota(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.QuotaGlobal = 2 })
	h.admit("a/x")
	h.admit("b/x")
	_, _, err := h.st.Admit(h.ctx, admitInput(t, "c/x"))
	var qe *jobs.QuotaExhaustedError
	if !errors.As(err, &qe) || !qe.Global {
		t.Fatalf("third admission: %v", err)
	}
}

func TestCancelReleasesAndTargetAdmitsAgain(t *testing.T) {
	h := newHarness(t, nil)
	j := h.admit("s/n")
	c, err := h.st.Cancel(h.ctx, j.ID, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if c.State != jobs.NotCommitted || c.Result.Code != jobs.CodeCancelled || !c.Resolved || c.History[1].Actor != "bob" || c.History[1].Revision != c.Revision {
		t.Fatalf("cancelled %+v", c)
	}
	if len(h.keysUnder("fences")) != 0 || len(h.keysUnder("quota/global")) != 0 || len(h.keysUnder("quota/scope")) != 0 {
		t.Fatal("cancel left fence or quota keys")
	}
	if g, _ := h.st.QuotaUse(); g != 0 || len(h.st.Fences()) != 0 {
		t.Fatal("the view still shows fence or quota")
	}
	before := h.etcdRev()
	if _, err := h.st.Cancel(h.ctx, j.ID, "bob"); !errors.Is(err, jobs.ErrInvalidTransition) {
		t.Fatalf("second cancel: %v", err)
	}
	if h.etcdRev() != before {
		t.Fatal("a refused cancel wrote")
	}
	h.admit("S/N")
}

func TestIdempotency(t *testing.T) {
	h := newHarness(t, nil)
	in := admitInput(t, "s/n")
	in.IdempotencyKey, in.BodyHash = "k1", "hash-a"
	j, created, err := h.st.Admit(h.ctx, in)
	if err != nil || !created {
		t.Fatal(created, err)
	}
	before := h.etcdRev()
	again, created, err := h.st.Admit(h.ctx, in)
	if err != nil || created || again.ID != j.ID {
		t.Fatalf("repeat: %v created=%v id=%s", err, created, again.ID)
	}
	in.BodyHash = "hash-b"
	if _, _, err := h.st.Admit(h.ctx, in); !errors.Is(err, jobs.ErrIdempotencyMismatch) {
		t.Fatalf("other body: %v", err)
	}
	if h.etcdRev() != before {
		t.Fatal("idempotent answers wrote")
	}
	// The key belongs to its subject: another subject's same key is a new job.
	in.Actor, in.Target = "carol", jobs.Target{Scope: "s", Name: "m", Display: "s/m"}
	if _, created, err := h.st.Admit(h.ctx, in); err != nil || !created {
		t.Fatalf("other subject: %v %v", created, err)
	}
}

func TestAdmissionClosed(t *testing.T) {
	h := newHarness(t, nil)
	if err := h.st.SetAdmissionOpen(h.ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.st.Admit(h.ctx, admitInput(t, "s/n")); !errors.Is(err, jobs.ErrAdmissionClosed) {
		t.Fatalf("closed: %v", err)
	}
	if err := h.st.SetDispatchPaused(h.ctx, true); err != nil {
		t.Fatal(err)
	}
	if s := h.st.Settings(); s.AdmissionOpen || !s.DispatchPaused {
		t.Fatalf("settings %+v", s)
	}
	if err := h.st.SetAdmissionOpen(h.ctx, true); err != nil {
		t.Fatal(err)
	}
	h.admit("s/n")
}

func TestResultIdentityAndOutcome(t *testing.T) {
	h := newHarness(t, nil)
	l := h.leader()
	j := h.running(l, "s/n")
	if j.State != jobs.Running || !j.Slot.Held || j.Dispatch.DispatchRevision != j.Revision || j.Dispatch.SecretHash == "" {
		t.Fatalf("running %+v %+v", j, j.Dispatch)
	}
	if slots := h.st.Slots(); len(slots) != 1 || slots[0].JobID != j.ID || slots[0].AgentID != "agent-1" {
		t.Fatalf("slots %+v", slots)
	}
	good := envelopeFor(j, jobs.CodeExitCommitted, intp(0), jobs.ProofChildReaped)
	cases := []struct {
		name   string
		mutate func(*jobs.ResultEnvelope)
		want   error
	}{
		{"secret", func(e *jobs.ResultEnvelope) { e.Secret = "ffeeddccbbaa99887766554433221100" }, jobs.ErrForbidden},
		{"dispatch revision", func(e *jobs.ResultEnvelope) { e.DispatchRevision-- }, jobs.ErrStale},
		{"invocation id", func(e *jobs.ResultEnvelope) { e.InvocationID = "inv-other" }, jobs.ErrStale},
		{"epoch", func(e *jobs.ResultEnvelope) { e.AgentEpoch = "epoch-0" }, jobs.ErrStale},
	}
	for _, c := range cases {
		env := good
		c.mutate(&env)
		before := h.etcdRev()
		if _, _, err := h.st.CompleteWithResult(h.ctx, j.ID, env); !errors.Is(err, c.want) {
			t.Fatalf("%s: got %v, want %v", c.name, err, c.want)
		}
		if h.etcdRev() != before {
			t.Fatalf("%s mismatch wrote", c.name)
		}
	}
	done, applied, err := h.st.CompleteWithResult(h.ctx, j.ID, good)
	if err != nil || !applied {
		t.Fatal(applied, err)
	}
	if done.State != jobs.Committed || done.Slot.Held || done.Slot.Proof != jobs.ProofChildReaped || !done.Resolved {
		t.Fatalf("after result %+v", done)
	}
	if len(h.keysUnder("slots")) != 0 || len(h.keysUnder("fences")) != 0 || len(h.keysUnder("quota/scope")) != 0 {
		t.Fatal("result left slot, fence or quota keys")
	}
	before := h.etcdRev()
	again, applied, err := h.st.CompleteWithResult(h.ctx, j.ID, good)
	if err != nil || !applied || again.Revision != done.Revision || h.etcdRev() != before {
		t.Fatalf("repeat: %v applied=%v", err, applied)
	}
	// A wrong secret on a converged job is still refused first.
	bad := good
	bad.Secret = "x"
	if _, _, err := h.st.CompleteWithResult(h.ctx, j.ID, bad); !errors.Is(err, jobs.ErrForbidden) {
		t.Fatalf("late wrong secret: %v", err)
	}
}

func TestDeadlineLateResultAndForceRelease(t *testing.T) {
	h := newHarness(t, nil)
	l := h.leader()
	pending := h.admit("p/q")
	before := h.etcdRev()
	if _, err := h.st.ForceRelease(h.ctx, pending.ID, "op", "note"); !errors.Is(err, jobs.ErrInvalidTransition) {
		t.Fatalf("force release of PENDING: %v", err)
	}
	if h.etcdRev() != before {
		t.Fatal("refused force release wrote")
	}

	j := h.running(l, "s/n")
	u, err := h.st.Classify(h.ctx, l, j.ID, j.Revision, jobs.CodeNoTrustedResult, "deadline passed")
	if err != nil {
		t.Fatal(err)
	}
	if u.State != jobs.Unknown || !u.Slot.Held || u.Resolved || len(h.keysUnder("slots")) != 1 {
		t.Fatalf("after deadline %+v", u)
	}
	// The real report arrives late without a reaped domain: evidence only.
	late := envelopeFor(j, jobs.CodeKilledDeadline, nil, jobs.ProofNone)
	late.Phase = jobs.PhaseIndeterminateAfterLaunch
	u2, applied, err := h.st.CompleteWithResult(h.ctx, j.ID, late)
	if err != nil || !applied || u2.State != jobs.Unknown || len(u2.Result.Late) != 1 || !u2.Slot.Held {
		t.Fatalf("late report: %v %+v", err, u2)
	}

	// Another job past its deadline: a late report with a reaped domain
	// releases the slot, and nothing else.
	k := h.running(l, "s/late")
	if k, err = h.st.Classify(h.ctx, l, k.ID, k.Revision, jobs.CodeNoTrustedResult, ""); err != nil {
		t.Fatal(err)
	}
	reaped := envelopeFor(k, jobs.CodeExitCommitted, intp(0), jobs.ProofChildReaped)
	k2, _, err := h.st.CompleteWithResult(h.ctx, k.ID, reaped)
	if err != nil || k2.State != jobs.Unknown || k2.Slot.Held || k2.Slot.Proof != jobs.ProofChildReaped || k2.Resolved {
		t.Fatalf("late reaped report: %v %+v", err, k2)
	}
	if _, err := h.cli.Get(h.ctx, h.st.k.slot("agent-1", k.ID)); err != nil {
		t.Fatal(err)
	}
	if len(h.keysUnder("slots")) != 1 || len(h.keysUnder("fences")) != 3 {
		t.Fatal("a late report released more than its slot")
	}

	f, err := h.st.ForceRelease(h.ctx, j.ID, "operator-1", "checked the index")
	if err != nil {
		t.Fatal(err)
	}
	if f.State != jobs.Unknown || !f.Resolved || f.Force == nil || f.Force.Actor != "operator-1" ||
		f.Force.Note != "checked the index" || f.Force.Warning == "" || f.Force.At.IsZero() ||
		f.Slot.Held || f.Slot.Proof != jobs.ProofForceReleased {
		t.Fatalf("force released %+v %+v", f, f.Force)
	}
	if len(h.keysUnder("slots")) != 0 || len(h.keysUnder("quota/global")) != 2 || len(h.keysUnder("fences")) != 2 {
		t.Fatal("force release did not release exactly its own fence, quota and slot")
	}
	before = h.etcdRev()
	same, err := h.st.ForceRelease(h.ctx, j.ID, "operator-2", "again")
	if err != nil || same.Revision != f.Revision || same.Force.Actor != "operator-1" || h.etcdRev() != before {
		t.Fatalf("repeat force release: %v %+v", err, same)
	}
	h.admit("s/n")
}

func TestServerClassificationsAndEpochSweep(t *testing.T) {
	h := newHarness(t, nil)
	l := h.leader()
	for _, code := range []jobs.ResultCode{jobs.CodeRefusedByAgent, jobs.CodeTombstoned} {
		j := h.running(l, "s/"+string(code))
		n, err := h.st.Classify(h.ctx, l, j.ID, j.Revision, code, "queue-full")
		if err != nil {
			t.Fatal(err)
		}
		if n.State != jobs.NotCommitted || n.Slot.Held || n.Slot.Proof != jobs.ProofNotEnqueued || !n.Resolved {
			t.Fatalf("%s: %+v", code, n)
		}
	}
	j := h.running(l, "s/epoch")
	// A stale revision writes nothing.
	before := h.etcdRev()
	if _, err := h.st.RecordTerminationProof(h.ctx, l, j.ID, j.Revision-1, jobs.ProofAgentEpochReplaced); !errors.Is(err, jobs.ErrStale) {
		t.Fatalf("stale proof: %v", err)
	}
	if h.etcdRev() != before {
		t.Fatal("stale proof wrote")
	}
	n, err := h.st.RecordTerminationProof(h.ctx, l, j.ID, j.Revision, jobs.ProofAgentEpochReplaced)
	if err != nil {
		t.Fatal(err)
	}
	if n.State != jobs.Running || n.Slot.Held || n.Slot.Proof != jobs.ProofAgentEpochReplaced || len(h.keysUnder("slots")) != 0 {
		t.Fatalf("after epoch sweep %+v", n)
	}
	if len(h.keysUnder("fences")) != 1 {
		t.Fatal("the epoch sweep released the fence")
	}
	if len(h.st.Slots()) != 0 {
		t.Fatal("the view still shows the slot")
	}
}

func TestRefreshLifecycle(t *testing.T) {
	h := newHarness(t, nil)
	l := h.leader()
	in := admitInput(t, "s/refresh")
	in.Spec.Refresh = &jobs.Refresh{URL: "http://127.0.0.1:1/hook"}
	j, _, err := h.st.Admit(h.ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	j, err = h.st.MarkRunning(h.ctx, l, j.ID, j.Revision, MarkRunningInput{AgentID: "a", AgentEpoch: "e", InvocationID: "i",
		SecretHash: jobs.HashSecret(secret), Deadline: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	j, _, err = h.st.CompleteWithResult(h.ctx, j.ID, envelopeFor(j, jobs.CodeExitCommitted, intp(0), jobs.ProofChildReaped))
	if err != nil || j.RefreshState != jobs.RefreshRequired || j.Resolved {
		t.Fatalf("committed: %v %+v", err, j)
	}
	step := func(name string, f func(*jobs.Job) (*jobs.Job, error), want jobs.RefreshState) {
		t.Helper()
		n, err := f(j)
		if err != nil || n.RefreshState != want {
			t.Fatalf("%s: %v %+v", name, err, n)
		}
		j = n
	}
	step("running", func(j *jobs.Job) (*jobs.Job, error) { return h.st.MarkRefreshRunning(h.ctx, l, j.ID, j.Revision) }, jobs.RefreshRunning)
	step("downgrade", func(j *jobs.Job) (*jobs.Job, error) { return h.st.DowngradeRefresh(h.ctx, l, j.ID, j.Revision) }, jobs.RefreshRequired)
	step("running", func(j *jobs.Job) (*jobs.Job, error) { return h.st.MarkRefreshRunning(h.ctx, l, j.ID, j.Revision) }, jobs.RefreshRunning)
	step("failed", func(j *jobs.Job) (*jobs.Job, error) {
		return h.st.MarkRefreshFailed(h.ctx, l, j.ID, j.Revision, "hook answered 503")
	}, jobs.RefreshFailed)
	if len(h.keysUnder("fences")) != 1 {
		t.Fatal("fence released before the refresh was done")
	}
	step("running", func(j *jobs.Job) (*jobs.Job, error) { return h.st.MarkRefreshRunning(h.ctx, l, j.ID, j.Revision) }, jobs.RefreshRunning)
	step("done", func(j *jobs.Job) (*jobs.Job, error) { return h.st.MarkRefreshDone(h.ctx, l, j.ID, j.Revision) }, jobs.RefreshDone)
	if !j.Resolved || len(h.keysUnder("fences")) != 0 || len(h.keysUnder("quota/global")) != 0 {
		t.Fatal("refresh done did not release fence and quota")
	}
	revs := map[int64]bool{}
	for _, e := range j.History {
		if e.Revision == 0 || revs[e.Revision] {
			t.Fatalf("history revisions not filled or repeated: %+v", j.History)
		}
		revs[e.Revision] = true
	}
	// Retention removes resolved records without a held slot.
	n, err := h.st.RemoveResolved(h.ctx, time.Now().Add(time.Minute), 10)
	if err != nil || n != 1 {
		t.Fatalf("removed %d %v", n, err)
	}
	if _, err := h.st.Get(h.ctx, j.ID); !errors.Is(err, jobs.ErrNotFound) {
		t.Fatalf("after removal: %v", err)
	}
}

func TestLeaderOnlyWriteAfterLostElection(t *testing.T) {
	h := newHarness(t, nil)
	for _, how := range []string{"resign", "session closed", "lease lost"} {
		a, _ := NewElector(h.cli, h.prefix, "a", 5*time.Second)
		b, _ := NewElector(h.cli, h.prefix, "b", 5*time.Second)
		la, err := a.Campaign(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if id, rev, err := a.Leader(h.ctx); err != nil || id != "a" || rev != la.Rev {
			t.Fatalf("leader %q %d %v", id, rev, err)
		}
		j := h.admit("s/" + how)
		switch how {
		case "resign":
			if err := a.Resign(h.ctx); err != nil {
				t.Fatal(err)
			}
		case "lease lost":
			// As if the lease expired: revoked behind the elector's back.
			a.mu.Lock()
			lease := a.session.Lease()
			a.mu.Unlock()
			if _, err := h.cli.Revoke(h.ctx, lease); err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.Done():
			case <-h.ctx.Done():
				t.Fatal("Done not closed after the lease was lost")
			}
			defer a.Close()
		default:
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			select {
			case <-a.Done():
			default:
				t.Fatal("Done not closed after the session ended")
			}
		}
		lb, err := b.Campaign(h.ctx)
		if err != nil {
			t.Fatal(err)
		}
		before := h.etcdRev()
		_, err = h.st.MarkRunning(h.ctx, la, j.ID, j.Revision, MarkRunningInput{AgentID: "x", AgentEpoch: "e", InvocationID: "i",
			SecretHash: jobs.HashSecret(secret), Deadline: time.Now().Add(time.Hour)})
		if !errors.Is(err, jobs.ErrNotLeader) {
			t.Fatalf("%s: deposed leader's write: %v", how, err)
		}
		if h.etcdRev() != before {
			t.Fatalf("%s: deposed leader's write changed etcd", how)
		}
		if _, err := h.st.MarkRunning(h.ctx, lb, j.ID, j.Revision, MarkRunningInput{AgentID: "x", AgentEpoch: "e", InvocationID: "i",
			SecretHash: jobs.HashSecret(secret), Deadline: time.Now().Add(time.Hour)}); err != nil {
			t.Fatalf("%s: new leader's write: %v", how, err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// The view, re-read from etcd, must match it exactly.
func (h *harness) assertViewEqualsEtcd() {
	h.t.Helper()
	resp, err := h.cli.Get(h.ctx, h.prefix+"/", clientv3.WithPrefix())
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.st.WaitSynced(h.ctx, resp.Header.Revision); err != nil {
		h.t.Fatal(err)
	}
	want := newView()
	for _, kv := range resp.Kvs {
		_, _ = h.st.applyKV(want, string(kv.Key), kv.Value, kv.ModRevision, false)
	}
	h.st.mu.RLock()
	defer h.st.mu.RUnlock()
	got := h.st.v
	if len(got.jobs) != len(want.jobs) || len(got.fences) != len(want.fences) || len(got.quotaGlobal) != len(want.quotaGlobal) ||
		len(got.corrupt) != len(want.corrupt) || len(got.slots) != len(want.slots) {
		h.t.Fatalf("view has %d jobs %d fences %d tokens %d corrupt; etcd %d %d %d %d",
			len(got.jobs), len(got.fences), len(got.quotaGlobal), len(got.corrupt),
			len(want.jobs), len(want.fences), len(want.quotaGlobal), len(want.corrupt))
	}
	for id, j := range want.jobs {
		g, ok := got.jobs[id]
		if !ok || g.Revision != j.Revision || g.State != j.State {
			h.t.Fatalf("job %s: view %+v, etcd %+v", id, g, j)
		}
	}
	for t, id := range want.fences {
		if got.fences[t] != id {
			h.t.Fatalf("fence %s: view %q etcd %q", t, got.fences[t], id)
		}
	}
}

func TestCompactionRelist(t *testing.T) {
	h := newHarness(t, nil)
	a := h.admit("s/a")
	h.admit("s/b")
	// Stop the watch: the view is now behind everything that follows.
	h.stop()
	relists := h.st.Relists()
	// A second store writes what the stopped one cannot see.
	other, err := New(Config{Client: h.cli, Prefix: h.prefix, Defaults: testDefaults})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = other.Run(rctx) }()
	if err := other.WaitSynced(h.ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Cancel(h.ctx, a.ID, "bob"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Admit(h.ctx, admitInput(t, "s/c")); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	rev := h.etcdRev()
	if _, err := h.cli.Compact(h.ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	h.stop = h.run()
	h.assertViewEqualsEtcd()
	if h.st.Relists() <= relists {
		t.Fatal("the read model did not re-list after the compaction")
	}
	if j, _ := h.st.Get(h.ctx, a.ID); j == nil || j.State != jobs.NotCommitted {
		t.Fatalf("cancelled job in the view: %+v", j)
	}
	if c := h.st.Cursor(); c.Revision < rev {
		t.Fatalf("cursor %+v behind %d", c, rev)
	}
}

func TestCorruptRecordFailsClosedUntilForceReleased(t *testing.T) {
	h := newHarness(t, nil)
	const bad = "01938000-0000-7000-8000-00000000dead"
	// An undecodable record with a fence and a quota token naming it.
	if _, err := h.cli.Txn(h.ctx).Then(
		clientv3.OpPut(h.st.k.job(bad), "{not json"),
		clientv3.OpPut(h.st.k.fence("s/broken"), bad),
		clientv3.OpPut(h.st.k.quotaScope("s", 0), bad),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	h.assertViewEqualsEtcd()
	_, _, err := h.st.Admit(h.ctx, admitInput(t, "other/target"))
	var fc *jobs.FailClosedError
	if !errors.As(err, &fc) || fc.JobID != bad {
		t.Fatalf("admission with a corrupt record: %v", err)
	}
	if cr := h.st.CorruptRecords(); len(cr) != 1 || cr[0].ID != bad {
		t.Fatalf("corrupt records %+v", cr)
	}
	f, err := h.st.ForceRelease(h.ctx, bad, "operator", "record was garbage")
	if err != nil || f.Force == nil {
		t.Fatalf("force release of a corrupt record: %v", err)
	}
	if len(h.keysUnder("jobs")) != 0 || len(h.keysUnder("fences")) != 0 || len(h.keysUnder("quota/scope")) != 0 {
		t.Fatal("corrupt record or its keys survived")
	}
	h.admit("s/broken")

	// An unresolved record without a target fails closed too.
	const targetless = "01938000-0000-7000-8000-00000000beef"
	if _, err := h.cli.Put(h.ctx, h.st.k.job(targetless), `{"id":"`+targetless+`","state":"PENDING"}`); err != nil {
		t.Fatal(err)
	}
	h.assertViewEqualsEtcd()
	if _, _, err := h.st.Admit(h.ctx, admitInput(t, "x/y")); !errors.As(err, &fc) || fc.JobID != targetless {
		t.Fatalf("admission with a target-less record: %v", err)
	}
	if _, err := h.st.ForceRelease(h.ctx, targetless, "operator", "no target"); err != nil {
		t.Fatal(err)
	}
	h.admit("x/y")
}

func TestSubscribeCursorAgentsAndList(t *testing.T) {
	h := newHarness(t, nil)
	ch, cancel := h.st.Subscribe()
	defer cancel()
	j := h.admit("s/n")
	deadline := time.After(10 * time.Second)
	for seen := false; !seen; {
		select {
		case c := <-ch:
			seen = c.Kind == "job" && c.ID == j.ID && c.Revision == j.Revision
		case <-deadline:
			t.Fatal("no job change published")
		}
	}
	if c := h.st.Cursor(); c.Revision < j.Revision || c.Lag < 0 {
		t.Fatalf("cursor %+v", c)
	}
	a, err := h.st.PutAgent(h.ctx, "agent-1", jobs.AgentRegistration{Address: "http://127.0.0.1:9", Epoch: "e1", Capacity: 4})
	if err != nil {
		t.Fatal(err)
	}
	if ag := h.st.Agents(); len(ag) != 1 || ag[0].ID != "agent-1" || !ag[0].Live || ag[0].Epoch != "e1" || !ag[0].RegisteredAt.Equal(a.RegisteredAt) {
		t.Fatalf("agents %+v", ag)
	}
	k := h.admit("s/m")
	page, next, err := h.st.List(h.ctx, ListFilter{Limit: 1})
	if err != nil || len(page) != 1 || page[0].ID != k.ID || next == "" {
		t.Fatalf("first page %v %q %v", page, next, err)
	}
	page, next, _ = h.st.List(h.ctx, ListFilter{Limit: 1, PageToken: next})
	if len(page) != 1 || page[0].ID != j.ID || next != "" {
		t.Fatalf("second page %v %q", page, next)
	}
	if counts := h.st.Counts(); counts[jobs.Pending] != 2 || counts[jobs.Unknown] != 0 {
		t.Fatalf("counts %v", counts)
	}
}

// A revision made by a write outside the prefix has no event here; the view
// still reaches it (progress notification), so WaitSynced returns.
func TestWaitSyncedPastForeignRevision(t *testing.T) {
	h := newHarness(t, nil)
	resp, err := h.cli.Put(h.ctx, "/elsewhere"+h.prefix, "x")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(h.ctx, 20*time.Second)
	defer cancel()
	if err := h.st.WaitSynced(ctx, resp.Header.Revision); err != nil {
		t.Fatalf("WaitSynced(%d): %v (cursor %+v)", resp.Header.Revision, err, h.st.Cursor())
	}
}

// A subscriber that does not keep up loses changes but is told so.
func TestSubscriberOverflowGetsResync(t *testing.T) {
	h := newHarness(t, nil)
	ch, cancel := h.st.Subscribe()
	defer cancel()
	for i := range 300 {
		h.st.publish(Change{Kind: "job", ID: fmt.Sprint(i), Revision: int64(i)})
	}
	for range cap(ch) {
		if c := <-ch; c.Kind != "job" {
			t.Fatalf("buffered change %+v", c)
		}
	}
	h.st.publish(Change{Kind: "job", ID: "next", Revision: 1000})
	if c := <-ch; c.Kind != "resync" {
		t.Fatalf("after an overflow got %+v, want a resync marker", c)
	}
	if c := <-ch; c.ID != "next" {
		t.Fatalf("after the marker got %+v", c)
	}
}

// Two replicas admitting into one scope at once still stop at the limit.
func TestQuotaExactAcrossReplicas(t *testing.T) {
	h := newHarness(t, func(c *Config) { c.QuotaPerScope = 10 })
	other, err := New(Config{Client: h.cli, Prefix: h.prefix, Defaults: testDefaults, QuotaPerScope: 10, ReplicaID: "r2"})
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
	const n = 48
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		st := h.st
		if i%2 == 1 {
			st = other
		}
		wg.Go(func() { _, _, errs[i] = st.Admit(h.ctx, admitInput(t, fmt.Sprintf("shared/t%d", i))) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		var qe *jobs.QuotaExhaustedError
		switch {
		case err == nil:
			ok++
		case errors.As(err, &qe):
		default:
			t.Errorf("unexpected error: %v", err)
		}
	}
	if ok != 10 || len(h.keysUnder("quota/scope")) != 10 || len(h.keysUnder("jobs")) != 10 {
		t.Fatalf("%d admitted across two replicas, want 10", ok)
	}
}

// Concurrent requests with one Idempotency-Key make one job.
func TestConcurrentIdempotentAdmissions(t *testing.T) {
	h := newHarness(t, nil)
	in := admitInput(t, "s/idem")
	in.IdempotencyKey, in.BodyHash = "same", "h"
	const n = 16
	ids := make([]string, n)
	created := make([]bool, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			j, c, err := h.st.Admit(h.ctx, in)
			if err != nil {
				t.Errorf("admission %d: %v", i, err)
				return
			}
			ids[i], created[i] = j.ID, c
		})
	}
	wg.Wait()
	nCreated := 0
	for i := range n {
		if ids[i] != ids[0] {
			t.Fatalf("two jobs for one key: %s and %s", ids[0], ids[i])
		}
		if created[i] {
			nCreated++
		}
	}
	if nCreated != 1 {
		t.Fatalf("%d answers said created, want 1", nCreated)
	}
}

// An agent value that cannot be decoded makes the view re-list, and it
// stays usable.
func TestUndecodableEventRelists(t *testing.T) {
	h := newHarness(t, nil)
	before := h.st.Relists()
	if _, err := h.cli.Put(h.ctx, h.st.k.agent("broken"), "{"); err != nil {
		t.Fatal(err)
	}
	j := h.admit("s/after")
	for h.st.Relists() == before {
		select {
		case <-h.ctx.Done():
			t.Fatal("no re-list after an undecodable event")
		case <-time.After(10 * time.Millisecond):
		}
	}
	h.assertViewEqualsEtcd()
	if _, err := h.st.Get(h.ctx, j.ID); err != nil {
		t.Fatal(err)
	}
}
