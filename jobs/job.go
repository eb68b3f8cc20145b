// Package jobs is jobfence's domain: the job record, its states, the outcome
// classification and every transition as a pure function. It imports only the
// standard library; the store applies what a transition returns in one etcd
// transaction and never assigns a state by hand.
package jobs

import "time"

// State is where a job is in its lifecycle. UNKNOWN has no way out: force
// release resolves such a job but never rewrites its state.
type State string

const (
	// Pending: admitted by POST /v1/jobs; left by the dispatcher's markRunning
	// or by a submitter's cancel.
	Pending State = "PENDING"
	// Running: entered by markRunning (the dispatch identity is fixed then);
	// left only by a trusted result, a tombstone, a refusal or the deadline sweep.
	Running State = "RUNNING"
	// Committed: the command exited with a code of the committed set.
	Committed State = "COMMITTED"
	// NotCommitted: the command provably did not run, or ran and declared no commit.
	NotCommitted State = "NOT_COMMITTED"
	// Unknown: nobody can know whether the mutation happened; the fence is held
	// until an operator force-releases the job.
	Unknown State = "UNKNOWN"
)

// States lists every state in lifecycle order.
var States = []State{Pending, Running, Committed, NotCommitted, Unknown}

// Terminal reports whether s is an outcome (COMMITTED, NOT_COMMITTED, UNKNOWN).
func (s State) Terminal() bool {
	return s == Committed || s == NotCommitted || s == Unknown
}

// RefreshState tracks the refresh a terminal job may owe to the outside world.
type RefreshState string

const (
	// RefreshNotRequired: no refresh is owed (no hook, UNKNOWN, or not yet terminal).
	RefreshNotRequired RefreshState = "NOT_REQUIRED"
	// RefreshRequired: set by the result transition; the leader's refresh driver
	// moves it to RUNNING. A new leader downgrades a left-over RUNNING back here.
	RefreshRequired RefreshState = "REQUIRED"
	// RefreshRunning: the leader is calling the hook.
	RefreshRunning RefreshState = "RUNNING"
	// RefreshDone: the hook answered 2xx; fence and quota are released with it.
	RefreshDone RefreshState = "DONE"
	// RefreshFailed: the hook failed; retried at most once per retry interval,
	// or force-released by an operator.
	RefreshFailed RefreshState = "FAILED"
)

// Proof is why a slot was released. NONE means the slot is still possibly live.
type Proof string

const (
	ProofNone Proof = "NONE"
	// ProofChildReaped: the agent reaped the exact child and the domain is empty.
	ProofChildReaped Proof = "CHILD_REAPED"
	// ProofAgentEpochReplaced: the agent process that got the dispatch is gone
	// (a new epoch was announced after its startup sweep).
	ProofAgentEpochReplaced Proof = "AGENT_EPOCH_REPLACED"
	// ProofNotEnqueued: the agent cleanly refused the dispatch, or tombstoned it.
	ProofNotEnqueued Proof = "NOT_ENQUEUED"
	// ProofNeverLaunched: accepted but provably never exec'd.
	ProofNeverLaunched Proof = "NEVER_LAUNCHED"
	// ProofForceReleased: an operator released it with a note.
	ProofForceReleased Proof = "FORCE_RELEASED"
)

// ResultCode is the typed outcome of a dispatch. Only codes are read; no
// component parses message text.
type ResultCode string

const (
	// From the agent.
	CodeExitCommitted         ResultCode = "EXIT_COMMITTED"
	CodeExitNotCommitted      ResultCode = "EXIT_NOT_COMMITTED"
	CodeExitUnclassified      ResultCode = "EXIT_UNCLASSIFIED"
	CodeKilledSignal          ResultCode = "KILLED_SIGNAL"
	CodeKilledOOM             ResultCode = "KILLED_OOM"
	CodeKilledDeadline        ResultCode = "KILLED_DEADLINE"
	CodePreInvocationRejected ResultCode = "PRE_INVOCATION_REJECTED"
	CodeNeverLaunched         ResultCode = "NEVER_LAUNCHED"
	// From the server.
	CodeRefusedByAgent  ResultCode = "REFUSED_BY_AGENT"
	CodeTombstoned      ResultCode = "TOMBSTONED"
	CodeNoTrustedResult ResultCode = "NO_TRUSTED_RESULT"
	CodeCancelled       ResultCode = "CANCELLED"
)

// Phase is how far the worker got.
type Phase string

const (
	PhasePreInvocationRejected    Phase = "PRE_INVOCATION_REJECTED"
	PhaseNativeReturn             Phase = "NATIVE_RETURN"
	PhaseIndeterminateAfterLaunch Phase = "INDETERMINATE_AFTER_LAUNCH"
)

// Target is the thing a job mutates: scope/name. The fence is on the
// normalized (trimmed, lower-cased) form; Display keeps the submitted spelling.
type Target struct {
	Scope   string `json:"scope"`
	Name    string `json:"name"`
	Display string `json:"display"`
}

// Key is the normalized "scope/name" the fence is taken on.
func (t Target) Key() string { return t.Scope + "/" + t.Name }

// Limits bound a worker domain.
type Limits struct {
	MemoryBytes     int64 `json:"memory_bytes,omitempty"`
	Pids            int64 `json:"pids,omitempty"`
	DeadlineSeconds int64 `json:"deadline_seconds,omitempty"`
}

// Outcome declares which exit codes mean committed and which mean not committed.
type Outcome struct {
	CommittedExitCodes    []int `json:"committed_exit_codes"`
	NotCommittedExitCodes []int `json:"not_committed_exit_codes"`
}

