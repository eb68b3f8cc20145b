package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"jobfence/internal/etcdtest"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// clock is a settable time source shared by the store and the dispatcher,
// so deadlines and retry intervals pass without waiting.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// syncBuffer collects log output from goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type harness struct {
	t      *testing.T
	ctx    context.Context
	cli    *clientv3.Client
	prefix string
	st     *store.Store
	clock  *clock
	agents *fakeAgents
	logs   *syncBuffer
	l      store.Leadership
	cfg    DispatchConfig
	d      *Dispatcher
	tm     *term
}

func newHarness(t *testing.T, mutate func(*DispatchConfig)) *harness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, ctx: ctx, cli: etcdtest.New(t), prefix: etcdtest.Prefix(t), clock: newClock(),
		agents: &fakeAgents{}, logs: &syncBuffer{}}
	logger := slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, err := store.New(store.Config{
		Client: h.cli, Prefix: h.prefix, QuotaGlobal: 100, QuotaPerScope: 100,
		Defaults:  jobs.Defaults{MemoryBytes: 64 << 20, MaxMemoryBytes: 1 << 30, Pids: 64, DeadlineSeconds: 60},
		ReplicaID: "r1", Now: h.clock.Now, Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	h.st = st
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_ = st.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-runDone
	})
	waitFor(t, "read model ready", st.Ready)
	h.l = elect(t, ctx, h.cli, h.prefix, "r1")
	h.cfg = DefaultDispatchConfig()
	h.cfg.RefreshRetry = time.Minute
	if mutate != nil {
		mutate(&h.cfg)
	}
	h.d = h.newDispatcher()
	h.tm = h.newTerm()
	return h
}

