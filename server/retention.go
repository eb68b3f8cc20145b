package server

import (
	"context"
	"time"
)

// retentionPhase removes resolved jobs older than Retention, oldest first,
// in batches of RetentionBatch, at most once per RetentionEvery and within
// one phase budget. The store never removes an unresolved job, and with
// nothing old enough it writes nothing.
func (d *Dispatcher) retentionPhase(ctx context.Context, t *term, now time.Time) error {
	if !t.lastRetain.IsZero() && now.Sub(t.lastRetain) < d.cfg.RetentionEvery {
		return nil
	}
	t.lastRetain = now
	bctx, cancel := d.budget(ctx)
	defer cancel()
	cutoff := now.Add(-d.cfg.Retention)
	total := 0
	for bctx.Err() == nil {
		n, err := d.store.RemoveResolved(bctx, cutoff, d.cfg.RetentionBatch)
		total += n
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d.log.Warn("retention_failed", "err", err, "removed", total)
			break
		}
		if n < d.cfg.RetentionBatch {
			break
		}
	}
	if total > 0 {
		d.log.Info("resolved_jobs_removed", "removed", total, "older_than", cutoff)
	}
	return nil
}