// Refresh is the hook owed after a job changed external state.
type Refresh struct {
	URL string `json:"url"`
}

// Spec is what the submitter asked for. Credential values never live here:
// Credentials names a server-side profile resolved at each dispatch.
type Spec struct {
	Command     []string          `json:"command"`
	Env         map[string]string `json:"env,omitempty"`
	Credentials string            `json:"credentials,omitempty"`
	WorkingDir  string            `json:"working_dir,omitempty"`
	Limits      Limits            `json:"limits"`
	Outcome     Outcome           `json:"outcome"`
	Refresh     *Refresh          `json:"refresh,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
}

// Slot is the agent capacity a dispatch holds while its worker may be alive.
type Slot struct {
	Held    bool   `json:"held"`
	AgentID string `json:"agent_id,omitempty"`
	Proof   Proof  `json:"proof"`
}

// Dispatch is the identity fixed once by markRunning and never reused.
// Secret is stored (the result endpoint compares it) but never serialized to
// API answers: see Job.Public.
type Dispatch struct {
	AgentID          string    `json:"agent_id"`
	AgentEpoch       string    `json:"agent_epoch"`
	AgentAddress     string    `json:"agent_address,omitempty"`
	InvocationID     string    `json:"invocation_id"`
	DispatchRevision int64     `json:"dispatch_revision"`
	Deadline         time.Time `json:"deadline"`
	SentAt           time.Time `json:"sent_at,omitzero"`
	// SecretHash is the SHA-256 of the per-dispatch secret; the secret itself is
	// never written to etcd.
	SecretHash string `json:"secret_hash,omitempty"`
}

// LateReport is an envelope that arrived after the job converged, kept as evidence.
type LateReport struct {
	Code       ResultCode `json:"code"`
	Phase      Phase      `json:"phase,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	Signal     string     `json:"signal,omitempty"`
	Detail     string     `json:"detail,omitempty"`
	Proof      Proof      `json:"proof,omitempty"`
	ReportedAt time.Time  `json:"reported_at"`
	// EnvelopeHash identifies the envelope (see EnvelopeHash) so a repeat is
	// recognized and changes nothing.
	EnvelopeHash string `json:"envelope_hash,omitempty"`
}

// Result is the classified outcome.
type Result struct {
	Code       ResultCode   `json:"code"`
	Phase      Phase        `json:"phase,omitempty"`
	ExitCode   *int         `json:"exit_code,omitempty"`
	Signal     string       `json:"signal,omitempty"`
	Detail     string       `json:"detail,omitempty"`
	ReportedAt time.Time    `json:"reported_at"`
	Late       []LateReport `json:"late"`
	// EnvelopeHash identifies the applied agent envelope ("" for results the
	// server established).
	EnvelopeHash string `json:"envelope_hash,omitempty"`
}

// Force records an operator's force release.
type Force struct {
	Actor   string    `json:"actor"`
	At      time.Time `json:"at"`
	Note    string    `json:"note"`
	Warning string    `json:"warning"`
}

// HistoryEntry is one transition, with the etcd revision that made it.
type HistoryEntry struct {
	Revision int64     `json:"revision"`
	At       time.Time `json:"at"`
	Actor    string    `json:"actor"`
	Event    Event     `json:"event"`
	From     string    `json:"from,omitempty"`
	To       string    `json:"to,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

// Event names a transition in history and in the transition table.
type Event string

const (
	EventAdmit            Event = "admit"
	EventCancel           Event = "cancel"
	EventMarkRunning      Event = "mark_running"
	EventResult           Event = "result"
	EventLateResult       Event = "late_result"
	EventRefused          Event = "refused"
	EventTombstoned       Event = "tombstoned"
	EventDeadline         Event = "deadline"
	EventTerminationProof Event = "termination_proof"
	EventRefreshRunning   Event = "refresh_running"
	EventRefreshDone      Event = "refresh_done"
	EventRefreshFailed    Event = "refresh_failed"
	EventRefreshDowngrade Event = "refresh_downgrade"
	EventForceRelease     Event = "force_release"
)

// Job is the durable record. Revision is the etcd ModRevision it was read at;
// it is not stored inside the value.
type Job struct {
	ID           string         `json:"id"`
	Revision     int64          `json:"revision"`
	Target       Target         `json:"target"`
	Operation    string         `json:"operation,omitempty"`
	Spec         Spec           `json:"spec"`
	State        State          `json:"state"`
	RefreshState RefreshState   `json:"refresh_state"`
	Resolved     bool           `json:"resolved"`
	Slot         Slot           `json:"slot"`
	Dispatch     *Dispatch      `json:"dispatch,omitempty"`
	Result       *Result        `json:"result,omitempty"`
	Force        *Force         `json:"force,omitempty"`
	CreatedBy    string         `json:"created_by"`
	CreatedAt    time.Time      `json:"created_at"`
	UpdatedAt    time.Time      `json:"updated_at"`
	History      []HistoryEntry `json:"history"`
	// BlockedReason says why a PENDING job is not dispatched (missing
	// credential profile, no eligible agent). Set by the read model, not stored.
	BlockedReason string `json:"blocked_reason,omitempty"`
	// QuotaToken is the quota unit this job holds while unresolved
	// (store-internal; see internal/store/keys.go).
	QuotaToken string `json:"quota_token,omitempty"`
	// IdempotencyKey and BodyHash let a repeated POST answer with the same job.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	BodyHash       string `json:"body_hash,omitempty"`
}