func (h *harness) newDispatcher() *Dispatcher {
	h.t.Helper()
	d, err := NewDispatcher(DispatcherOptions{
		Config: h.cfg, Store: h.st, Agents: h.agents, Now: h.clock.Now,
		Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return d
}

// newTerm starts a leadership term the way Run does, so tests can drive
// single rounds.
func (h *harness) newTerm() *term {
	tm := &term{l: h.l, unsure: map[string]struct{}{}, refreshing: map[string]struct{}{}}
	if err := h.d.takeOver(h.ctx, tm); err != nil {
		h.t.Fatalf("take over: %v", err)
	}
	h.t.Cleanup(tm.wg.Wait)
	return tm
}

func (h *harness) round() {
	h.t.Helper()
	if err := h.d.round(h.ctx, h.tm); err != nil {
		h.t.Fatalf("round: %v", err)
	}
}

func (h *harness) agent(id, epoch string, capacity int) {
	h.t.Helper()
	_, err := h.st.PutAgent(h.ctx, id, jobs.AgentRegistration{
		Address: "http://127.0.0.1:1", Epoch: epoch, Capacity: capacity,
		Isolation: jobs.Isolation{Mode: "test", Verified: true, Detail: "fake"},
	})
	if err != nil {
		h.t.Fatalf("put agent: %v", err)
	}
}

type jobOpt func(*store.AdmitInput)

func withCredentials(p string) jobOpt { return func(in *store.AdmitInput) { in.Spec.Credentials = p } }
func withRefresh(url string) jobOpt {
	return func(in *store.AdmitInput) { in.Spec.Refresh = &jobs.Refresh{URL: url} }
}

func (h *harness) admit(target string, opts ...jobOpt) *jobs.Job {
	h.t.Helper()
	tg, err := jobs.ParseTarget(target)
	if err != nil {
		h.t.Fatal(err)
	}
	in := store.AdmitInput{
		Target: tg, Operation: "create", Actor: "tester",
		Spec: jobs.Spec{
			Command:    []string{"/bin/true"},
			WorkingDir: "/",
			Limits:     jobs.Limits{MemoryBytes: 64 << 20, Pids: 64, DeadlineSeconds: 60},
			Outcome:    jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{}},
		},
	}
	for _, o := range opts {
		o(&in)
	}
	j, created, err := h.st.Admit(h.ctx, in)
	if err != nil || !created {
		h.t.Fatalf("admit %s: created=%v err=%v", target, created, err)
	}
	return j
}

func (h *harness) get(id string) *jobs.Job {
	h.t.Helper()
	j, err := h.st.Get(h.ctx, id)
	if err != nil {
		h.t.Fatalf("get %s: %v", id, err)
	}
	return j
}

// rev is etcd's current revision: an idle round must not move it.
func (h *harness) rev() int64 {
	h.t.Helper()
	resp, err := h.cli.Get(h.ctx, "jobfence-revision-probe")
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// dump is every value under the test's prefix, for leak checks.
func (h *harness) dump() string {
	h.t.Helper()
	resp, err := h.cli.Get(h.ctx, h.prefix, clientv3.WithPrefix())
	if err != nil {
		h.t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		b.Write(kv.Key)
		b.WriteByte('=')
		b.Write(kv.Value)
		b.WriteByte('\n')
	}
	return b.String()
}

func (h *harness) report(j *jobs.Job, secret string, code jobs.ResultCode, phase jobs.Phase, exit *int, proof jobs.Proof) (*jobs.Job, bool, error) {
	return h.st.CompleteWithResult(h.ctx, j.ID, jobs.ResultEnvelope{
		DispatchRevision: j.Dispatch.DispatchRevision, InvocationID: j.Dispatch.InvocationID,
		AgentEpoch: j.Dispatch.AgentEpoch, Secret: secret, Code: code, Phase: phase,
		ExitCode: exit, Proof: proof,
	})
}

func intp(i int) *int { return &i }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func writeCredentials(t *testing.T, path string, profiles map[string]map[string]string) {
	t.Helper()
	data, err := json.Marshal(profiles)
	if err != nil {
		t.Fatal(err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestDispatchCommitsBeforeTheOneSend(t *testing.T) {
	credFile := filepath.Join(t.TempDir(), "creds.json")
	const credValue = "pa55-w0rd-never-stored"
	writeCredentials(t, credFile, map[string]map[string]string{"warehouse-rw": {"DB_PASSWORD": credValue}})
	h := newHarness(t, func(c *DispatchConfig) { c.CredentialsFile = credFile })
	h.agent("a1", "epoch-1", 2)
	j := h.admit("wh/idx", withCredentials("warehouse-rw"))
	start := h.clock.Now()

	h.round()

	sent := h.agents.sent()
	if len(sent) != 1 {
		t.Fatalf("sends = %d, want 1", len(sent))
	}
	s := sent[0]
	stored := h.get(j.ID)
	if stored.State != jobs.Running || !stored.Slot.Held || stored.Slot.AgentID != "a1" {
		t.Fatalf("stored job: state %s slot %+v", stored.State, stored.Slot)
	}
	// What went on the wire is the identity that committed, read back after markRunning.
	if s.Job.State != jobs.Running || s.Job.Dispatch == nil || *s.Job.Dispatch != *stored.Dispatch {
		t.Fatalf("sent identity %+v, stored %+v", s.Job.Dispatch, stored.Dispatch)
	}
	d := stored.Dispatch
	if u, err := uuid.Parse(d.InvocationID); err != nil || u.Version() != 4 {
		t.Fatalf("invocation id %q is not a UUIDv4", d.InvocationID)
	}
	if d.AgentEpoch != "epoch-1" || d.AgentID != "a1" || d.DispatchRevision == 0 {
		t.Fatalf("dispatch identity %+v", d)
	}
	if !d.Deadline.Equal(start.Add(60 * time.Second)) {
		t.Fatalf("deadline %s, want %s", d.Deadline, start.Add(60*time.Second))
	}
	if len(s.Secret) != 32 || jobs.HashSecret(s.Secret) != d.SecretHash {
		t.Fatalf("secret of %d chars does not match the stored hash", len(s.Secret))
	}
	if s.Credentials["DB_PASSWORD"] != credValue || len(s.Credentials) != 1 {
		t.Fatalf("credentials not resolved into the send")
	}
	for what, text := range map[string]string{"etcd": h.dump(), "logs": h.logs.String()} {
		if strings.Contains(text, credValue) || strings.Contains(text, s.Secret) {
			t.Fatalf("a credential value or the secret leaked into %s", what)
		}
	}

	// A RUNNING job is never sent again, and the round that finds nothing to do writes nothing.
	before := h.rev()
	h.round()
	h.round()
	if n := len(h.agents.sent()); n != 1 {
		t.Fatalf("sends after more rounds = %d, want 1", n)
	}
	if after := h.rev(); after != before {
		t.Fatalf("idle rounds moved the etcd revision %d -> %d", before, after)
	}

	done, _, err := h.report(stored, s.Secret, jobs.CodeExitCommitted, jobs.PhaseNativeReturn, intp(0), jobs.ProofChildReaped)
	if err != nil {
		t.Fatal(err)
	}
	if done.State != jobs.Committed || done.Slot.Held || done.Slot.Proof != jobs.ProofChildReaped || !done.Resolved {
		t.Fatalf("after report: state %s slot %+v resolved %v", done.State, done.Slot, done.Resolved)
	}
	if len(h.st.Fences()) != 0 {
		t.Fatalf("fence still held: %+v", h.st.Fences())
	}
}

func TestTypedRefusalIsNotCommitted(t *testing.T) {
	for _, refusal := range []string{"queue-full", "isolation-unverified"} {
		t.Run(refusal, func(t *testing.T) {
			h := newHarness(t, nil)
			h.agent("a1", "e1", 1)
			h.agents.set(func(AgentDispatch) error { return &RefusalError{Type: refusal, Status: 503} }, nil)
			j := h.admit("wh/" + refusal)
			h.round()
			got := h.get(j.ID)
			if got.State != jobs.NotCommitted || got.Result == nil || got.Result.Code != jobs.CodeRefusedByAgent ||
				got.Result.Detail != refusal {
				t.Fatalf("state %s result %+v", got.State, got.Result)
			}
			if got.Slot.Held || got.Slot.Proof != jobs.ProofNotEnqueued || !got.Resolved {
				t.Fatalf("slot %+v resolved %v", got.Slot, got.Resolved)
			}
			if len(h.st.Fences()) != 0 {
				t.Fatalf("fence still held")
			}
		})
	}
}

func TestTransportErrorIsSettledByTombstone(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	h.agents.set(func(AgentDispatch) error { return errTransport }, func(string, string) (string, error) {
		return "", errTransport
	})
	j := h.admit("wh/t1")
	h.round()
	got := h.get(j.ID)
	if got.State != jobs.Running || !got.Slot.Held {
		t.Fatalf("after a transport error: state %s slot %+v", got.State, got.Slot)
	}
	inv := got.Dispatch.InvocationID

	// An unreachable agent is asked again next round and the job stays RUNNING.
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running {
		t.Fatalf("state %s after an unanswered tombstone", got.State)
	}
	h.agents.set(nil, nil) // the agent answers now: it never saw the invocation
	h.round()
	got = h.get(j.ID)
	if got.State != jobs.NotCommitted || got.Result.Code != jobs.CodeTombstoned || got.Slot.Proof != jobs.ProofNotEnqueued {
		t.Fatalf("after tombstone: state %s result %+v slot %+v", got.State, got.Result, got.Slot)
	}
	asked := h.agents.asked()
	if len(asked) != 2 || asked[0] != inv || asked[1] != inv {
		t.Fatalf("tombstone queries %v, want two for %s", asked, inv)
	}
	if n := len(h.agents.sent()); n != 1 {
		t.Fatalf("sends = %d, want exactly 1", n)
	}
}

func TestArrivedInvocationWaitsForItsReport(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	h.agents.set(func(AgentDispatch) error { return errTransport }, func(string, string) (string, error) {
		return InvocationRunning, nil
	})
	j := h.admit("wh/t1")
	h.round()
	h.round()
	before := h.rev()
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running || !got.Slot.Held {
		t.Fatalf("state %s slot %+v", got.State, got.Slot)
	}
	if n := len(h.agents.asked()); n != 1 {
		t.Fatalf("tombstone queries = %d, want 1: a live invocation is not asked about again", n)
	}
	if h.rev() != before {
		t.Fatal("a round with nothing to settle wrote to etcd")
	}
}

func TestDeadlineSweepAndLateReport(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	j := h.admit("wh/slow")
	h.round()
	running := h.get(j.ID)
	secret := h.agents.sent()[0].Secret

	h.clock.Advance(59 * time.Second)
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running {
		t.Fatalf("swept before the deadline: %s", got.State)
	}
	h.clock.Advance(2 * time.Second)
	h.round()
	got := h.get(j.ID)
	if got.State != jobs.Unknown || got.Result.Code != jobs.CodeNoTrustedResult {
		t.Fatalf("after the deadline: state %s result %+v", got.State, got.Result)
	}
	if !got.Slot.Held || len(h.st.Fences()) != 1 {
		t.Fatalf("the deadline released something: slot %+v fences %d", got.Slot, len(h.st.Fences()))
	}

	late, _, err := h.report(running, secret, jobs.CodeExitCommitted, jobs.PhaseNativeReturn, intp(0), jobs.ProofChildReaped)
	if err != nil {
		t.Fatal(err)
	}
	if late.State != jobs.Unknown || late.Slot.Held || late.Slot.Proof != jobs.ProofChildReaped ||
		len(late.Result.Late) != 1 || late.Result.Late[0].Code != jobs.CodeExitCommitted {
		t.Fatalf("late report: state %s slot %+v late %+v", late.State, late.Slot, late.Result.Late)
	}
	if len(h.st.Fences()) != 1 {
		t.Fatal("a late report released the fence of an UNKNOWN job")
	}
}

func TestEpochSweepReleasesOnlyOnANewEpoch(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	j := h.admit("wh/e")
	h.round()
	h.clock.Advance(61 * time.Second)
	h.round() // UNKNOWN, slot held

	// Same epoch, stale heartbeat: nothing is proven, nothing is written.
	before := h.rev()
	h.round()
	if h.rev() != before || !h.get(j.ID).Slot.Held {
		t.Fatal("the epoch sweep acted without a new epoch")
	}

	h.agent("a1", "e2", 1)
	h.round()
	got := h.get(j.ID)
	if got.Slot.Held || got.Slot.Proof != jobs.ProofAgentEpochReplaced || got.State != jobs.Unknown {
		t.Fatalf("after a new epoch: state %s slot %+v", got.State, got.Slot)
	}
	if len(h.st.Fences()) != 1 {
		t.Fatal("an epoch change released the fence of an UNKNOWN job")
	}
}

func TestMissingProfileBlocksUntilTheFileHasIt(t *testing.T) {
	credFile := filepath.Join(t.TempDir(), "creds.json")
	writeCredentials(t, credFile, map[string]map[string]string{"other": {"X": "y"}})
	h := newHarness(t, func(c *DispatchConfig) { c.CredentialsFile = credFile })
	h.agent("a1", "e1", 1)
	j := h.admit("wh/c", withCredentials("reporting-ro"))
	before := h.rev()
	h.round()
	h.round()
	if got := h.get(j.ID); got.State != jobs.Pending {
		t.Fatalf("state %s, want PENDING", got.State)
	}
	if h.rev() != before || len(h.agents.sent()) != 0 {
		t.Fatal("a blocked job caused a write or a send")
	}
	if reason := h.d.BlockedReason(j.ID); !strings.Contains(reason, "reporting-ro") {
		t.Fatalf("blocked reason %q does not name the profile", reason)
	}

	writeCredentials(t, credFile, map[string]map[string]string{"reporting-ro": {"TOKEN": "v-123456"}})
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running {
		t.Fatalf("state %s after the profile appeared", got.State)
	}
	if h.d.BlockedReason(j.ID) != "" {
		t.Fatal("blocked reason kept after dispatch")
	}
	if c := h.agents.sent()[0].Credentials; c["TOKEN"] != "v-123456" {
		t.Fatal("the re-read profile was not sent")
	}
}

func TestPerRoundCapAndAgentCapacity(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.PerRound = 2 })
	h.agent("a1", "e1", 3)
	var ids []string
	for _, name := range []string{"j1", "j2", "j3", "j4", "j5"} {
		ids = append(ids, h.admit("wh/"+name).ID)
	}
	h.round()
	if n := len(h.agents.sent()); n != 2 {
		t.Fatalf("first round sent %d, want 2", n)
	}
	for i, s := range h.agents.sent() {
		if s.Job.ID != ids[i] {
			t.Fatalf("send %d was %s, want %s (id order)", i, s.Job.ID, ids[i])
		}
	}
	h.round()
	h.round()
	if n := len(h.agents.sent()); n != 3 {
		t.Fatalf("sent %d with capacity 3", n)
	}
	if reason := h.d.BlockedReason(ids[3]); reason == "" {
		t.Fatal("a job waiting for a slot shows no blocked reason")
	}
}

func TestPausedDispatchSendsNothing(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	if err := h.st.SetDispatchPaused(h.ctx, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "paused in the read model", func() bool { return h.st.Settings().DispatchPaused })
	j := h.admit("wh/p")
	h.round()
	if h.get(j.ID).State != jobs.Pending || len(h.agents.sent()) != 0 {
		t.Fatal("dispatched while paused")
	}
	if err := h.st.SetDispatchPaused(h.ctx, false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "unpaused in the read model", func() bool { return !h.st.Settings().DispatchPaused })
	h.round()
	if h.get(j.ID).State != jobs.Running {
		t.Fatal("not dispatched after unpausing")
	}
}

// A leader that dies between markRunning and the send leaves a RUNNING job
// nobody received; the next leader settles it through the tombstone and the
// job is never sent at all.
func TestCrashAfterMarkRunningIsSettledByTheNextLeader(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	h.d.afterMarkRunning = func(string) bool { return true }
	j := h.admit("wh/crash")
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running || len(h.agents.sent()) != 0 {
		t.Fatalf("state %s, sends %d", got.State, len(h.agents.sent()))
	}

	h.d = h.newDispatcher()
	h.tm = h.newTerm()
	h.round()
	got := h.get(j.ID)
	if got.State != jobs.NotCommitted || got.Result.Code != jobs.CodeTombstoned || got.Slot.Proof != jobs.ProofNotEnqueued {
		t.Fatalf("state %s result %+v slot %+v", got.State, got.Result, got.Slot)
	}
	if n := len(h.agents.sent()); n != 0 {
		t.Fatalf("the job was sent %d times", n)
	}
}

// cancelDuringMarkRunning ends the term while markRunning is on its way.
type cancelDuringMarkRunning struct {
	DispatchStore
	endTerm func()
}

func (c cancelDuringMarkRunning) MarkRunning(ctx context.Context, l store.Leadership, id string, rev int64, in store.MarkRunningInput) (*jobs.Job, error) {
	c.endTerm()
	return c.DispatchStore.MarkRunning(ctx, l, id, rev, in)
}

// A term that ends while markRunning commits, or between the commit and the
// send (a graceful stop, a lost session), still sends the dispatch it
// committed, once: abandoning it would turn a job that could run into a
// tombstoned NOT_COMMITTED.
func TestTermEndingAfterMarkRunningStillSends(t *testing.T) {
	for _, when := range []string{"during", "after"} {
		t.Run(when, func(t *testing.T) { termEndingAroundMarkRunning(t, when) })
	}
}

func termEndingAroundMarkRunning(t *testing.T, when string) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	termCtx, endTerm := context.WithCancel(h.ctx)
	if when == "during" {
		d, err := NewDispatcher(DispatcherOptions{
			Config: h.cfg, Store: cancelDuringMarkRunning{DispatchStore: h.st, endTerm: endTerm}, Agents: h.agents, Now: h.clock.Now,
			Logger: slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		})
		if err != nil {
			t.Fatal(err)
		}
		h.d = d
	} else {
		h.d.afterMarkRunning = func(string) bool { endTerm(); return false }
	}
	j := h.admit("wh/stopping")
	_ = h.d.round(termCtx, h.tm) // whatever the round says after its term ended
	sent := h.agents.sent()
	got := h.get(j.ID)
	if len(sent) != 1 || got.State != jobs.Running || sent[0].Job.Dispatch == nil ||
		sent[0].Job.Dispatch.InvocationID != got.Dispatch.InvocationID {
		t.Fatalf("sends %d, state %s", len(sent), got.State)
	}

	// The next leader finds the invocation arrived and leaves it running.
	h.agents.mu.Lock()
	h.agents.onTombstone = func(string, string) (string, error) { return InvocationRunning, nil }
	h.agents.mu.Unlock()
	h.d = h.newDispatcher()
	h.tm = h.newTerm()
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running || len(h.agents.sent()) != 1 {
		t.Fatalf("after the next leader's round: state %s, sends %d", got.State, len(h.agents.sent()))
	}
}

// A new leader asks about inherited RUNNING jobs but leaves live ones alone:
// a leader change alone never makes a job UNKNOWN or NOT_COMMITTED.
func TestNewLeaderKeepsLiveInvocationsRunning(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 1)
	j := h.admit("wh/inherit")
	h.round()
	h.agents.set(nil, func(string, string) (string, error) { return InvocationQueued, nil })
	h.d = h.newDispatcher()
	h.tm = h.newTerm()
	h.round()
	if got := h.get(j.ID); got.State != jobs.Running {
		t.Fatalf("state %s after a leader change", got.State)
	}
	if n := len(h.agents.asked()); n != 1 {
		t.Fatalf("tombstone queries %d, want 1", n)
	}
}

type hook struct {
	mu     sync.Mutex
	status int
	calls  []jobs.Job
	srv    *http.Server
	url    string
}

func newHook(t *testing.T, status int) *hook {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hk := &hook{status: status, url: "http://" + ln.Addr().String() + "/hooks/changed"}
	hk.srv = &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var j jobs.Job
		_ = json.NewDecoder(r.Body).Decode(&j)
		hk.mu.Lock()
		hk.calls = append(hk.calls, j)
		st := hk.status
		hk.mu.Unlock()
		w.WriteHeader(st)
	})}
	go func() { _ = hk.srv.Serve(ln) }()
	t.Cleanup(func() { _ = hk.srv.Close() })
	return hk
}

