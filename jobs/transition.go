package jobs

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// Effects are the resources a transition takes or releases. The store turns
// each flag into key writes or deletes inside the same transaction as the
// record; it never decides them itself.
type Effects struct {
	TakeFence, ReleaseFence bool
	TakeQuota, ReleaseQuota bool
	TakeSlot, ReleaseSlot   bool
	// SlotAgent is the agent whose slot is taken or released.
	SlotAgent string
	// NoChange means the event was an exact repeat: nothing is written and the
	// caller answers with the current record.
	NoChange bool
}

// Meta is who performs a transition and when.
type Meta struct {
	Actor string
	At    time.Time
}

// Rule allows Event on a job in state From whose refresh state is one of
// Refresh (nil: any). Guard names a further condition in words; the
// transition function checks it.
type Rule struct {
	Event   Event
	From    State
	Refresh []RefreshState
	Guard   string
}

var afterRefresh = []RefreshState{RefreshRequired, RefreshFailed}

// Rules is the transition table: an event not allowed here returns
// ErrInvalidTransition before any other check except the secret.
var Rules = []Rule{
	{Event: EventCancel, From: Pending},
	{Event: EventMarkRunning, From: Pending},
	{Event: EventResult, From: Running},
	{Event: EventLateResult, From: Committed},
	{Event: EventLateResult, From: NotCommitted},
	{Event: EventLateResult, From: Unknown},
	{Event: EventRefused, From: Running},
	{Event: EventTombstoned, From: Running},
	{Event: EventDeadline, From: Running},
	{Event: EventTerminationProof, From: Running, Guard: "slot held"},
	{Event: EventTerminationProof, From: Committed, Guard: "slot held"},
	{Event: EventTerminationProof, From: NotCommitted, Guard: "slot held"},
	{Event: EventTerminationProof, From: Unknown, Guard: "slot held"},
	{Event: EventRefreshRunning, From: Committed, Refresh: afterRefresh, Guard: "not force-released"},
	{Event: EventRefreshRunning, From: NotCommitted, Refresh: afterRefresh, Guard: "not force-released"},
	{Event: EventRefreshDone, From: Committed, Refresh: []RefreshState{RefreshRunning}},
	{Event: EventRefreshDone, From: NotCommitted, Refresh: []RefreshState{RefreshRunning}},
	{Event: EventRefreshFailed, From: Committed, Refresh: []RefreshState{RefreshRunning}},
	{Event: EventRefreshFailed, From: NotCommitted, Refresh: []RefreshState{RefreshRunning}},
	{Event: EventRefreshDowngrade, From: Committed, Refresh: []RefreshState{RefreshRunning}},
	{Event: EventRefreshDowngrade, From: NotCommitted, Refresh: []RefreshState{RefreshRunning}},
	{Event: EventForceRelease, From: Unknown},
	{Event: EventForceRelease, From: Committed, Refresh: []RefreshState{RefreshFailed}},
	{Event: EventForceRelease, From: NotCommitted, Refresh: []RefreshState{RefreshFailed}},
}

// Allowed reports whether the table lets ev apply to j.
func Allowed(j *Job, ev Event) bool {
	for _, r := range Rules {
		if r.Event == ev && r.From == j.State && (r.Refresh == nil || slices.Contains(r.Refresh, j.RefreshState)) {
			return true
		}
	}
	return false
}

// HashSecret is the SHA-256 hex form of a dispatch secret, the only form
// that is stored.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Clone returns a deep copy of the parts transitions change.
func (j *Job) Clone() *Job {
	c := *j
	c.History = slices.Clone(j.History)
	if j.Dispatch != nil {
		d := *j.Dispatch
		c.Dispatch = &d
	}
	if j.Result != nil {
		r := *j.Result
		r.Late = slices.Clone(j.Result.Late)
		c.Result = &r
	}
	if j.Force != nil {
		f := *j.Force
		c.Force = &f
	}
	return &c
}

// Public is the record as API answers show it: without the secret's hash.
func (j *Job) Public() *Job {
	c := j.Clone()
	if c.Dispatch != nil {
		c.Dispatch.SecretHash = ""
	}
	c.BodyHash = ""
	return c
}

