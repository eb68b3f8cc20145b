package metrics

import (
	"errors"
	"slices"

	"jobfence/jobs"
)

// Other is the label value recorded for anything outside a label's fixed
// set. Label values are never free text: a caller passing an error message,
// a target name or a header by mistake gets "other", so no secret and no
// unbounded cardinality can reach a scrape.
const Other = "other"

// Admission outcomes (jobfence_admissions_total{outcome}).
const (
	AdmissionAdmitted            = "admitted"
	AdmissionReplayed            = "replayed" // same Idempotency-Key and body: the existing job answered
	AdmissionInvalid             = "invalid"
	AdmissionFenceHeld           = "fence_held"
	AdmissionQuotaExhausted      = "quota_exhausted"
	AdmissionClosed              = "admission_closed"
	AdmissionFailClosed          = "fail_closed"
	AdmissionIdempotencyMismatch = "idempotency_mismatch"
	AdmissionError               = "error"
)

// AdmissionOutcomes lists every admission outcome label.
var AdmissionOutcomes = []string{
	AdmissionAdmitted, AdmissionReplayed, AdmissionInvalid, AdmissionFenceHeld,
	AdmissionQuotaExhausted, AdmissionClosed, AdmissionFailClosed,
	AdmissionIdempotencyMismatch, AdmissionError,
}

// AdmissionOutcomeOf maps the error an admission returned to its outcome
// label (nil is AdmissionAdmitted; a replay is only known to the caller).
func AdmissionOutcomeOf(err error) string {
	var (
		fence *jobs.FenceHeldError
		quota *jobs.QuotaExhaustedError
		fail  *jobs.FailClosedError
		inval *jobs.ValidationError
	)
	switch {
	case err == nil:
		return AdmissionAdmitted
	case errors.As(err, &inval):
		return AdmissionInvalid
	case errors.As(err, &fence):
		return AdmissionFenceHeld
	case errors.As(err, &quota):
		return AdmissionQuotaExhausted
	case errors.As(err, &fail):
		return AdmissionFailClosed
	case errors.Is(err, jobs.ErrAdmissionClosed):
		return AdmissionClosed
	case errors.Is(err, jobs.ErrIdempotencyMismatch):
		return AdmissionIdempotencyMismatch
	}
	return AdmissionError
}

// Dispatch classifications (jobfence_dispatch_outcomes_total{classification}):
// the three answers a send can have (server.AgentClient.Dispatch).
const (
	DispatchEnqueued = "enqueued" // the agent enqueued it exactly once
	DispatchRefused  = "refused"  // a typed refusal: never enqueued
	DispatchUnknown  = "unknown"  // transport error or an untyped answer
)

// DispatchClassifications lists every classification label.
var DispatchClassifications = []string{DispatchEnqueued, DispatchRefused, DispatchUnknown}

// Round phases (jobfence_round_phase_seconds{phase}), in the order a round runs them.
const (
	PhaseDeadline  = "deadline"
	PhaseEpoch     = "epoch"
	PhaseRefresh   = "refresh"
	PhaseSettle    = "settle"
	PhaseDispatch  = "dispatch"
	PhaseRetention = "retention"
)

// RoundPhases lists every phase label.
var RoundPhases = []string{PhaseDeadline, PhaseEpoch, PhaseRefresh, PhaseSettle, PhaseDispatch, PhaseRetention}

// TransitionEvents lists every transition event label (jobs.Event values).
var TransitionEvents = []string{
	string(jobs.EventAdmit), string(jobs.EventCancel), string(jobs.EventMarkRunning),
	string(jobs.EventResult), string(jobs.EventLateResult), string(jobs.EventRefused),
	string(jobs.EventTombstoned), string(jobs.EventDeadline), string(jobs.EventTerminationProof),
	string(jobs.EventRefreshRunning), string(jobs.EventRefreshDone), string(jobs.EventRefreshFailed),
	string(jobs.EventRefreshDowngrade), string(jobs.EventForceRelease),
}

// JobStates lists every job state label (jobs.States).
var JobStates = func() []string {
	out := make([]string, len(jobs.States))
	for i, s := range jobs.States {
		out[i] = string(s)
	}
	return out
}()

// ResultCodes lists every agent outcome label (jobs.ResultCode values).
var ResultCodes = []string{
	string(jobs.CodeExitCommitted), string(jobs.CodeExitNotCommitted), string(jobs.CodeExitUnclassified),
	string(jobs.CodeKilledSignal), string(jobs.CodeKilledOOM), string(jobs.CodeKilledDeadline),
	string(jobs.CodePreInvocationRejected), string(jobs.CodeNeverLaunched),
	string(jobs.CodeRefusedByAgent), string(jobs.CodeTombstoned), string(jobs.CodeNoTrustedResult),
	string(jobs.CodeCancelled),
}

// known returns v when it is in set, Other otherwise.
func known(set []string, v string) string {
	if slices.Contains(set, v) {
		return v
	}
	return Other
}
