package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"jobfence/jobs"
)

func checkEnvelope(t *testing.T, req DispatchRequest, rep report, code jobs.ResultCode, phase jobs.Phase, proof jobs.Proof) {
	t.Helper()
	e := rep.Env
	if e.Code != code || e.Phase != phase || e.Proof != proof {
		t.Fatalf("want %s/%s/%s, got %s/%s/%s (%s)", code, phase, proof, e.Code, e.Phase, e.Proof, e.Detail)
	}
	if e.InvocationID != req.InvocationID || e.DispatchRevision != req.DispatchRevision || e.AgentEpoch != req.AgentEpoch || e.Secret != req.Secret {
		t.Fatalf("envelope does not echo the dispatch identity: %+v", e)
	}
}

func TestOutcomesRegistrationAndMetrics(t *testing.T) {
	ta := startAgent(t, nil)
	reg := ta.fs.firstRegistration(t)
	if reg.Epoch != ta.Epoch() || reg.Address != ta.addr || reg.Capacity != 2 || !reg.Isolation.Verified || reg.Isolation.Mode == "" {
		t.Fatalf("registration %+v", reg)
	}
	cases := []struct {
		code  string
		want  jobs.ResultCode
		phase jobs.Phase
	}{
		{"0", jobs.CodeExitCommitted, jobs.PhaseNativeReturn},
		{"3", jobs.CodeExitNotCommitted, jobs.PhaseNativeReturn},
		{"7", jobs.CodeExitUnclassified, jobs.PhaseNativeReturn},
	}
	for _, c := range cases {
		req := ta.dispatch(exe(t), "helper", "exit", c.code)
		ta.send(t, req)
		rep := ta.fs.reportFor(t, req.JobID)
		checkEnvelope(t, req, rep, c.want, c.phase, jobs.ProofChildReaped)
		if rep.Env.ExitCode == nil || *rep.Env.ExitCode != map[string]int{"0": 0, "3": 3, "7": 7}[c.code] {
			t.Fatalf("exit code %v", rep.Env.ExitCode)
		}
		ta.fs.waitFor(t, "reported status", func() bool { return ta.status(t, req.InvocationID) == StatusReported })
	}
	if st := ta.status(t, uuid.NewString()); st != StatusUnknown {
		t.Fatalf("status of a never-seen invocation: %s", st)
	}
	resp, err := ta.http.Get(ta.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		"jobfence_agent_queue_depth 0", "jobfence_agent_inflight_workers 0",
		`jobfence_agent_outcomes_total{code="EXIT_COMMITTED"} 1`, `jobfence_agent_outcomes_total{code="EXIT_NOT_COMMITTED"} 1`,
		"jobfence_agent_report_failures_total 0", "jobfence_agent_isolation_verified 1", "go_goroutines", "process_open_fds",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// Must show 1: OOM → INDETERMINATE_AFTER_LAUNCH, an UNKNOWN code, CHILD_REAPED;
// the agent lives on and runs the next job.
func TestOOMKilledAgentLivesOn(t *testing.T) {
	ta := startAgent(t, nil)
	req := ta.dispatch(exe(t), "helper", "alloc", "512")
	req.Spec.Limits.MemoryBytes = 16 << 20
	ta.send(t, req)
	checkEnvelope(t, req, ta.fs.reportFor(t, req.JobID), jobs.CodeKilledOOM, jobs.PhaseIndeterminateAfterLaunch, jobs.ProofChildReaped)
	next := ta.dispatch(exe(t), "helper", "exit", "0")
	ta.send(t, next)
	checkEnvelope(t, next, ta.fs.reportFor(t, next.JobID), jobs.CodeExitCommitted, jobs.PhaseNativeReturn, jobs.ProofChildReaped)
}

// Must show 3: a daemonized grandchild is killed, and the committed report
// arrives only after the domain is empty.
func TestDaemonKilledBeforeCommittedReport(t *testing.T) {
	ta := startAgent(t, nil)
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "gc.pid")
	req := ta.dispatch(exe(t), "helper", "daemon", pidfile)
	root := ta.cfg.CgroupRoot
	ta.fs.onResult = func(string) any {
		b, _ := os.ReadFile(pidfile)
		var pid int
		for _, c := range strings.TrimSpace(string(b)) {
			pid = pid*10 + int(c-'0')
		}
		_, domErr := os.Stat(filepath.Join(root, "d."+req.AgentEpoch+"."+req.InvocationID))
		return [2]bool{pid > 0 && alive(pid), domErr == nil}
	}
	ta.send(t, req)
	rep := ta.fs.reportFor(t, req.JobID)
	checkEnvelope(t, req, rep, jobs.CodeExitCommitted, jobs.PhaseNativeReturn, jobs.ProofChildReaped)
	if seen := rep.Probe.([2]bool); seen[0] || seen[1] {
		t.Fatalf("at report time: grandchild alive %v, domain present %v", seen[0], seen[1])
	}
	if !strings.Contains(rep.Env.Detail, "leftover") {
		t.Fatalf("detail does not mention the killed leftovers: %q", rep.Env.Detail)
	}
}

// Must show 4: TERM, the grace, the kill; the UNKNOWN report with
// CHILD_REAPED reaches the server before the deadline it holds.
func TestDeadlineLadderReportsBeforeDeadline(t *testing.T) {
	ta := startAgent(t, nil)
	pidfile := filepath.Join(t.TempDir(), "w.pid")
	req := ta.dispatch(exe(t), "helper", "log-term", pidfile)
	// The ladder starts at deadline − 3.3s (skew + grace + reap bound); the
	// run window before it leaves the helper time to install its handler.
	req.Deadline = time.Now().Add(6300 * time.Millisecond)
	termAt := req.Deadline.Add(-ta.cfg.reservation())
	ta.send(t, req)
	waitPidFile(t, pidfile)
	if time.Now().After(termAt) {
		t.Fatal("the helper was not ready before the ladder started; the machine is too slow for this window")
	}
	rep := ta.fs.reportFor(t, req.JobID)
	checkEnvelope(t, req, rep, jobs.CodeKilledDeadline, jobs.PhaseIndeterminateAfterLaunch, jobs.ProofChildReaped)
	if rep.Env.Signal != "SIGKILL" {
		t.Fatalf("signal %q, want SIGKILL after the ignored TERM", rep.Env.Signal)
	}
	if !rep.At.Before(req.Deadline) {
		t.Fatalf("report arrived at %s, after the deadline %s", rep.At, req.Deadline)
	}
	b, _ := os.ReadFile(pidfile + ".term")
	if !strings.Contains(string(b), "term") {
		t.Fatal("the worker never got SIGTERM before the kill")
	}
}

// Must show 6: an unverifiable root refuses every dispatch; nothing runs.
func TestUnverifiedIsolationRefusesEverything(t *testing.T) {
	root := t.TempDir()
	ta := startAgent(t, func(c *Config) { c.CgroupRoot = root })
	reg := ta.fs.firstRegistration(t)
	if reg.Isolation.Verified || !strings.Contains(reg.Isolation.Detail, "not on cgroup2") {
		t.Fatalf("registration isolation %+v", reg.Isolation)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	for i := 0; i < 3; i++ {
		req := ta.dispatch(exe(t), "helper", "count", marker)
		slug, err := ta.client.Dispatch(context.Background(), ta.addr, req)
		if err != nil || slug != RefusalIsolationUnverified {
			t.Fatalf("want isolation-unverified, got %q %v", slug, err)
		}
		if st := ta.status(t, req.InvocationID); st != StatusUnknown {
			t.Fatalf("a refused invocation has status %s", st)
		}
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused dispatch executed")
	}
	if es, _ := os.ReadDir(root); len(es) != 0 {
		t.Fatalf("the unverified root was written: %v", es)
	}
}

// Must show 7: a missing binary is not committed: PRE_INVOCATION_REJECTED,
// NEVER_LAUNCHED.
func TestMissingBinaryNeverLaunched(t *testing.T) {
	ta := startAgent(t, nil)
	req := ta.dispatch("/nonexistent/jobfence-no-such-binary")
	ta.send(t, req)
	rep := ta.fs.reportFor(t, req.JobID)
	checkEnvelope(t, req, rep, jobs.CodePreInvocationRejected, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched)
	if rep.Env.ExitCode != nil {
		t.Fatalf("a never-launched command has an exit code: %v", *rep.Env.ExitCode)
	}
}

// Must show 8: a repeated invocation id answers 202 and runs once; a
// tombstone first makes the dispatch a refusal.
func TestRepeatedInvocationRunsOnceAndTombstones(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.Capacity = 1; c.QueueSize = 4 })
	dir := t.TempDir()
	count := filepath.Join(dir, "count")
	req := ta.dispatch(exe(t), "helper", "count", count)
	ta.send(t, req)
	ta.send(t, req) // while queued or running
	ta.fs.reportFor(t, req.JobID)
	ta.fs.waitFor(t, "reported", func() bool { return ta.status(t, req.InvocationID) == StatusReported })
	ta.send(t, req) // after the report
	// Even when its deadline can no longer be funded, a repeat is not refused:
	// a refusal would claim it never ran.
	stale := req
	stale.Deadline = time.Now().Add(time.Second)
	ta.send(t, stale)
	// One executor, FIFO queue: once a later job is reported, any duplicate
	// enqueued before it would have run already.
	flush := ta.dispatch(exe(t), "helper", "exit", "0")
	ta.send(t, flush)
	ta.fs.reportFor(t, flush.JobID)
	b, _ := os.ReadFile(count)
	if got := strings.Count(string(b), "run\n"); got != 1 {
		t.Fatalf("the invocation ran %d times", got)
	}
	if n := ta.fs.reportCount(req.JobID); n != 1 {
		t.Fatalf("%d reports for one invocation", n)
	}

	ctx := context.Background()
	tomb := ta.dispatch(exe(t), "helper", "count", count)
	st, err := ta.client.Tombstone(ctx, ta.addr, tomb.InvocationID, ta.Epoch())
	if err != nil || st != StatusTombstoned {
		t.Fatalf("tombstone: %q %v", st, err)
	}
	slug, err := ta.client.Dispatch(ctx, ta.addr, tomb)
	if err != nil || slug != RefusalTombstoned {
		t.Fatalf("dispatch after tombstone: %q %v", slug, err)
	}
	if st, err := ta.client.Tombstone(ctx, ta.addr, req.InvocationID, ta.Epoch()); err != nil || st != StatusReported {
		t.Fatalf("tombstone of a received invocation: %q %v", st, err)
	}
	if _, err := ta.client.Tombstone(ctx, ta.addr, uuid.NewString(), "another-epoch"); !errors.Is(err, ErrEpochMismatch) {
		t.Fatalf("tombstone with a foreign epoch: %v", err)
	}
	b, _ = os.ReadFile(count)
	if got := strings.Count(string(b), "run\n"); got != 1 {
		t.Fatalf("a tombstoned invocation ran (%d runs)", got)
	}
}