func (hk *hook) setStatus(s int) {
	hk.mu.Lock()
	defer hk.mu.Unlock()
	hk.status = s
}

func (hk *hook) count() int {
	hk.mu.Lock()
	defer hk.mu.Unlock()
	return len(hk.calls)
}

func TestRefreshDriver(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 2)
	hk := newHook(t, http.StatusInternalServerError)
	j := h.admit("wh/r", withRefresh(hk.url))
	h.round()
	running := h.get(j.ID)
	if _, _, err := h.report(running, h.agents.sent()[0].Secret, jobs.CodeExitCommitted, jobs.PhaseNativeReturn,
		intp(0), jobs.ProofChildReaped); err != nil {
		t.Fatal(err)
	}
	if got := h.get(j.ID); got.RefreshState != jobs.RefreshRequired || got.Resolved {
		t.Fatalf("refresh %s resolved %v", got.RefreshState, got.Resolved)
	}

	h.round()
	waitFor(t, "refresh FAILED", func() bool { return h.get(j.ID).RefreshState == jobs.RefreshFailed })
	if hk.count() != 1 || len(h.st.Fences()) != 1 {
		t.Fatalf("hook calls %d fences %d", hk.count(), len(h.st.Fences()))
	}
	if sent := hk.calls[0]; sent.ID != j.ID || sent.Dispatch == nil || sent.Dispatch.SecretHash != "" {
		t.Fatalf("hook got job %s with dispatch %+v", sent.ID, sent.Dispatch)
	}

	// Within the retry interval a FAILED refresh is left alone, and nothing is written.
	before := h.rev()
	h.round()
	h.tm.wg.Wait()
	if hk.count() != 1 || h.rev() != before {
		t.Fatalf("retried within the interval: calls %d", hk.count())
	}

	hk.setStatus(http.StatusNoContent)
	h.clock.Advance(h.cfg.RefreshRetry)
	h.round()
	waitFor(t, "refresh DONE", func() bool { return h.get(j.ID).RefreshState == jobs.RefreshDone })
	got := h.get(j.ID)
	if !got.Resolved || len(h.st.Fences()) != 0 || hk.count() != 2 {
		t.Fatalf("after DONE: resolved %v fences %d calls %d", got.Resolved, len(h.st.Fences()), hk.count())
	}
}

