package jobs

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

const testSecret = "0123456789abcdef0123456789abcdef"

func meta() Meta { return Meta{Actor: "tester", At: t0} }

func intp(i int) *int { return &i }

func pendingJob(withRefresh bool) *Job {
	spec := Spec{Command: []string{"/bin/true"}, Outcome: Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{3}}}
	if withRefresh {
		spec.Refresh = &Refresh{URL: "http://127.0.0.1:1/hook"}
	}
	j, _ := Admit(AdmitParams{ID: "j1", Target: Target{Scope: "s", Name: "n", Display: "s/n"}, Spec: spec}, meta())
	return j
}

func runningJob(withRefresh bool) *Job {
	j, _, err := MarkRunning(pendingJob(withRefresh), Dispatch{
		AgentID: "a1", AgentEpoch: "e1", InvocationID: "inv1",
		SecretHash: HashSecret(testSecret), Deadline: t0.Add(time.Hour),
	}, meta())
	if err != nil {
		panic(err)
	}
	j.Dispatch.DispatchRevision = 7 // as the store's decode fills it
	return j
}

func envelope(code ResultCode, exit *int, proof Proof) ResultEnvelope {
	phase := PhaseNativeReturn
	if code == CodeNeverLaunched || code == CodePreInvocationRejected {
		phase = PhasePreInvocationRejected
	}
	return ResultEnvelope{DispatchRevision: 7, InvocationID: "inv1", AgentEpoch: "e1", Secret: testSecret,
		Code: code, Phase: phase, ExitCode: exit, Proof: proof}
}

func must(j *Job, _ Effects, err error) *Job {
	if err != nil {
		panic(err)
	}
	return j
}

// fixtures are the rows of the matrix: every reachable state, refresh state
// and slot/force combination.
func fixtures() []struct {
	name string
	job  *Job
} {
	committedWith := func(rs RefreshState) *Job {
		j := must(ApplyResult(runningJob(true), envelope(CodeExitCommitted, intp(0), ProofChildReaped), meta()))
		j.RefreshState = rs
		j.Resolved = IsResolved(j)
		return j
	}
	notCommittedWith := func(rs RefreshState) *Job {
		env := envelope(CodeExitNotCommitted, intp(3), ProofChildReaped)
		env.ExternalStateAdvanced = true
		j := must(ApplyResult(runningJob(true), env, meta()))
		j.RefreshState = rs
		j.Resolved = IsResolved(j)
		return j
	}
	unknownHeld := must(ClassifyByServer(runningJob(false), CodeNoTrustedResult, "deadline", meta()))
	unknownFree := must(RecordTerminationProof(unknownHeld, ProofAgentEpochReplaced, meta()))
	unknownForced := must(ForceRelease(unknownHeld, "checked", meta()))
	runningFree := must(RecordTerminationProof(runningJob(false), ProofAgentEpochReplaced, meta()))
	committedHeld := must(ApplyResult(runningJob(false), envelope(CodeExitCommitted, intp(0), ProofNone), meta()))
	rows := []struct {
		name string
		job  *Job
	}{
		{"PENDING", pendingJob(false)},
		{"RUNNING slot-held", runningJob(false)},
		{"RUNNING slot-free", runningFree},
	}
	for _, rs := range []RefreshState{RefreshNotRequired, RefreshRequired, RefreshRunning, RefreshDone, RefreshFailed} {
		rows = append(rows, struct {
			name string
			job  *Job
		}{"COMMITTED refresh=" + string(rs), committedWith(rs)})
	}
	rows = append(rows, struct {
		name string
		job  *Job
	}{"COMMITTED slot-held", committedHeld})
	for _, rs := range []RefreshState{RefreshNotRequired, RefreshRequired, RefreshRunning, RefreshDone, RefreshFailed} {
		rows = append(rows, struct {
			name string
			job  *Job
		}{"NOT_COMMITTED refresh=" + string(rs), notCommittedWith(rs)})
	}
	rows = append(rows, []struct {
		name string
		job  *Job
	}{
		{"UNKNOWN slot-held", unknownHeld},
		{"UNKNOWN slot-free", unknownFree},
		{"UNKNOWN force-released", unknownForced},
	}...)
	return rows
}

type matrixEvent struct {
	name string
	fn   func(*Job) (*Job, Effects, error)
}

