package agent

import (
	"fmt"
	"log/slog"
	"time"

	"jobfence/jobs"
)

// DispatchRequest is the body of POST /v1/dispatches, sent by the leader's
// dispatcher to the agent named in the job's dispatch. Secret and
// Credentials never appear in logs: String and LogValue print identities only.
type DispatchRequest struct {
	JobID            string    `json:"job_id"`
	DispatchRevision int64     `json:"dispatch_revision"`
	InvocationID     string    `json:"invocation_id"`
	Secret           string    `json:"secret"`
	AgentEpoch       string    `json:"agent_epoch"`
	Deadline         time.Time `json:"deadline"`
	Spec             jobs.Spec `json:"spec"`
	// Credentials maps environment variable names to resolved values; they
	// reach the command only as those variables.
	Credentials map[string]string `json:"credentials,omitempty"`
}

// String prints the identity of the request, never its secrets.
func (r DispatchRequest) String() string {
	return fmt.Sprintf("dispatch{job_id=%s invocation_id=%s dispatch_revision=%d agent_epoch=%s}",
		r.JobID, r.InvocationID, r.DispatchRevision, r.AgentEpoch)
}

// LogValue keeps the secret and credential values out of every log record.
func (r DispatchRequest) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("job_id", r.JobID),
		slog.String("invocation_id", r.InvocationID),
		slog.Int64("dispatch_revision", r.DispatchRevision),
		slog.String("agent_epoch", r.AgentEpoch))
}

// InvocationStatus is the answer of GET /v1/invocations/{id}, of a 202 to a
// dispatch, and of a tombstone request.
type InvocationStatus struct {
	Status string `json:"status"`
}

// Invocation statuses.
const (
	// StatusUnknown: this agent process never received the invocation (and
	// holds no tombstone for it).
	StatusUnknown = "unknown"
	// StatusQueued: accepted, waiting for an executor.
	StatusQueued = "queued"
	// StatusRunning: dequeued; its domain may be alive, or its report is
	// still being delivered.
	StatusRunning = "running"
	// StatusReported: the server acknowledged the result envelope.
	StatusReported = "reported"
	// StatusTombstoned: the invocation never arrived and now never will run.
	StatusTombstoned = "tombstoned"
)

// TombstoneRequest is the body of POST /v1/invocations/{id}/tombstone.
type TombstoneRequest struct {
	AgentEpoch string `json:"agent_epoch"`
}

// ProblemTypeBase prefixes every refusal slug to form the problem's type.
const ProblemTypeBase = "https://jobfence.dev/problems/"

// Refusal slugs of POST /v1/dispatches (and epoch-mismatch of the tombstone
// endpoint). A refusal means the invocation was not enqueued and never will
// execute; the dispatcher may release the slot with NOT_ENQUEUED. The HTTP
// status of each is fixed:
//
//	epoch-mismatch          409  agent_epoch is not this process's epoch
//	isolation-unverified    503  the preflight could not verify isolation
//	payload-too-large       413  the body or a field exceeds the agent's bounds
//	deadline-unfundable     422  the deadline cannot fund skew + term grace +
//	                             reap bound + the minimum run window
//	queue-full              503  no queue space
//	invocation-tombstoned   409  the invocation id was tombstoned earlier
//
// Any other answer (another status or slug, 400, 401, 415, a reset, a
// timeout) is not a refusal: the outcome of the send is unknown.
const (
	RefusalEpochMismatch       = "epoch-mismatch"
	RefusalIsolationUnverified = "isolation-unverified"
	RefusalPayloadTooLarge     = "payload-too-large"
	RefusalDeadlineUnfundable  = "deadline-unfundable"
	RefusalQueueFull           = "queue-full"
	RefusalTombstoned          = "invocation-tombstoned"
)

// RefusalStatus is the HTTP status of each refusal slug.
var RefusalStatus = map[string]int{
	RefusalEpochMismatch:       409,
	RefusalIsolationUnverified: 503,
	RefusalPayloadTooLarge:     413,
	RefusalDeadlineUnfundable:  422,
	RefusalQueueFull:           503,
	RefusalTombstoned:          409,
}

// Problem is the RFC 9457 body the agent answers errors with.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail"`
	Instance  string `json:"instance"`
	RequestID string `json:"request_id"`
}