func TestNewLeaderDowngradesARefreshLeftRunning(t *testing.T) {
	h := newHarness(t, nil)
	h.agent("a1", "e1", 2)
	hk := newHook(t, http.StatusOK)
	j := h.admit("wh/r2", withRefresh(hk.url))
	h.round()
	if _, _, err := h.report(h.get(j.ID), h.agents.sent()[0].Secret, jobs.CodeExitCommitted, jobs.PhaseNativeReturn,
		intp(0), jobs.ProofChildReaped); err != nil {
		t.Fatal(err)
	}
	// The old leader started the refresh and died before it finished.
	if _, err := h.st.MarkRefreshRunning(h.ctx, h.l, j.ID, h.get(j.ID).Revision); err != nil {
		t.Fatal(err)
	}
	h.d = h.newDispatcher()
	h.tm = h.newTerm()
	if got := h.get(j.ID); got.RefreshState != jobs.RefreshRequired {
		t.Fatalf("refresh %s after take-over, want REQUIRED", got.RefreshState)
	}
	h.round()
	waitFor(t, "refresh DONE", func() bool { return h.get(j.ID).RefreshState == jobs.RefreshDone })
}

func TestRetentionRemovesOnlyOldResolvedJobs(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.Retention = time.Hour; c.RetentionBatch = 1 })
	h.agent("a1", "e1", 4)
	oldDone := h.admit("wh/old1")
	oldDone2 := h.admit("wh/old2")
	stuck := h.admit("wh/stuck")
	h.agents.set(func(d AgentDispatch) error {
		if d.Job.ID == stuck.ID {
			return nil
		}
		return &RefusalError{Type: "queue-full"}
	}, nil)
	h.round()
	if !h.get(oldDone.ID).Resolved || !h.get(oldDone2.ID).Resolved || h.get(stuck.ID).State != jobs.Running {
		t.Fatal("setup did not resolve the refused jobs")
	}
	h.clock.Advance(2 * time.Hour)
	h.round() // stuck -> UNKNOWN (unresolved); the two resolved jobs are past retention
	h.tm.lastRetain = time.Time{}
	h.round()
	for _, id := range []string{oldDone.ID, oldDone2.ID} {
		if _, err := h.st.Get(h.ctx, id); !errors.Is(err, jobs.ErrNotFound) {
			t.Fatalf("resolved job %s not removed: %v", id, err)
		}
	}
	if got := h.get(stuck.ID); got.State != jobs.Unknown {
		t.Fatalf("unresolved job: %s", got.State)
	}
}