func matrixEvents() []matrixEvent {
	return []matrixEvent{
		{"cancel", func(j *Job) (*Job, Effects, error) { return Cancel(j, meta()) }},
		{"mark_running", func(j *Job) (*Job, Effects, error) {
			return MarkRunning(j, Dispatch{AgentID: "a2", AgentEpoch: "e2", InvocationID: "inv2", SecretHash: HashSecret("x"), Deadline: t0}, meta())
		}},
		{"result EXIT_COMMITTED+CHILD_REAPED", func(j *Job) (*Job, Effects, error) {
			return ApplyResult(j, envelope(CodeExitCommitted, intp(0), ProofChildReaped), meta())
		}},
		{"result KILLED_SIGNAL+CHILD_REAPED", func(j *Job) (*Job, Effects, error) {
			e := envelope(CodeKilledSignal, nil, ProofChildReaped)
			e.Phase, e.Signal = PhaseIndeterminateAfterLaunch, "SIGKILL"
			return ApplyResult(j, e, meta())
		}},
		{"refused", func(j *Job) (*Job, Effects, error) {
			return ClassifyByServer(j, CodeRefusedByAgent, "queue-full", meta())
		}},
		{"tombstoned", func(j *Job) (*Job, Effects, error) { return ClassifyByServer(j, CodeTombstoned, "", meta()) }},
		{"deadline", func(j *Job) (*Job, Effects, error) {
			return ClassifyByServer(j, CodeNoTrustedResult, "deadline", meta())
		}},
		{"termination_proof", func(j *Job) (*Job, Effects, error) {
			return RecordTerminationProof(j, ProofAgentEpochReplaced, meta())
		}},
		{"refresh_running", func(j *Job) (*Job, Effects, error) { return MarkRefreshRunning(j, meta()) }},
		{"refresh_done", func(j *Job) (*Job, Effects, error) { return MarkRefreshDone(j, meta()) }},
		{"refresh_failed", func(j *Job) (*Job, Effects, error) { return MarkRefreshFailed(j, "503", meta()) }},
		{"refresh_downgrade", func(j *Job) (*Job, Effects, error) { return DowngradeRefresh(j, meta()) }},
		{"force_release", func(j *Job) (*Job, Effects, error) { return ForceRelease(j, "operator checked", meta()) }},
	}
}

func describe(n *Job, eff Effects, err error) string {
	switch {
	case errors.Is(err, ErrInvalidTransition):
		return "invalid"
	case err != nil:
		return "error: " + err.Error()
	case eff.NoChange:
		return "no change"
	}
	var parts []string
	parts = append(parts, string(n.State), "refresh="+string(n.RefreshState))
	if n.Slot.Held {
		parts = append(parts, "slot=held")
	} else {
		parts = append(parts, "slot="+string(n.Slot.Proof))
	}
	if n.Resolved {
		parts = append(parts, "resolved")
	}
	var fx []string
	for _, f := range []struct {
		on   bool
		name string
	}{
		{eff.TakeFence, "+fence"}, {eff.ReleaseFence, "-fence"}, {eff.TakeQuota, "+quota"}, {eff.ReleaseQuota, "-quota"},
		{eff.TakeSlot, "+slot"}, {eff.ReleaseSlot, "-slot"},
	} {
		if f.on {
			fx = append(fx, f.name)
		}
	}
	if len(fx) > 0 {
		parts = append(parts, "["+strings.Join(fx, " ")+"]")
	}
	return strings.Join(parts, " ")
}

// TestTransitionMatrix runs every event against every row and compares the
// outcome with testdata/matrix.golden; run with -update to rewrite it.
func TestTransitionMatrix(t *testing.T) {
	var b strings.Builder
	b.WriteString("# state x event matrix (go test ./jobs -run TestTransitionMatrix -update)\n")
	_, eff := Admit(AdmitParams{ID: "x"}, meta())
	fmt.Fprintf(&b, "\n## (new)\n  admit: %s\n", describe(pendingJob(false), eff, nil))
	for _, row := range fixtures() {
		fmt.Fprintf(&b, "\n## %s\n", row.name)
		for _, ev := range matrixEvents() {
			before := row.job.Clone()
			n, eff, err := ev.fn(row.job)
			fmt.Fprintf(&b, "  %s: %s\n", ev.name, describe(n, eff, err))
			if !reflect.DeepEqual(before, row.job) {
				t.Errorf("%s on %s mutated its input", ev.name, row.name)
			}
		}
	}
	golden := filepath.Join("testdata", "matrix.golden")
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != b.String() {
		t.Errorf("matrix differs from %s (run with -update and review the diff):\n%s", golden, b.String())
	}
}

