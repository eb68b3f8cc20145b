package jobs

import (
	"errors"
	"fmt"
)

// Errors a transition or an admission can return. Handlers map them to
// problem types through one table (internal/problem); only these and
// *ValidationError carry client-facing detail.
var (
	// ErrNotFound: no job with that id.
	ErrNotFound = errors.New("job not found")
	// ErrInvalidTransition: the job's state does not allow the event.
	ErrInvalidTransition = errors.New("invalid transition")
	// ErrStale: a compare was lost or an identity did not match (dispatch
	// revision, invocation id, epoch); nothing was written.
	ErrStale = errors.New("stale")
	// ErrForbidden: the dispatch secret did not match; nothing was applied.
	ErrForbidden = errors.New("secret mismatch")
	// ErrAdmissionClosed: an operator closed admission.
	ErrAdmissionClosed = errors.New("admission closed")
	// ErrIdempotencyMismatch: the same Idempotency-Key came with another body.
	ErrIdempotencyMismatch = errors.New("idempotency key reused with a different body")
	// ErrNotLeader: a leader-only write was attempted without (or after losing) leadership.
	ErrNotLeader = errors.New("not the leader")
)

// FenceHeldError: the target already has an unresolved job.
type FenceHeldError struct {
	Target      string
	HolderJobID string
}

func (e *FenceHeldError) Error() string {
	return fmt.Sprintf("target %s is fenced by job %s", e.Target, e.HolderJobID)
}

// QuotaExhaustedError: no unresolved-job quota is left for Scope ("" = global).
type QuotaExhaustedError struct {
	Scope  string
	Global bool
}

func (e *QuotaExhaustedError) Error() string {
	if e.Global {
		return "global unresolved-job quota exhausted"
	}
	return fmt.Sprintf("unresolved-job quota exhausted for scope %s", e.Scope)
}

// FailClosedError: a corrupt or target-less unresolved record blocks every
// admission until it is force-released.
type FailClosedError struct {
	JobID string
}

func (e *FailClosedError) Error() string {
	return fmt.Sprintf("admission fails closed: unresolved record %s cannot be decoded", e.JobID)
}

// FieldError names one invalid field.
type FieldError struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
}

// ValidationError lists every invalid field at once.
type ValidationError struct {
	Errors []FieldError
}

func (e *ValidationError) Error() string {
	if len(e.Errors) == 0 {
		return "invalid"
	}
	return fmt.Sprintf("invalid %s: %s (and %d more)", e.Errors[0].Field, e.Errors[0].Problem, len(e.Errors)-1)
}

// Add appends a field problem.
func (e *ValidationError) Add(field, problem string) {
	e.Errors = append(e.Errors, FieldError{Field: field, Problem: problem})
}

// Err returns e when it holds any problem, nil otherwise.
func (e *ValidationError) Err() error {
	if e == nil || len(e.Errors) == 0 {
		return nil
	}
	return e
}