func TestRunStopsWhenLeadershipIsGone(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.Interval = 20 * time.Millisecond })
	h.agent("a1", "e1", 1)
	resign(t, h.ctx, h.cli, h.l)
	h.admit("wh/lost")
	err := h.d.Run(h.ctx, h.l)
	if !errors.Is(err, jobs.ErrNotLeader) {
		t.Fatalf("Run = %v, want ErrNotLeader", err)
	}
	if n := len(h.agents.sent()); n != 0 {
		t.Fatalf("a deposed leader sent %d dispatches", n)
	}
}

func TestRunEndsWithItsContext(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.Interval = 10 * time.Millisecond })
	h.agent("a1", "e1", 1)
	j := h.admit("wh/run")
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() { done <- h.d.Run(ctx, h.l) }()
	waitFor(t, "dispatch by Run", func() bool { return h.get(j.ID).State == jobs.Running })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v after cancel", err)
	}
}

func TestCredentialFileProblemsNeverQuoteValues(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.json")
	const value = "hunter2-hunter2"
	logs := &syncBuffer{}
	c := newCredentialProfiles(path, slog.New(slog.NewJSONHandler(logs, nil)))
	c.refresh()
	if _, err := c.resolve("p"); err == nil {
		t.Fatal("a missing file resolved a profile")
	}
	for _, bad := range []string{`{"p": {"BAD NAME": "` + value + `"}}`, `{"p": {"A": "` + value + `"}} trailing`, `{"p": ` + value} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		// A new mtime/size is what triggers the re-read.
		c.refresh()
		_, err := c.resolve("p")
		if err == nil {
			t.Fatalf("bad file %q resolved", bad)
		}
		if strings.Contains(err.Error(), value) {
			t.Fatalf("error quotes the value: %v", err)
		}
	}
	if strings.Contains(logs.String(), value) {
		t.Fatal("logs quote a credential value")
	}
	writeCredentials(t, path, map[string]map[string]string{"p": {"A": value}})
	c.refresh()
	vars, err := c.resolve("p")
	if err != nil || vars["A"] != value {
		t.Fatalf("good file: %v", err)
	}
	if _, err := c.resolve("q"); err == nil || !strings.Contains(err.Error(), `"q"`) {
		t.Fatalf("missing profile: %v", err)
	}
}

