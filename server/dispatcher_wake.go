package server

import (
	"context"
	"time"

	"jobfence/internal/store"
	"jobfence/jobs"
)

// changeSource is the part of the store that announces read-model changes.
// A store without it (a test double) leaves the dispatcher on its interval.
type changeSource interface {
	Subscribe() (<-chan store.Change, func())
}

// subscribe opens the dispatcher's change feed, or returns a nil channel
// (which never fires) and a no-op.
func (d *Dispatcher) subscribe() (<-chan store.Change, func()) {
	if src, ok := d.store.(changeSource); ok {
		return src.Subscribe()
	}
	return nil, func() {}
}

// waitNext blocks until the next round is due: the interval's tick, or a
// read-model change after which a dispatch could succeed now (a job
// admitted while an agent has a free slot, a slot freed or an agent or
// setting changed while a job waits). Rounds stay on the interval for the
// sweeps; the change feed only removes the wait between an admission (or a
// freed slot) and its dispatch. With nothing changing nothing wakes it, and
// a change that cannot lead to a dispatch (the dispatcher's own writes, a
// result while nothing waits) costs a read-model lookup and no round.
//
// Under a stream of such changes (a burst of admissions) a woken round
// starts no sooner after the last one than that round took, so woken
// rounds never occupy the leader more than half the time; a single
// admission after a quiet spell is dispatched at once. lastRound is the
// duration of the round just finished. It returns false when ctx ends.
func (d *Dispatcher) waitNext(ctx context.Context, tick <-chan time.Time, changes <-chan store.Change, lastRound time.Duration) bool {
	calm := time.Now().Add(lastRound)
	var hold <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		case <-hold:
			return true
		case ch, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			if hold != nil || !d.dispatchable(ctx, ch) {
				continue
			}
			if wait := time.Until(calm); wait > 0 {
				timer := time.NewTimer(wait)
				defer timer.Stop()
				hold = timer.C
				continue
			}
			// Changes that arrived meanwhile are covered by this round.
			for drained := false; !drained; {
				select {
				case _, ok := <-changes:
					if !ok {
						drained = true
					}
				default:
					drained = true
				}
			}
			return true
		}
	}
}

// dispatchable reports whether ch may have made a dispatch possible.
func (d *Dispatcher) dispatchable(ctx context.Context, ch store.Change) bool {
	switch ch.Kind {
	case "job":
		j, err := d.store.Get(ctx, ch.ID)
		if err != nil || j.State != jobs.Pending {
			return false
		}
	case "slot", "agent", "settings", "resync":
		if len(d.store.ActiveJobs(func(j *jobs.Job) bool { return j.State == jobs.Pending })) == 0 {
			return false
		}
	default:
		return false
	}
	return !d.store.Settings().DispatchPaused && len(d.eligibleAgents()) > 0
}