// Must show 9 and the other typed refusals, each leaving nothing behind.
func TestTypedRefusals(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.Capacity = 1; c.QueueSize = 1 })
	ctx := context.Background()
	expect := func(req DispatchRequest, want string) {
		t.Helper()
		slug, err := ta.client.Dispatch(ctx, ta.addr, req)
		if err != nil || slug != want {
			t.Fatalf("want refusal %q, got %q %v", want, slug, err)
		}
		if st := ta.status(t, req.InvocationID); st != StatusUnknown {
			t.Fatalf("refused invocation has status %s", st)
		}
	}
	unfundable := ta.dispatch(exe(t), "helper", "exit", "0")
	unfundable.Deadline = time.Now().Add(time.Second)
	expect(unfundable, RefusalDeadlineUnfundable)

	wrongEpoch := ta.dispatch(exe(t), "helper", "exit", "0")
	wrongEpoch.AgentEpoch = "0123456789abcdef"
	expect(wrongEpoch, RefusalEpochMismatch)

	tooMany := ta.dispatch(exe(t))
	for len(tooMany.Spec.Command) <= maxArgs {
		tooMany.Spec.Command = append(tooMany.Spec.Command, "x")
	}
	expect(tooMany, RefusalPayloadTooLarge)

	huge := ta.dispatch(exe(t), "helper", "exit", "0")
	huge.Spec.Env = map[string]string{"BIG": strings.Repeat("x", maxBody)}
	expect(huge, RefusalPayloadTooLarge)

	// Queue full: one running, one queued, the third refused.
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	running := ta.dispatch(exe(t), "helper", "hold", filepath.Join(dir, "a.pid"), release)
	ta.send(t, running)
	waitPidFile(t, filepath.Join(dir, "a.pid"))
	queued := ta.dispatch(exe(t), "helper", "hold", filepath.Join(dir, "b.pid"), release)
	ta.send(t, queued)
	if st := ta.status(t, queued.InvocationID); st != StatusQueued {
		t.Fatalf("second dispatch is %s, want queued", st)
	}
	expect(ta.dispatch(exe(t), "helper", "exit", "0"), RefusalQueueFull)
	os.WriteFile(release, nil, 0o600)
	ta.fs.reportFor(t, running.JobID)
	ta.fs.reportFor(t, queued.JobID)

	// Not refusals: the server must treat these as unknown outcomes.
	bad := &Client{HTTP: ta.client.HTTP, Token: "wrong"}
	if slug, err := bad.Dispatch(ctx, ta.addr, ta.dispatch(exe(t))); err == nil || slug != "" {
		t.Fatalf("unauthenticated dispatch: %q %v", slug, err)
	}
	resp, err := ta.http.Post(ta.addr+"/v1/dispatches", "application/json", bytes.NewReader([]byte(`{"job_id":1}`)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("no token: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r, _ := http.NewRequest("POST", ta.addr+"/v1/dispatches", strings.NewReader(`{"job_id":"x","bogus":1}`))
	r.Header.Set("Authorization", "Bearer "+dispatchToken)
	r.Header.Set("Content-Type", "application/json")
	resp, err = ta.http.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	var p Problem
	json.NewDecoder(resp.Body).Decode(&p)
	resp.Body.Close()
	if resp.StatusCode != 400 || p.Type != ProblemTypeBase+"malformed" || p.RequestID == "" {
		t.Fatalf("unknown field: %d %+v", resp.StatusCode, p)
	}
}

// Must show 10: a credential value is in the command's environment and
// nowhere else: not in the worker's argv, the agent's logs or the report.
func TestCredentialsNeverLeak(t *testing.T) {
	ta := startAgent(t, nil)
	secretValue := "cr3d-" + uuid.NewString()
	dir := t.TempDir()
	pidfile, release := filepath.Join(dir, "w.pid"), filepath.Join(dir, "release")
	req := ta.dispatch(exe(t), "helper", "hold", pidfile, release)
	req.Credentials = map[string]string{"DB_PASSWORD": secretValue}
	req.Spec.Env = map[string]string{"TABLE": "orders"}
	ta.send(t, req)
	pid := waitPidFile(t, pidfile)
	environ, err := os.ReadFile("/proc/" + itoa(pid) + "/environ")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(environ, []byte("DB_PASSWORD="+secretValue)) || !bytes.Contains(environ, []byte("TABLE=orders")) {
		t.Fatal("the command did not receive its credential as DB_PASSWORD")
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(secretValue)) {
			t.Fatalf("credential value in %s", p)
		}
	}
	os.WriteFile(release, nil, 0o600)
	rep := ta.fs.reportFor(t, req.JobID)
	checkEnvelope(t, req, rep, jobs.CodeExitCommitted, jobs.PhaseNativeReturn, jobs.ProofChildReaped)
	if bytes.Contains(rep.Raw, []byte(secretValue)) {
		t.Fatal("credential value in the report")
	}
	logs := ta.logs.String()
	if !strings.Contains(logs, req.InvocationID) {
		t.Fatal("the agent logged nothing about the invocation; the check would prove nothing")
	}
	if strings.Contains(logs, secretValue) || strings.Contains(logs, req.Secret) {
		t.Fatal("credential value or dispatch secret in the agent's logs")
	}
	if s := req.String(); strings.Contains(s, secretValue) || strings.Contains(s, req.Secret) {
		t.Fatal("DispatchRequest.String leaks secrets")
	}
}

// Reports are retried with backoff until the server acknowledges them, and
// every failed attempt is counted.
func TestReportRetriedUntilAcknowledged(t *testing.T) {
	ta := startAgent(t, nil)
	ta.fs.mu.Lock()
	ta.fs.failFirst = 3
	ta.fs.mu.Unlock()
	req := ta.dispatch(exe(t), "helper", "exit", "0")
	ta.send(t, req)
	if st := ta.status(t, req.InvocationID); st == StatusUnknown || st == StatusTombstoned {
		t.Fatalf("accepted invocation has status %s", st)
	}
	rep := ta.fs.reportFor(t, req.JobID)
	checkEnvelope(t, req, rep, jobs.CodeExitCommitted, jobs.PhaseNativeReturn, jobs.ProofChildReaped)
	ta.fs.waitFor(t, "reported", func() bool { return ta.status(t, req.InvocationID) == StatusReported })
	resp, err := ta.http.Get(ta.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "jobfence_agent_report_failures_total 3") {
		t.Fatalf("report failures not counted:\n%s", body)
	}
}

// The budget is checked again at dequeue: a dispatch whose budget was spent
// waiting in the queue never starts and says so (NEVER_LAUNCHED).
func TestBudgetSpentInQueueNeverLaunched(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.Capacity = 1; c.QueueSize = 2 })
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	blocker := ta.dispatch(exe(t), "helper", "hold", filepath.Join(dir, "a.pid"), release)
	ta.send(t, blocker)
	waitPidFile(t, filepath.Join(dir, "a.pid"))
	marker := filepath.Join(dir, "ran")
	late := ta.dispatch(exe(t), "helper", "count", marker)
	need := ta.cfg.reservation() + ta.cfg.MinRunWindow
	late.Deadline = time.Now().Add(need + 500*time.Millisecond)
	ta.send(t, late)
	// Hold the only executor until the queued dispatch can no longer fund its run.
	for time.Until(late.Deadline) >= need {
		ta.fs.waitFor(t, "the budget to run out", func() bool { return time.Until(late.Deadline) < need })
	}
	os.WriteFile(release, nil, 0o600)
	rep := ta.fs.reportFor(t, late.JobID)
	checkEnvelope(t, late, rep, jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched)
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a dispatch whose budget was spent ran anyway")
	}
}