// A term that ends while a refresh hook call is in flight waits for it and
// leaves no goroutine behind; the refresh stays RUNNING for the next
// leader to downgrade.
func TestRunLeavesNoGoroutines(t *testing.T) {
	h := newHarness(t, func(c *DispatchConfig) { c.Interval = 10 * time.Millisecond })
	h.agent("a1", "e1", 1)
	block := make(chan struct{})
	called := make(chan struct{}, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		called <- struct{}{}
		select {
		case <-block:
		case <-r.Context().Done():
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { close(block); _ = srv.Close() })
	j := h.admit("wh/leak", withRefresh("http://"+ln.Addr().String()+"/hook"))
	h.round()
	if _, _, err := h.report(h.get(j.ID), h.agents.sent()[0].Secret, jobs.CodeExitCommitted, jobs.PhaseNativeReturn,
		intp(0), jobs.ProofChildReaped); err != nil {
		t.Fatal(err)
	}

	ignore := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan error, 1)
	go func() { done <- h.d.Run(ctx, h.l) }()
	<-called
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
	// The hook's own server side may still be noticing the dropped call;
	// only the dispatcher's goroutines are under test.
	goleak.VerifyNone(t, ignore, goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreTopFunction("jobfence/server.TestRunLeavesNoGoroutines.func2"))
	if got := h.get(j.ID); got.RefreshState != jobs.RefreshRunning {
		t.Fatalf("refresh %s, want RUNNING left for the next leader", got.RefreshState)
	}
}

