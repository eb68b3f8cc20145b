package server

import (
	"context"

	"jobfence/jobs"
)

// Mutation switches for the fault-injection suite (chaos/): each breaks a
// mechanism a chaos checker guards, so the suite can show the checker
// catches it. Only mutation_on.go, compiled with -tags jobfence_mutation,
// sets them; in every other build they are nil and the branches that call
// them never run.
var (
	// mutationReleaseSlotAtDeadline releases the slot of a job the deadline
	// sweep just made UNKNOWN, as if the deadline proved the worker gone (I3).
	mutationReleaseSlotAtDeadline func(ctx context.Context, d *Dispatcher, t *term, jobID string)
	// mutationResendAfterTransportError sends the dispatch again, to another
	// agent, after a send whose outcome is unknown (I1).
	mutationResendAfterTransportError func(ctx context.Context, d *Dispatcher, j *jobs.Job, a *candidate, creds map[string]string, secret string)
)