// IsResolved is the rule for Resolved: an operator's force release, or a
// COMMITTED/NOT_COMMITTED job that owes no refresh (or has done it). UNKNOWN
// resolves only by force release.
func IsResolved(j *Job) bool {
	if j.Force != nil {
		return true
	}
	if j.State != Committed && j.State != NotCommitted {
		return false
	}
	return j.RefreshState == RefreshNotRequired || j.RefreshState == RefreshDone
}

// step appends the history entry, recomputes Resolved and adds the fence and
// quota release that becoming resolved implies. Revision 0 in the entry is
// filled with the writing transaction's revision when the record is decoded.
func step(old, j *Job, ev Event, m Meta, detail string, eff Effects) (*Job, Effects) {
	j.History = append(j.History, HistoryEntry{
		At: m.At, Actor: m.Actor, Event: ev,
		From: string(old.State), To: string(j.State), Detail: detail,
	})
	j.UpdatedAt = m.At
	j.Resolved = IsResolved(j)
	if j.Resolved && !old.Resolved {
		eff.ReleaseFence, eff.ReleaseQuota = true, true
	}
	return j, eff
}

func releaseSlot(j *Job, proof Proof, eff *Effects) {
	if !j.Slot.Held {
		return
	}
	eff.ReleaseSlot = true
	eff.SlotAgent = j.Slot.AgentID
	j.Slot.Held = false
	j.Slot.Proof = proof
}

// AdmitParams is what admission fixes.
type AdmitParams struct {
	ID             string
	Target         Target
	Operation      string
	Spec           Spec
	IdempotencyKey string
	BodyHash       string
	QuotaToken     string
}

// Admit creates a PENDING record holding the fence and a quota unit.
func Admit(p AdmitParams, m Meta) (*Job, Effects) {
	j := &Job{
		ID: p.ID, Target: p.Target, Operation: p.Operation, Spec: p.Spec,
		State: Pending, RefreshState: RefreshNotRequired,
		Slot:      Slot{Proof: ProofNone},
		CreatedBy: m.Actor, CreatedAt: m.At, UpdatedAt: m.At,
		QuotaToken: p.QuotaToken, IdempotencyKey: p.IdempotencyKey, BodyHash: p.BodyHash,
	}
	j.History = []HistoryEntry{{At: m.At, Actor: m.Actor, Event: EventAdmit, To: string(Pending)}}
	return j, Effects{TakeFence: true, TakeQuota: true}
}

// Cancel moves a PENDING job to NOT_COMMITTED (CANCELLED); it never ran, so
// fence and quota are released at once.
func Cancel(j *Job, m Meta) (*Job, Effects, error) {
	if !Allowed(j, EventCancel) {
		return nil, Effects{}, ErrInvalidTransition
	}
	n := j.Clone()
	n.State = NotCommitted
	n.Result = &Result{Code: CodeCancelled, ReportedAt: m.At, Late: []LateReport{}}
	n, eff := step(j, n, EventCancel, m, "", Effects{})
	return n, eff, nil
}

// MarkRunning fixes the dispatch identity and takes the agent slot. It
// happens before the one and only send.
func MarkRunning(j *Job, d Dispatch, m Meta) (*Job, Effects, error) {
	if !Allowed(j, EventMarkRunning) {
		return nil, Effects{}, ErrInvalidTransition
	}
	if d.AgentID == "" || d.AgentEpoch == "" || d.InvocationID == "" || len(d.SecretHash) != 64 || d.Deadline.IsZero() {
		return nil, Effects{}, fmt.Errorf("mark running: incomplete dispatch identity")
	}
	n := j.Clone()
	d.DispatchRevision = 0 // the markRunning transaction's revision, filled at decode
	n.Dispatch = &d
	n.State = Running
	n.Slot = Slot{Held: true, AgentID: d.AgentID, Proof: ProofNone}
	n, eff := step(j, n, EventMarkRunning, m, "agent "+d.AgentID, Effects{TakeSlot: true, SlotAgent: d.AgentID})
	return n, eff, nil
}

// checkIdentity authenticates an agent's report: the secret first (a wrong
// one applies nothing, not even a proof), then the dispatch identity.
func checkIdentity(j *Job, env ResultEnvelope) error {
	if j.Dispatch == nil || j.Dispatch.SecretHash == "" {
		return ErrForbidden
	}
	got := HashSecret(env.Secret)
	if subtle.ConstantTimeCompare([]byte(got), []byte(j.Dispatch.SecretHash)) != 1 && !mutationAcceptAnySecret {
		return ErrForbidden
	}
	if env.DispatchRevision != j.Dispatch.DispatchRevision ||
		env.InvocationID != j.Dispatch.InvocationID ||
		env.AgentEpoch != j.Dispatch.AgentEpoch {
		return ErrStale
	}
	return nil
}