// recordingStore adds the read-model seam that shows blocked reasons on
// the job, recording what the dispatcher sets.
type recordingStore struct {
	*store.Store
	mu      sync.Mutex
	reasons map[string]string
}

func (r *recordingStore) SetBlockedReason(id, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reasons[id] = reason
}

func (r *recordingStore) reason(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reasons[id]
}

func TestBlockedReasonReachesTheReadModelSeam(t *testing.T) {
	h := newHarness(t, nil)
	rs := &recordingStore{Store: h.st, reasons: map[string]string{}}
	d, err := NewDispatcher(DispatcherOptions{Config: h.cfg, Store: rs, Agents: h.agents, Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	h.tm = h.newTerm()
	j := h.admit("wh/seam", withCredentials("absent"))
	h.round()
	if r := rs.reason(j.ID); !strings.Contains(r, "credentials") {
		t.Fatalf("reason %q", r)
	}
	// The term's end clears what a follower could not keep up to date.
	ctx, cancel := context.WithCancel(h.ctx)
	cancel()
	if err := d.Run(ctx, h.l); err != nil {
		t.Fatal(err)
	}
	if r := rs.reason(j.ID); r != "" {
		t.Fatalf("reason %q kept after the term", r)
	}
}

type phaseLog struct {
	mu    sync.Mutex
	names []string
}

func (p *phaseLog) ObservePhase(phase string, _ time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.names = append(p.names, phase)
}

func TestRoundRunsItsPhasesInOrder(t *testing.T) {
	h := newHarness(t, nil)
	pl := &phaseLog{}
	d, err := NewDispatcher(DispatcherOptions{Config: h.cfg, Store: h.st, Agents: h.agents, Now: h.clock.Now, Phases: pl})
	if err != nil {
		t.Fatal(err)
	}
	h.d = d
	h.tm = h.newTerm()
	h.round()
	want := "deadline epoch refresh settle dispatch retention"
	if got := strings.Join(pl.names, " "); got != want {
		t.Fatalf("phases %q, want %q", got, want)
	}
}
