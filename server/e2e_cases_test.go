package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/agent"
	"jobfence/handlers"
	"jobfence/internal/etcdtest"
	"jobfence/jobs"
)

var (
	viewer    = e2eTokens[handlers.RoleViewer]
	submitter = e2eTokens[handlers.RoleSubmitter]
	operator  = e2eTokens[handlers.RoleOperator]
	agentTok  = e2eTokens[handlers.RoleAgent]
)

// TestEndToEnd runs issue 4's must-shows against real processes. The
// subtests share one build of the binary and run one after another.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end tests start processes")
	}
	if os.Geteuid() != 0 {
		t.Skip("the agent needs root to create cgroups")
	}
	bin := e2eBuild(t)

	// Must-show 1: a command that prints ok commits, its slot is released
	// with CHILD_REAPED, the job resolves and its fence is gone.
	t.Run("1_committed", func(t *testing.T) {
		e := newE2E(t, bin)
		srv := e.server("s1")
		e.agent("a1", srv, 2)
		start := time.Now()
		id := e.submit(shJob("warehouse.orders/idx_customer", "echo ok", 20, nil))
		j := e.waitJob(id, "a terminal state", 30*time.Second, func(j *jobs.Job) bool { return j.State.Terminal() })
		elapsed := time.Since(start)
		if j.State != jobs.Committed || j.Result.Code != jobs.CodeExitCommitted || j.Result.ExitCode == nil || *j.Result.ExitCode != 0 {
			t.Fatalf("state %s result %+v", j.State, j.Result)
		}
		if j.Slot.Held || j.Slot.Proof != jobs.ProofChildReaped || !j.Resolved {
			t.Fatalf("slot %+v resolved %v", j.Slot, j.Resolved)
		}
		if n := e.fences(); n != 0 {
			t.Fatalf("%d fences held after COMMITTED", n)
		}
		fmt.Printf("e2e: admission to terminal (COMMITTED) took %s\n", elapsed.Round(time.Millisecond))
	})

	// Must-show 3: a typed refusal proves the command never ran.
	for _, slug := range []string{agent.RefusalQueueFull, agent.RefusalIsolationUnverified} {
		t.Run("3_refused_"+slug, func(t *testing.T) {
			e := newE2E(t, bin)
			e.server("s1")
			ag := e.standIn("refuser", 1, func(agent.DispatchRequest) (int, string) {
				return agent.RefusalStatus[slug], slug
			})
			id := e.submit(shJob("wh/refused", "exit 0", 20, nil))
			j := e.waitJob(id, "refusal classified", 20*time.Second, func(j *jobs.Job) bool { return j.State.Terminal() })
			if j.State != jobs.NotCommitted || j.Result.Code != jobs.CodeRefusedByAgent || j.Result.Detail != slug {
				t.Fatalf("state %s result %+v", j.State, j.Result)
			}
			if j.Slot.Held || j.Slot.Proof != jobs.ProofNotEnqueued || !j.Resolved || e.fences() != 0 {
				t.Fatalf("slot %+v resolved %v fences %d", j.Slot, j.Resolved, e.fences())
			}
			if n := len(ag.dispatches()); n != 1 {
				t.Fatalf("sent %d times", n)
			}
			// The target admits again.
			e.submit(shJob("wh/refused", "exit 0", 20, nil))
		})
	}

	// Must-show 6: a wrong secret applies nothing, not even its proof; an
	// old invocation is stale; a duplicate changes nothing.
	t.Run("6_result_identity", func(t *testing.T) {
		e := newE2E(t, bin)
		e.server("s1")
		ag := e.standIn("acceptor", 1, func(agent.DispatchRequest) (int, string) { return http.StatusAccepted, "" })
		id := e.submit(shJob("wh/identity", "exit 0", 60, nil))
		e.waitFor("dispatch received", 20*time.Second, func() bool { return len(ag.dispatches()) == 1 })
		d := ag.dispatches()[0]
		running := e.waitJob(id, "RUNNING", 10*time.Second, func(j *jobs.Job) bool { return j.State == jobs.Running })
		env := func(secret, inv string) map[string]any {
			return map[string]any{"dispatch_revision": d.DispatchRevision, "invocation_id": inv,
				"agent_epoch": d.AgentEpoch, "secret": secret, "code": "EXIT_COMMITTED", "phase": "NATIVE_RETURN",
				"exit_code": 0, "proof": "CHILD_REAPED"}
		}
		path := "/v1/jobs/" + id + "/result"
		if st, raw := e.call("POST", path, agentTok, env(strings.Repeat("f", 32), d.InvocationID)); st != http.StatusForbidden {
			t.Fatalf("wrong secret: %d %s", st, raw)
		}
		if j := e.job(id); j.Revision != running.Revision || !j.Slot.Held || j.State != jobs.Running {
			t.Fatalf("a wrong secret changed the job: rev %d->%d slot %+v", running.Revision, j.Revision, j.Slot)
		}
		if st, raw := e.call("POST", path, agentTok, env(d.Secret, "5f0c1a44-2f9e-4f57-9d53-6a7f3e6b8a11")); st != http.StatusConflict {
			t.Fatalf("old invocation: %d %s", st, raw)
		}
		if j := e.job(id); j.Revision != running.Revision {
			t.Fatal("a stale envelope changed the job")
		}
		if st, raw := e.call("POST", path, agentTok, env(d.Secret, d.InvocationID)); st != http.StatusOK {
			t.Fatalf("right envelope: %d %s", st, raw)
		}
		done := e.job(id)
		if done.State != jobs.Committed || done.Slot.Proof != jobs.ProofChildReaped {
			t.Fatalf("after the report: %s %+v", done.State, done.Slot)
		}
		st, raw := e.call("POST", path, agentTok, env(d.Secret, d.InvocationID))
		if st != http.StatusOK || !strings.Contains(string(raw), `"applied":true`) {
			t.Fatalf("duplicate: %d %s", st, raw)
		}
		if j := e.job(id); j.Revision != done.Revision {
			t.Fatal("a duplicate changed the job")
		}
		_, answers := e.call("GET", "/v1/jobs/"+id, viewer, nil)
		for what, text := range map[string]string{"etcd": e.etcdDump(), "server logs": e.procs[0].logs.String(), "job JSON": string(answers)} {
			if strings.Contains(text, d.Secret) {
				t.Errorf("the dispatch secret appears in the %s", what)
			}
		}
	})

	// Must-show 4: kill -9 the agent mid-job. The deadline makes the job
	// UNKNOWN; the slot waits for the restarted agent's new epoch; the fence
	// waits for an operator.
	t.Run("4_agent_killed", func(t *testing.T) {
		e := newE2E(t, bin)
		srv := e.server("s1")
		ag := e.agent("a1", srv, 1)
		marker := fmt.Sprintf("e2e-killed-%d", time.Now().UnixNano())
		id := e.submit(shJob("wh/killed", "sleep 60; : "+marker, 6, nil))
		e.waitJob(id, "RUNNING", 20*time.Second, func(j *jobs.Job) bool { return j.State == jobs.Running })
		e.waitFor("the command running", 20*time.Second, func() bool { return len(processesWith(marker)) > 0 })
		ag.kill()
		j := e.waitJob(id, "UNKNOWN at the deadline", 30*time.Second, func(j *jobs.Job) bool { return j.State.Terminal() })
		if j.State != jobs.Unknown || j.Result.Code != jobs.CodeNoTrustedResult || !j.Slot.Held || e.fences() != 1 {
			t.Fatalf("state %s result %+v slot %+v fences %d", j.State, j.Result, j.Slot, e.fences())
		}
		oldEpoch := j.Dispatch.AgentEpoch
		e.agent("a1", srv, 1)
		// The new agent announced its epoch only after emptying the old
		// domain: nothing of the job is left.
		if pids := processesWith(marker); len(pids) > 0 {
			t.Fatalf("processes of the killed agent's job survive: %v", pids)
		}
		j = e.waitJob(id, "slot released by the new epoch", 30*time.Second, func(j *jobs.Job) bool { return !j.Slot.Held })
		if j.Slot.Proof != jobs.ProofAgentEpochReplaced || j.State != jobs.Unknown || j.Resolved {
			t.Fatalf("after restart: state %s slot %+v resolved %v", j.State, j.Slot, j.Resolved)
		}
		for _, a := range e.agents() {
			if a.ID == "a1" && a.Epoch == oldEpoch {
				t.Fatal("the restarted agent kept its epoch")
			}
		}
		if st, _ := e.call("POST", "/v1/jobs", submitter, shJob("wh/killed", "exit 0", 20, nil)); st != http.StatusConflict {
			t.Fatalf("target admitted while the UNKNOWN job holds it: %d", st)
		}
		if st, raw := e.call("POST", "/v1/jobs/"+id+"/force-release", operator,
			map[string]string{"note": "agent host checked: worker gone, index absent"}); st != http.StatusOK {
			t.Fatalf("force release: %d %s", st, raw)
		}
		if e.fences() != 0 {
			t.Fatal("fence held after force release")
		}
		e.submit(shJob("wh/killed", "exit 0", 20, nil))
	})

	// Must-show 5: the report arrives after the deadline (held back by a
	// partition); the job stays UNKNOWN, the report is kept as late
	// evidence and its CHILD_REAPED releases the slot.
	t.Run("5_late_report", func(t *testing.T) {
		e := newE2E(t, bin)
		srv := e.server("s1")
		e.agent("a1", srv, 1)
		e.proxy.holdResults()
		id := e.submit(shJob("wh/late", "exit 0", 5, nil))
		j := e.waitJob(id, "UNKNOWN at the deadline", 30*time.Second, func(j *jobs.Job) bool { return j.State.Terminal() })
		if j.State != jobs.Unknown || !j.Slot.Held {
			t.Fatalf("state %s slot %+v", j.State, j.Slot)
		}
		e.proxy.release()
		j = e.waitJob(id, "late report applied", 30*time.Second, func(j *jobs.Job) bool { return !j.Slot.Held })
		if j.State != jobs.Unknown || j.Slot.Proof != jobs.ProofChildReaped || len(j.Result.Late) != 1 ||
			j.Result.Late[0].Code != jobs.CodeExitCommitted || j.Result.Code != jobs.CodeNoTrustedResult {
			t.Fatalf("state %s slot %+v result %+v", j.State, j.Slot, j.Result)
		}
		if e.fences() != 1 || j.Resolved {
			t.Fatal("a late report resolved an UNKNOWN job")
		}
	})

	// Must-show 9: a credential profile reaches the command's environment
	// and nothing else.
	t.Run("9_credentials", func(t *testing.T) {
		e := newE2E(t, bin)
		var b [12]byte
		_, _ = rand.Read(b[:])
		value := "cred-" + hex.EncodeToString(b[:])
		creds := e.write("credentials.json", `{"warehouse-rw": {"DB_PASSWORD": "`+value+`"}}`)
		srv := e.server("s1", func(s *e2eServerSpec) { s.CredentialsFile = creds })
		ag := e.agent("a1", srv, 1)
		seen := filepath.Join(e.dir, "seen")
		id := e.submit(shJob("wh/creds", `printf %s "$DB_PASSWORD" > `+seen, 20, map[string]any{"credentials": "warehouse-rw"}))
		j := e.waitJob(id, "terminal", 30*time.Second, func(j *jobs.Job) bool { return j.State.Terminal() })
		if j.State != jobs.Committed {
			t.Fatalf("state %s result %+v", j.State, j.Result)
		}
		got, err := os.ReadFile(seen)
		if err != nil || string(got) != value {
			t.Fatalf("the command saw %q (%v)", got, err)
		}
		var answers strings.Builder
		for _, p := range []string{"/v1/jobs/" + id, "/v1/jobs", "/v1/fences", "/v1/slots", "/v1/agents", "/v1/status"} {
			_, raw := e.call("GET", p, viewer, nil)
			answers.Write(raw)
		}
		_, metrics := e.call("GET", "/metrics", "", nil)
		for what, text := range map[string]string{
			"etcd": e.etcdDump(), "server logs": e.procs[0].logs.String(), "agent logs": ag.logs.String(),
			"API answers": answers.String(), "metrics": string(metrics),
		} {
			if strings.Contains(text, value) {
				t.Errorf("the credential value appears in the %s", what)
			}
		}
	})

	// Must-show 2: the refresh hook gates the fence; a failing hook is
	// retried after the interval; force release frees a refresh-FAILED job.
	t.Run("2_refresh", func(t *testing.T) {
		e := newE2E(t, bin)
		hk := startE2EHook(t)
		srv := e.server("s1", func(s *e2eServerSpec) { s.RefreshRetry = 2 * time.Second })
		e.agent("a1", srv, 1)

		hk.set(http.StatusNoContent, true)
		id := e.submit(shJob("wh/refresh", "exit 0", 20, map[string]any{"refresh": map[string]string{"url": hk.url}}))
		e.waitFor("the hook called", 30*time.Second, func() bool { return hk.count() == 1 })
		j := e.job(id)
		if j.State != jobs.Committed || j.RefreshState != jobs.RefreshRunning || j.Resolved || e.fences() != 1 {
			t.Fatalf("during the hook: state %s refresh %s resolved %v fences %d", j.State, j.RefreshState, j.Resolved, e.fences())
		}
		hk.set(http.StatusNoContent, false)
		j = e.waitJob(id, "refresh DONE", 20*time.Second, func(j *jobs.Job) bool { return j.RefreshState == jobs.RefreshDone })
		if !j.Resolved || e.fences() != 0 {
			t.Fatalf("after DONE: resolved %v fences %d", j.Resolved, e.fences())
		}
		events := ""
		for _, h := range j.History {
			events += string(h.Event) + " "
		}
		if !strings.Contains(events, "result refresh_running refresh_done") {
			t.Fatalf("history %s", events)
		}

		hk.set(http.StatusInternalServerError, false)
		id = e.submit(shJob("wh/refresh", "exit 0", 20, map[string]any{"refresh": map[string]string{"url": hk.url}}))
		e.waitJob(id, "refresh FAILED", 30*time.Second, func(j *jobs.Job) bool { return j.RefreshState == jobs.RefreshFailed })
		calls := hk.count()
		e.waitFor("a retry after the interval", 20*time.Second, func() bool { return hk.count() > calls })
		j = e.waitJob(id, "FAILED again", 20*time.Second, func(j *jobs.Job) bool { return j.RefreshState == jobs.RefreshFailed })
		if e.fences() != 1 || j.Resolved {
			t.Fatal("a failed refresh released the fence")
		}
		// A retry may be in flight at this instant (refresh RUNNING, not
		// releasable); the operator tries again, as they would.
		e.waitFor("force release", 20*time.Second, func() bool {
			st, raw := e.call("POST", "/v1/jobs/"+id+"/force-release", operator,
				map[string]string{"note": "consumers refreshed by hand"})
			if st != http.StatusOK && st != http.StatusConflict {
				t.Fatalf("force release: %d %s", st, raw)
			}
			return st == http.StatusOK
		})
		if e.fences() != 0 {
			t.Fatal("fence held after force release")
		}
		e.submit(shJob("wh/refresh", "exit 0", 20, nil))
	})

	// Must-show 7: the leader dies between markRunning and the send. The
	// job was never sent; the next leader settles it through the tombstone.
	t.Run("7_leader_dies_before_send", func(t *testing.T) {
		e := newE2E(t, bin)
		s1 := e.server("s1", func(s *e2eServerSpec) { s.ExitAfterMarkRunning = true })
		e.waitFor("s1 leads", 20*time.Second, func() bool { return e.leaderAt(s1.base) == "s1" })
		s2 := e.server("s2")
		e.agent("a1", s2, 1)
		journal := filepath.Join(e.dir, "journal")
		id := e.submit(shJob("wh/crash", "echo ran >> "+journal, 30, nil))
		select {
		case <-s1.done:
		case <-time.After(30 * time.Second):
			t.Fatal("s1 did not die after markRunning")
		}
		if code := s1.cmd.ProcessState.ExitCode(); code != 86 {
			t.Fatalf("s1 exit code %d, want the hook's 86", code)
		}
		j := e.waitJob(id, "settled by the new leader", 30*time.Second, func(j *jobs.Job) bool { return j.State.Terminal() })
		if j.State != jobs.NotCommitted || j.Result.Code != jobs.CodeTombstoned || j.Slot.Proof != jobs.ProofNotEnqueued {
			t.Fatalf("state %s result %+v slot %+v", j.State, j.Result, j.Slot)
		}
		if _, err := os.Stat(journal); !os.IsNotExist(err) {
			t.Fatalf("the command ran: %v", err)
		}
	})

	// Must-show 8: two replicas and one agent; the leader is killed during
	// a stream of 200 jobs on 20 targets. Every job ends terminal, no
	// invocation runs twice, no two jobs on one target overlap, and the
	// leader change alone makes no job UNKNOWN.
	t.Run("8_leader_killed_during_stream", func(t *testing.T) {
		e := newE2E(t, bin)
		s1 := e.server("s1")
		e.waitFor("s1 leads", 20*time.Second, func() bool { return e.leaderAt(s1.base) == "s1" })
		s2 := e.server("s2")
		e.agent("a1", s2, 4)
		journal := filepath.Join(e.dir, "exec-journal")
		const targets, perTarget = 20, 10
		script := `echo "$M start $(date +%s%N)" >> ` + journal + `; sleep 0.05; echo "$M end $(date +%s%N)" >> ` + journal
		var (
			mu       sync.Mutex
			ids      []string
			admitted int
			errs     []string
			wg       sync.WaitGroup
		)
		killAt := make(chan struct{})
		var killOnce sync.Once
		for ti := 0; ti < targets; ti++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				deadline := time.Now().Add(4 * time.Minute)
				for k := 0; k < perTarget; k++ {
					body := shJob(fmt.Sprintf("stream/t%02d", ti), script, 60,
						map[string]any{"env": map[string]string{"M": fmt.Sprintf("t%02d-%d", ti, k)}})
					for {
						if time.Now().After(deadline) {
							mu.Lock()
							errs = append(errs, fmt.Sprintf("t%02d: job %d never admitted", ti, k))
							mu.Unlock()
							return
						}
						st, raw := e.callAt(s2.base, "POST", "/v1/jobs", submitter, body)
						if st == http.StatusCreated {
							var j jobs.Job
							_ = json.Unmarshal(raw, &j)
							mu.Lock()
							ids = append(ids, j.ID)
							admitted++
							if admitted == 60 {
								killOnce.Do(func() { close(killAt) })
							}
							mu.Unlock()
							break
						}
						// 409 fence-held: the previous job of this target is
						// unresolved; try again shortly.
						time.Sleep(100 * time.Millisecond)
					}
				}
			}()
		}
		select {
		case <-killAt:
			s1.kill()
		case <-time.After(3 * time.Minute):
			t.Fatal("60 admissions did not happen")
		}
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("submitters: %v", errs)
		}
		if l := e.leaderAt(s2.base); l != "s2" {
			t.Fatalf("leader after the kill is %q, want s2", l)
		}
		if len(ids) != targets*perTarget {
			t.Fatalf("%d jobs admitted", len(ids))
		}
		counts := map[jobs.State]int{}
		for _, id := range ids {
			var j *jobs.Job
			e.waitFor("job "+id+" terminal", 2*time.Minute, func() bool {
				_, raw := e.callAt(s2.base, "GET", "/v1/jobs/"+id, viewer, nil)
				j = &jobs.Job{}
				return json.Unmarshal(raw, j) == nil && j.State.Terminal() && j.Resolved
			})
			counts[j.State]++
			if j.State == jobs.Unknown {
				t.Errorf("job %s UNKNOWN (%+v)", id, j.Result)
			}
		}
		raw, err := os.ReadFile(journal)
		if err != nil {
			t.Fatal(err)
		}
		starts := map[string]int{}
		type span struct{ start, end string }
		spans := map[string]map[string]*span{} // target -> marker -> span
		for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 {
				t.Fatalf("journal line %q", line)
			}
			target := f[0][:strings.Index(f[0], "-")]
			if spans[target] == nil {
				spans[target] = map[string]*span{}
			}
			sp := spans[target][f[0]]
			if sp == nil {
				sp = &span{}
				spans[target][f[0]] = sp
			}
			if f[1] == "start" {
				starts[f[0]]++
				sp.start = f[2]
			} else {
				sp.end = f[2]
			}
		}
		for m, n := range starts {
			if n != 1 {
				t.Errorf("invocation %s executed %d times", m, n)
			}
		}
		for target, byMarker := range spans {
			for m1, a := range byMarker {
				for m2, b := range byMarker {
					if m1 < m2 && a.start < b.end && b.start < a.end && len(a.start) == len(b.end) && len(b.start) == len(a.end) {
						t.Errorf("%s: %s and %s overlapped", target, m1, m2)
					}
				}
			}
		}
		if counts[jobs.Committed] != len(starts) {
			t.Errorf("%d COMMITTED but %d executions", counts[jobs.Committed], len(starts))
		}
		fmt.Printf("e2e: stream of %d jobs across a leader kill: %v, %d executions\n", len(ids), counts, len(starts))
	})
}