// FuzzCheckBounds feeds arbitrary dispatch bodies through the decoder and
// the bounds check: neither may panic, and an accepted body is within bounds.
func FuzzCheckBounds(f *testing.F) {
	f.Add([]byte(`{"job_id":"j","invocation_id":"i","secret":"s","agent_epoch":"e","deadline":"2030-01-01T00:00:00Z","spec":{"command":["/bin/true"],"limits":{},"outcome":{"committed_exit_codes":[0],"not_committed_exit_codes":[]}}}`))
	f.Add([]byte(`{"spec":{"command":["rel"]},"credentials":{"1BAD":"x"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		var req DispatchRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if dec.Decode(&req) != nil {
			return
		}
		if checkBounds(&req) == "" {
			if len(req.Spec.Command) == 0 || !filepath.IsAbs(req.Spec.Command[0]) || !idRE.MatchString(req.InvocationID) {
				t.Fatalf("accepted out-of-bounds request %s", req)
			}
		}
	})
}

// On shutdown a running domain is taken down by its ladder and reported with
// its proof, and a queued dispatch is reported as never launched.
func TestShutdownReportsRunningAndQueued(t *testing.T) {
	ta := startAgent(t, func(c *Config) { c.Capacity = 1; c.QueueSize = 2 })
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	running := ta.dispatch(exe(t), "helper", "hold", filepath.Join(dir, "a.pid"), release)
	ta.send(t, running)
	pid := waitPidFile(t, filepath.Join(dir, "a.pid"))
	queued := ta.dispatch(exe(t), "helper", "count", filepath.Join(dir, "ran"))
	ta.send(t, queued)
	ta.stop()
	checkEnvelope(t, running, ta.fs.reportFor(t, running.JobID), jobs.CodeKilledSignal, jobs.PhaseIndeterminateAfterLaunch, jobs.ProofChildReaped)
	checkEnvelope(t, queued, ta.fs.reportFor(t, queued.JobID), jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched)
	if alive(pid) {
		t.Fatalf("worker %d outlived the agent's shutdown", pid)
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the queued dispatch ran during shutdown")
	}
}