// EnvelopeHash identifies an envelope's content (the secret excluded), so an
// exact repeat is recognized.
func EnvelopeHash(env ResultEnvelope) string {
	exit := "-"
	if env.ExitCode != nil {
		exit = strconv.Itoa(*env.ExitCode)
	}
	h := sha256.New()
	for _, part := range []string{
		strconv.FormatInt(env.DispatchRevision, 10), env.InvocationID, env.AgentEpoch,
		string(env.Code), string(env.Phase), exit, env.Signal, env.Detail,
		string(env.Proof), strconv.FormatBool(env.ExternalStateAdvanced),
	} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Classification is what an agent's envelope means for the job.
type Classification struct {
	State State
	// Code is the result code recorded: the agent's, or NO_TRUSTED_RESULT
	// when the envelope is malformed or inconsistent with the job.
	Code ResultCode
	// SlotProof releases the slot when not ProofNone.
	SlotProof Proof
	// Problem explains a malformed envelope.
	Problem string
}

// Classify applies DESIGN.md's outcome table to an agent's envelope. The
// agent names the code, but the server checks that the code agrees with the
// exit code and the job's declared sets; any disagreement is UNKNOWN.
func Classify(spec Spec, env ResultEnvelope) Classification {
	c := classifyCode(spec, env)
	switch env.Proof {
	case ProofChildReaped:
		c.SlotProof = ProofChildReaped
	case ProofNeverLaunched:
		if c.Problem == "" && (env.Code == CodeNeverLaunched || env.Code == CodePreInvocationRejected) {
			c.SlotProof = ProofNeverLaunched
		} else if c.Problem == "" {
			c = Classification{State: Unknown, Code: CodeNoTrustedResult,
				Problem: fmt.Sprintf("proof NEVER_LAUNCHED with code %s", env.Code)}
		}
	case ProofNone, "":
	default:
		if c.Problem == "" {
			c = Classification{State: Unknown, Code: CodeNoTrustedResult,
				Problem: fmt.Sprintf("proof %q cannot come from an agent", env.Proof)}
		}
	}
	return c
}

func classifyCode(spec Spec, env ResultEnvelope) Classification {
	bad := func(format string, a ...any) Classification {
		return Classification{State: Unknown, Code: CodeNoTrustedResult, Problem: fmt.Sprintf(format, a...)}
	}
	inCommitted := env.ExitCode != nil && slices.Contains(spec.Outcome.CommittedExitCodes, *env.ExitCode)
	inNotCommitted := env.ExitCode != nil && slices.Contains(spec.Outcome.NotCommittedExitCodes, *env.ExitCode)
	switch env.Code {
	case CodeExitCommitted:
		if env.Phase != PhaseNativeReturn || !inCommitted {
			return bad("code EXIT_COMMITTED without a native return of a committed exit code")
		}
		return Classification{State: Committed, Code: env.Code}
	case CodeExitNotCommitted:
		if env.Phase != PhaseNativeReturn || !inNotCommitted {
			return bad("code EXIT_NOT_COMMITTED without a native return of a not-committed exit code")
		}
		return Classification{State: NotCommitted, Code: env.Code}
	case CodeExitUnclassified:
		if env.ExitCode == nil || inCommitted || inNotCommitted {
			return bad("code EXIT_UNCLASSIFIED with a declared or missing exit code")
		}
		return Classification{State: Unknown, Code: env.Code}
	case CodeKilledSignal, CodeKilledOOM, CodeKilledDeadline:
		return Classification{State: Unknown, Code: env.Code}
	case CodeNeverLaunched, CodePreInvocationRejected:
		if env.Phase != PhasePreInvocationRejected || env.ExitCode != nil {
			return bad("code %s after the command may have started", env.Code)
		}
		return Classification{State: NotCommitted, Code: env.Code}
	default:
		return bad("code %q is not an agent result code", env.Code)
	}
}

// refreshOwed: COMMITTED with a hook, or NOT_COMMITTED whose command says it
// advanced external state and has a hook.
func refreshOwed(spec Spec, s State, advanced bool) RefreshState {
	if spec.Refresh == nil {
		return RefreshNotRequired
	}
	if s == Committed || (s == NotCommitted && advanced) {
		return RefreshRequired
	}
	return RefreshNotRequired
}

// ApplyResult applies an agent's envelope. Secret first, then identity,
// then: RUNNING → classified outcome; a converged job keeps the envelope in
// result.late (its proof still releases a held slot; the state never
// changes); an exact repeat changes nothing.
func ApplyResult(j *Job, env ResultEnvelope, m Meta) (*Job, Effects, error) {
	if err := checkIdentity(j, env); err != nil {
		return nil, Effects{}, err
	}
	hash := EnvelopeHash(env)
	if j.Result != nil {
		if j.Result.EnvelopeHash == hash {
			return j, Effects{NoChange: true}, nil
		}
		for _, l := range j.Result.Late {
			if l.EnvelopeHash == hash {
				return j, Effects{NoChange: true}, nil
			}
		}
	}
	c := Classify(j.Spec, env)
	detail := sanitizeDetail(env.Detail)
	if c.Problem != "" {
		detail = "untrusted envelope: " + c.Problem
	}
	if j.State == Running {
		n := j.Clone()
		n.State = c.State
		n.Result = &Result{
			Code: c.Code, Phase: env.Phase, ExitCode: env.ExitCode, Signal: env.Signal,
			Detail: detail, ReportedAt: m.At, Late: []LateReport{}, EnvelopeHash: hash,
		}
		if c.Problem == "" {
			n.RefreshState = refreshOwed(n.Spec, n.State, env.ExternalStateAdvanced)
		}
		var eff Effects
		if c.SlotProof != "" && c.SlotProof != ProofNone {
			releaseSlot(n, c.SlotProof, &eff)
		}
		n, eff = step(j, n, EventResult, m, string(c.Code), eff)
		return n, eff, nil
	}
	if !Allowed(j, EventLateResult) {
		return nil, Effects{}, ErrInvalidTransition
	}
	n := j.Clone()
	if n.Result == nil {
		n.Result = &Result{Late: []LateReport{}}
	}
	n.Result.Late = append(n.Result.Late, LateReport{
		Code: env.Code, Phase: env.Phase, ExitCode: env.ExitCode, Signal: env.Signal,
		Detail: detail, Proof: env.Proof, ReportedAt: m.At, EnvelopeHash: hash,
	})
	var eff Effects
	if c.SlotProof != "" && c.SlotProof != ProofNone {
		releaseSlot(n, c.SlotProof, &eff)
	}
	n, eff = step(j, n, EventLateResult, m, string(env.Code), eff)
	return n, eff, nil
}

// sanitizeDetail keeps a detail printable and bounded: it is shown on pages.
func sanitizeDetail(s string) string {
	const maxDetail = 1024
	out := make([]rune, 0, len(s))
	size := 0
	for _, r := range s {
		if r == 0xFFFD || !Printable(string(r)) {
			r = '?'
		}
		size += len(string(r))
		if size > maxDetail {
			break
		}
		out = append(out, r)
	}
	return string(out)
}

// ClassifyByServer records an outcome the server itself establishes:
// REFUSED_BY_AGENT and TOMBSTONED prove the command never ran (slot released,
// NOT_ENQUEUED); NO_TRUSTED_RESULT after the deadline is UNKNOWN with the slot
// still held.
func ClassifyByServer(j *Job, code ResultCode, detail string, m Meta) (*Job, Effects, error) {
	var ev Event
	switch code {
	case CodeRefusedByAgent:
		ev = EventRefused
	case CodeTombstoned:
		ev = EventTombstoned
	case CodeNoTrustedResult:
		ev = EventDeadline
	default:
		return nil, Effects{}, fmt.Errorf("classify: %s is not a server result code", code)
	}
	if !Allowed(j, ev) {
		return nil, Effects{}, ErrInvalidTransition
	}
	n := j.Clone()
	n.Result = &Result{Code: code, Detail: sanitizeDetail(detail), ReportedAt: m.At, Late: []LateReport{}}
	var eff Effects
	if code == CodeNoTrustedResult {
		n.State = Unknown
		n.Result.Phase = PhaseIndeterminateAfterLaunch
	} else {
		n.State = NotCommitted
		n.Result.Phase = PhasePreInvocationRejected
		releaseSlot(n, ProofNotEnqueued, &eff)
	}
	n, eff = step(j, n, ev, m, string(code), eff)
	return n, eff, nil
}

// RecordTerminationProof releases a held slot with a proof found by the
// server (the epoch sweep: AGENT_EPOCH_REPLACED). The state is not touched.
func RecordTerminationProof(j *Job, proof Proof, m Meta) (*Job, Effects, error) {
	if proof != ProofAgentEpochReplaced {
		return nil, Effects{}, fmt.Errorf("termination proof: %s is not a server proof", proof)
	}
	if !Allowed(j, EventTerminationProof) || !j.Slot.Held {
		return nil, Effects{}, ErrInvalidTransition
	}
	n := j.Clone()
	var eff Effects
	releaseSlot(n, proof, &eff)
	n, eff = step(j, n, EventTerminationProof, m, string(proof), eff)
	return n, eff, nil
}

func refreshTo(j *Job, ev Event, to RefreshState, detail string, m Meta) (*Job, Effects, error) {
	if !Allowed(j, ev) || j.Force != nil {
		return nil, Effects{}, ErrInvalidTransition
	}
	n := j.Clone()
	n.RefreshState = to
	n, eff := step(j, n, ev, m, detail, Effects{})
	n.History[len(n.History)-1].From = string(j.RefreshState)
	n.History[len(n.History)-1].To = string(to)
	return n, eff, nil
}

// MarkRefreshRunning: the leader starts calling the hook (REQUIRED, or FAILED on retry).
func MarkRefreshRunning(j *Job, m Meta) (*Job, Effects, error) {
	return refreshTo(j, EventRefreshRunning, RefreshRunning, "", m)
}

// MarkRefreshDone: the hook answered 2xx; the job resolves and releases fence and quota.
func MarkRefreshDone(j *Job, m Meta) (*Job, Effects, error) {
	return refreshTo(j, EventRefreshDone, RefreshDone, "", m)
}

// MarkRefreshFailed: the hook failed; errText is kept as the history detail.
func MarkRefreshFailed(j *Job, errText string, m Meta) (*Job, Effects, error) {
	return refreshTo(j, EventRefreshFailed, RefreshFailed, sanitizeDetail(errText), m)
}

// DowngradeRefresh: a new leader cannot know whether its predecessor's call
// finished, so a left-over RUNNING refresh is owed again.
func DowngradeRefresh(j *Job, m Meta) (*Job, Effects, error) {
	return refreshTo(j, EventRefreshDowngrade, RefreshRequired, "", m)
}

// ForceReleaseWarning is recorded with every force release.
func ForceReleaseWarning(j *Job) string {
	if j.State == Unknown {
		return "released without proof of the outcome: the command may have committed, or may still commit, on " +
			j.Target.Key() + "; check the target before relying on it or admitting another job"
	}
	return "released with the refresh still failed: consumers of " + j.Target.Key() +
		" may not have seen the change"
}

// ForceRelease is the operator's way out of UNKNOWN (or of a failed
// refresh): fence, quota and a still-held slot are released; the state is
// never rewritten. Repeating it returns the record unchanged.
func ForceRelease(j *Job, note string, m Meta) (*Job, Effects, error) {
	if err := ValidateNote(note); err != nil {
		return nil, Effects{}, &ValidationError{Errors: []FieldError{{Field: "note", Problem: err.Error()}}}
	}
	if j.Force != nil {
		return j, Effects{NoChange: true}, nil
	}
	if !Allowed(j, EventForceRelease) {
		return nil, Effects{}, ErrInvalidTransition
	}
	n := j.Clone()
	n.Force = &Force{Actor: m.Actor, At: m.At, Note: note, Warning: ForceReleaseWarning(j)}
	var eff Effects
	releaseSlot(n, ProofForceReleased, &eff)
	n, eff = step(j, n, EventForceRelease, m, "", eff)
	return n, eff, nil
}

// Removable reports whether retention may delete the record: it is resolved
// and holds no slot (a held slot is evidence a child may be alive).
func Removable(j *Job) bool {
	return j.Resolved && !j.Slot.Held
}