func TestResultIdentityChecks(t *testing.T) {
	good := envelope(CodeExitCommitted, intp(0), ProofChildReaped)
	cases := []struct {
		name   string
		mutate func(*ResultEnvelope)
		want   error
	}{
		{"secret", func(e *ResultEnvelope) { e.Secret = "wrong" }, ErrForbidden},
		{"secret wins over a stale revision", func(e *ResultEnvelope) { e.Secret = "wrong"; e.DispatchRevision = 99 }, ErrForbidden},
		{"dispatch revision", func(e *ResultEnvelope) { e.DispatchRevision = 8 }, ErrStale},
		{"invocation id", func(e *ResultEnvelope) { e.InvocationID = "other" }, ErrStale},
		{"epoch", func(e *ResultEnvelope) { e.AgentEpoch = "e0" }, ErrStale},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := good
			c.mutate(&env)
			j := runningJob(false)
			if _, _, err := ApplyResult(j, env, meta()); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	// A wrong secret on a converged job holding its slot applies no proof.
	u := must(ClassifyByServer(runningJob(false), CodeNoTrustedResult, "", meta()))
	env := good
	env.Secret = "wrong"
	if _, _, err := ApplyResult(u, env, meta()); !errors.Is(err, ErrForbidden) {
		t.Fatalf("late report with a wrong secret: %v", err)
	}
	// A PENDING job has no secret: every report is refused.
	if _, _, err := ApplyResult(pendingJob(false), good, meta()); !errors.Is(err, ErrForbidden) {
		t.Fatalf("report on PENDING: %v", err)
	}
}

func TestClassification(t *testing.T) {
	cases := []struct {
		name      string
		env       ResultEnvelope
		state     State
		code      ResultCode
		slotProof Proof
	}{
		{"committed", envelope(CodeExitCommitted, intp(0), ProofChildReaped), Committed, CodeExitCommitted, ProofChildReaped},
		{"committed claim with a foreign exit code", envelope(CodeExitCommitted, intp(5), ProofChildReaped), Unknown, CodeNoTrustedResult, ProofChildReaped},
		{"committed claim with a not-committed exit code", envelope(CodeExitCommitted, intp(3), ProofNone), Unknown, CodeNoTrustedResult, ""},
		{"committed claim without exit code", envelope(CodeExitCommitted, nil, ProofChildReaped), Unknown, CodeNoTrustedResult, ProofChildReaped},
		{"not committed", envelope(CodeExitNotCommitted, intp(3), ProofChildReaped), NotCommitted, CodeExitNotCommitted, ProofChildReaped},
		{"not committed claim with exit 0", envelope(CodeExitNotCommitted, intp(0), ProofChildReaped), Unknown, CodeNoTrustedResult, ProofChildReaped},
		{"unclassified", envelope(CodeExitUnclassified, intp(9), ProofChildReaped), Unknown, CodeExitUnclassified, ProofChildReaped},
		{"unclassified claim of a committed code", envelope(CodeExitUnclassified, intp(0), ProofChildReaped), Unknown, CodeNoTrustedResult, ProofChildReaped},
		{"oom", envelope(CodeKilledOOM, nil, ProofChildReaped), Unknown, CodeKilledOOM, ProofChildReaped},
		{"killed, domain not reaped", envelope(CodeKilledDeadline, nil, ProofNone), Unknown, CodeKilledDeadline, ""},
		{"never launched", envelope(CodeNeverLaunched, nil, ProofNeverLaunched), NotCommitted, CodeNeverLaunched, ProofNeverLaunched},
		{"pre-invocation rejected", envelope(CodePreInvocationRejected, nil, ProofNeverLaunched), NotCommitted, CodePreInvocationRejected, ProofNeverLaunched},
		{"never launched with an exit code", envelope(CodeNeverLaunched, intp(0), ProofNeverLaunched), Unknown, CodeNoTrustedResult, ""},
		{"NEVER_LAUNCHED proof with an exit", envelope(CodeExitCommitted, intp(0), ProofNeverLaunched), Unknown, CodeNoTrustedResult, ""},
		{"server code from an agent", envelope(CodeTombstoned, nil, ProofNone), Unknown, CodeNoTrustedResult, ""},
		{"unknown code", envelope("EXIT_MAYBE", nil, ProofChildReaped), Unknown, CodeNoTrustedResult, ProofChildReaped},
		{"server proof from an agent", envelope(CodeExitCommitted, intp(0), ProofForceReleased), Unknown, CodeNoTrustedResult, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, eff, err := ApplyResult(runningJob(false), c.env, meta())
			if err != nil {
				t.Fatal(err)
			}
			if n.State != c.state || n.Result.Code != c.code {
				t.Fatalf("got %s/%s, want %s/%s (%s)", n.State, n.Result.Code, c.state, c.code, n.Result.Detail)
			}
			if released := c.slotProof != ""; eff.ReleaseSlot != released || n.Slot.Held == released {
				t.Fatalf("slot released=%v held=%v, want released=%v", eff.ReleaseSlot, n.Slot.Held, released)
			}
			if c.slotProof != "" && n.Slot.Proof != c.slotProof {
				t.Fatalf("proof %s, want %s", n.Slot.Proof, c.slotProof)
			}
			if n.State == Unknown && (eff.ReleaseFence || n.Resolved) {
				t.Fatal("UNKNOWN released the fence")
			}
		})
	}
}