// processesWith lists pids whose command line contains s.
func processesWith(s string) []string {
	var out []string
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		raw, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err == nil && strings.Contains(string(raw), s) {
			out = append(out, en.Name())
		}
	}
	return out
}

func (e *e2e) leaderAt(base string) string {
	_, raw := e.callAt(base, "GET", "/v1/status", viewer, nil)
	var st struct {
		Leader struct {
			ID string `json:"id"`
		} `json:"leader"`
	}
	_ = json.Unmarshal(raw, &st)
	return st.Leader.ID
}

func (e *e2e) etcdDump() string {
	e.t.Helper()
	cli := etcdtest.New(e.t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, e.prefix, clientv3.WithPrefix())
	if err != nil {
		e.t.Fatal(err)
	}
	var b strings.Builder
	for _, kv := range resp.Kvs {
		b.Write(kv.Key)
		b.Write(kv.Value)
	}
	return b.String()
}

// e2eHook is a refresh hook whose answer the test sets; while blocked it
// holds calls open.
type e2eHook struct {
	url     string
	mu      sync.Mutex
	status  int
	calls   int
	blocked chan struct{}
}

func startE2EHook(t *testing.T) *e2eHook {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &e2eHook{url: "http://" + ln.Addr().String() + "/hooks/index-changed", status: http.StatusOK}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.mu.Lock()
		h.calls++
		block := h.blocked
		h.mu.Unlock()
		if block != nil {
			select {
			case <-block:
			case <-r.Context().Done():
			}
		}
		h.mu.Lock()
		st := h.status
		h.mu.Unlock()
		w.WriteHeader(st)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		h.set(http.StatusOK, false)
		_ = srv.Close()
	})
	return h
}

func (h *e2eHook) set(status int, block bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.status = status
	if block && h.blocked == nil {
		h.blocked = make(chan struct{})
	}
	if !block && h.blocked != nil {
		close(h.blocked)
		h.blocked = nil
	}
}

func (h *e2eHook) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}
