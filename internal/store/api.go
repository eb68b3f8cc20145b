package store

// This file is the contract between the store and its callers (handlers,
// web, the dispatcher, the result endpoint). Signatures here are relied on by
// other packages: change them only together with every caller.

import (
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/jobs"
)

// Config configures a Store.
type Config struct {
	// Client is a connected etcd client (embedded or external).
	Client *clientv3.Client
	// Prefix namespaces every key, so tests share one etcd with a prefix each.
	// Example: "/jobfence". Must not end in "/".
	Prefix string
	// QuotaGlobal and QuotaPerScope bound unresolved jobs (defaults 10000 / 1000).
	QuotaGlobal   int
	QuotaPerScope int
	// Defaults fill omitted submission fields and bound memory.
	Defaults jobs.Defaults
	// ReplicaID names this replica in status and history.
	ReplicaID string
	// AgentLiveFor is how long after its last heartbeat an agent is shown
	// live (default 15s). Liveness is for display; it releases nothing.
	AgentLiveFor time.Duration
	Now          func() time.Time
	Logger       *slog.Logger
	// OnTransition, when set, is called with the jobs.Event of every
	// transition this store committed (admissions included), after the view
	// reached it. It runs on the writer's goroutine: keep it cheap (a metric).
	OnTransition func(event string)
}

// Leadership identifies the leader for leader-only writes: its election key
// and that key's CreateRevision. Every leader-only transaction compares
// CreateRevision(Key) == Rev, so a deposed leader's write changes nothing and
// returns jobs.ErrNotLeader.
type Leadership struct {
	Key string
	Rev int64
	ID  string // the leader's replica id, used as the history actor ("dispatcher@<id>")
}

// AdmitInput is a validated submission.
type AdmitInput struct {
	Target         jobs.Target
	Operation      string
	Spec           jobs.Spec
	Actor          string // the token's subject
	IdempotencyKey string // "" when none
	BodyHash       string // SHA-256 of the canonical body, for Idempotency-Key
}

// ListFilter selects jobs for GET /v1/jobs (newest first).
type ListFilter struct {
	State     jobs.State // "" = any
	Scope     string
	Target    string // normalized scope/name
	Resolved  *bool
	AgentID   string
	Limit     int    // 1..500
	PageToken string // opaque; "" = first page
}

// Fence is one held fence, from the read model.
type Fence struct {
	Target       string            `json:"target"`
	Display      string            `json:"display"`
	JobID        string            `json:"job_id"`
	State        jobs.State        `json:"state"`
	RefreshState jobs.RefreshState `json:"refresh_state"`
	Since        time.Time         `json:"since"`
}

// Slot is one held agent slot, from the read model.
type Slot struct {
	AgentID  string     `json:"agent_id"`
	JobID    string     `json:"job_id"`
	State    jobs.State `json:"state"`
	Since    time.Time  `json:"since"`
	Awaiting string     `json:"awaiting"` // the proof that would release it, in words
}

// AgentView is an agent record with what the read model knows about it.
type AgentView struct {
	jobs.Agent
	SlotsHeld int  `json:"slots_held"`
	Live      bool `json:"live"`
}

// Settings are the operator switches.
type Settings struct {
	AdmissionOpen  bool
	DispatchPaused bool
}

// Cursor is the read model's position.
type Cursor struct {
	Revision int64 // the etcd revision the view reflects
	Lag      int64 // latest known etcd revision minus Revision
}

// MarkRunningInput is the dispatch identity markRunning fixes.
type MarkRunningInput struct {
	AgentID      string
	AgentEpoch   string
	AgentAddress string
	InvocationID string
	SecretHash   string // SHA-256 hex of the 128-bit secret; the secret never reaches etcd
	Deadline     time.Time
}

// Change is one read-model change, for /v1/events and the dashboard.
type Change struct {
	// "job" | "fence" | "slot" | "agent" | "settings", or "resync": the view
	// was re-listed (or this subscriber fell behind and lost changes), so
	// re-read everything.
	Kind     string
	ID       string
	Revision int64
}

// Method set (implemented in store.go and friends):
//
//	New(cfg Config) (*Store, error)
//	(*Store).Run(ctx) error                          // read model: list, then watch; self-heals on compaction
//	(*Store).WaitSynced(ctx, rev int64) error         // until the view reached rev
//	(*Store).Ready() bool                             // first list done
//	(*Store).Cursor() Cursor
//	(*Store).Subscribe() (<-chan Change, func())      // fan-out of read-model changes
//
//	(*Store).Admit(ctx, AdmitInput) (job *jobs.Job, created bool, err error)
//	(*Store).Get(ctx, id) (*jobs.Job, error)          // read model; jobs.ErrNotFound
//	(*Store).List(ctx, ListFilter) (jobs []*jobs.Job, next string, err error) // summaries; resolved records read from etcd
//	(*Store).Cancel(ctx, id, actor) (*jobs.Job, error)
//	(*Store).ForceRelease(ctx, id, actor, note) (*jobs.Job, error)
//	(*Store).Fences() []Fence
//	(*Store).Slots() []Slot
//	(*Store).Agents() []AgentView
//	(*Store).Counts() map[jobs.State]int
//	(*Store).QuotaUse() (global int, perScope map[string]int)
//	(*Store).Settings() Settings
//	(*Store).SetAdmissionOpen(ctx, open bool) error
//	(*Store).SetDispatchPaused(ctx, paused bool) error
//	(*Store).PutAgent(ctx, id string, reg jobs.AgentRegistration) (*jobs.Agent, error)
//
//	// Dispatcher and result endpoint (leader-only writes take a Leadership):
//	(*Store).MarkRunning(ctx, l Leadership, id string, rev int64, in MarkRunningInput) (*jobs.Job, error)
//	(*Store).CompleteWithResult(ctx, id string, env jobs.ResultEnvelope) (job *jobs.Job, applied bool, err error)
//	(*Store).Classify(ctx, l Leadership, id string, rev int64, code jobs.ResultCode, detail string) (*jobs.Job, error) // REFUSED_BY_AGENT, TOMBSTONED, NO_TRUSTED_RESULT (deadline)
//	(*Store).RecordTerminationProof(ctx, l Leadership, id string, rev int64, proof jobs.Proof) (*jobs.Job, error) // epoch sweep
//	(*Store).MarkRefreshRunning / MarkRefreshDone / MarkRefreshFailed(ctx, l, id, rev[, errText]) (*jobs.Job, error)
//	(*Store).DowngradeRefresh(ctx, l, id, rev) (*jobs.Job, error)
//	(*Store).RemoveResolved(ctx, olderThan time.Time, batch int) (removed int, err error)
//	(*Store).ActiveJobs(filter func(*jobs.Job) bool) []*jobs.Job // unresolved or slot-holding jobs, for the dispatcher
//
//	// Also available:
//	(*Store).CorruptRecords() []CorruptRecord        // what makes admission fail closed (ForceRelease(id) removes one)
//	(*Store).Relists() uint64                         // re-lists after the first (compaction, watch failure)
//	(*Store).AdmitAttempts() (attempts, admissions uint64)
//	ElectionPrefix(prefix string) string
//	NewElector(cli, prefix, replicaID string, ttl time.Duration) (*Elector, error)
//	(*Elector).Campaign(ctx) (Leadership, error) / Resign(ctx) error / Done() <-chan struct{} / Close() error
//	(*Elector).Leader(ctx) (id string, rev int64, err error) // current leader and its election revision