func TestRefreshOwed(t *testing.T) {
	c := must(ApplyResult(runningJob(true), envelope(CodeExitCommitted, intp(0), ProofChildReaped), meta()))
	if c.RefreshState != RefreshRequired || c.Resolved {
		t.Fatalf("committed with hook: %s resolved=%v", c.RefreshState, c.Resolved)
	}
	env := envelope(CodeExitNotCommitted, intp(3), ProofChildReaped)
	if n := must(ApplyResult(runningJob(true), env, meta())); n.RefreshState != RefreshNotRequired || !n.Resolved {
		t.Fatalf("not committed, nothing advanced: %s resolved=%v", n.RefreshState, n.Resolved)
	}
	env.ExternalStateAdvanced = true
	if n := must(ApplyResult(runningJob(true), env, meta())); n.RefreshState != RefreshRequired {
		t.Fatalf("not committed, advanced: %s", n.RefreshState)
	}
	if n := must(ApplyResult(runningJob(false), env, meta())); n.RefreshState != RefreshNotRequired {
		t.Fatalf("advanced without a hook: %s", n.RefreshState)
	}
	r := must(MarkRefreshRunning(c, meta()))
	d, eff, err := MarkRefreshDone(r, meta())
	if err != nil || !d.Resolved || !eff.ReleaseFence || !eff.ReleaseQuota {
		t.Fatalf("refresh done: err=%v resolved=%v eff=%+v", err, d.Resolved, eff)
	}
}

func TestLateAndRepeatedResults(t *testing.T) {
	env := envelope(CodeExitCommitted, intp(0), ProofChildReaped)
	done := must(ApplyResult(runningJob(false), env, meta()))
	again, eff, err := ApplyResult(done, env, meta())
	if err != nil || !eff.NoChange || again != done {
		t.Fatalf("repeat: err=%v eff=%+v", err, eff)
	}
	// Deadline first, then the real report: evidence kept, slot released,
	// state untouched.
	u := must(ClassifyByServer(runningJob(false), CodeNoTrustedResult, "", meta()))
	late, eff, err := ApplyResult(u, env, meta())
	if err != nil {
		t.Fatal(err)
	}
	if late.State != Unknown || len(late.Result.Late) != 1 || late.Slot.Held || late.Slot.Proof != ProofChildReaped || !eff.ReleaseSlot {
		t.Fatalf("late: state=%s late=%d slot=%+v eff=%+v", late.State, len(late.Result.Late), late.Slot, eff)
	}
	if eff.ReleaseFence || late.Resolved {
		t.Fatal("a late report resolved an UNKNOWN job")
	}
	if _, eff, _ := ApplyResult(late, env, meta()); !eff.NoChange {
		t.Fatal("a repeated late report changed the record")
	}
}

func TestForceRelease(t *testing.T) {
	if _, _, err := ForceRelease(pendingJob(false), "n", meta()); !errors.Is(err, ErrInvalidTransition) {
		t.Fatalf("PENDING: %v", err)
	}
	var ve *ValidationError
	if _, _, err := ForceRelease(pendingJob(false), "", meta()); !errors.As(err, &ve) || ve.Errors[0].Field != "note" {
		t.Fatalf("empty note: %v", err)
	}
	u := must(ClassifyByServer(runningJob(false), CodeNoTrustedResult, "", meta()))
	f, eff, err := ForceRelease(u, "checked the index by hand", meta())
	if err != nil {
		t.Fatal(err)
	}
	if !eff.ReleaseFence || !eff.ReleaseQuota || !eff.ReleaseSlot || f.Slot.Proof != ProofForceReleased {
		t.Fatalf("effects %+v slot %+v", eff, f.Slot)
	}
	if f.State != Unknown || f.Force.Actor != "tester" || f.Force.Note == "" || f.Force.Warning == "" || !f.Force.At.Equal(t0) {
		t.Fatalf("force record %+v state %s", f.Force, f.State)
	}
	same, eff, err := ForceRelease(f, "another note", meta())
	if err != nil || !eff.NoChange || same != f {
		t.Fatalf("repeat: %v %+v", err, eff)
	}
}

func TestHistoryAndPublic(t *testing.T) {
	j := runningJob(false)
	if len(j.History) != 2 || j.History[1].Event != EventMarkRunning || j.History[1].From != "PENDING" || j.History[1].To != "RUNNING" {
		t.Fatalf("history %+v", j.History)
	}
	p := j.Public()
	if p.Dispatch.SecretHash != "" || j.Dispatch.SecretHash == "" {
		t.Fatal("Public kept the secret hash or changed the original")
	}
}
