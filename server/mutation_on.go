//go:build jobfence_mutation

package server

import (
	"context"
	"os"
	"strings"

	"jobfence/jobs"
)

func init() {
	for _, m := range strings.Split(os.Getenv("JOBFENCE_MUTATION"), ",") {
		switch m {
		case "release-slot-at-deadline":
			mutationReleaseSlotAtDeadline = func(ctx context.Context, d *Dispatcher, t *term, jobID string) {
				j, err := d.store.Get(ctx, jobID)
				if err != nil || !j.Slot.Held {
					return
				}
				_, _ = d.store.RecordTerminationProof(ctx, t.l, j.ID, j.Revision, jobs.ProofAgentEpochReplaced)
			}
		case "resend-after-transport-error":
			mutationResendAfterTransportError = func(ctx context.Context, d *Dispatcher, j *jobs.Job, a *candidate, creds map[string]string, secret string) {
				for _, c := range d.eligibleAgents() {
					if c.view.ID == a.view.ID {
						continue
					}
					again := j.Clone()
					again.Dispatch.AgentID, again.Dispatch.AgentEpoch, again.Dispatch.AgentAddress = c.view.ID, c.view.Epoch, c.view.Address
					sctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
					_ = d.agents.Dispatch(sctx, c.view.Address, AgentDispatch{Job: again, Credentials: creds, Secret: secret})
					cancel()
					return
				}
			}
		}
	}
}
