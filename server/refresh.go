package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"jobfence/jobs"
)

// maxRefreshesInFlight bounds concurrent hook calls, so a slow hook cannot
// pile up goroutines round after round.
const maxRefreshesInFlight = 8

// refreshPhase starts the refresh a terminal job owes: REQUIRED at once,
// FAILED at most once per RefreshRetry. The hook call runs beside the
// rounds (it may take RefreshTimeout, far beyond a round); its DONE or
// FAILED lands when it returns. A refresh left RUNNING by a lost leader was
// downgraded by takeOver, so RUNNING here is always this term's own call.
func (d *Dispatcher) refreshPhase(ctx context.Context, t *term, now time.Time) error {
	due := d.store.ActiveJobs(func(j *jobs.Job) bool {
		if j.Resolved || j.Force != nil || (j.State != jobs.Committed && j.State != jobs.NotCommitted) {
			return false
		}
		switch j.RefreshState {
		case jobs.RefreshRequired:
			return true
		case jobs.RefreshFailed:
			return now.Sub(j.UpdatedAt) >= d.cfg.RefreshRetry
		}
		return false
	})
	if len(due) == 0 {
		return nil
	}
	sortByID(due)
	bctx, cancel := d.budget(ctx)
	defer cancel()
	for _, j := range due {
		if bctx.Err() != nil || !t.startRefresh(j.ID) {
			if bctx.Err() != nil {
				break
			}
			continue
		}
		running, err := d.store.MarkRefreshRunning(bctx, t.l, j.ID, j.Revision)
		if err != nil {
			t.endRefresh(j.ID)
			if fatal(ctx, err) {
				return err
			}
			d.log.Info("refresh_start_lost", "job_id", j.ID, "err", err)
			continue
		}
		d.log.Info("refresh_started", "job_id", j.ID, "from", string(j.RefreshState))
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer t.endRefresh(running.ID)
			problem := d.callHook(ctx, running)
			d.finishRefresh(ctx, t, running, problem)
		}()
	}
	return nil
}

// callHook POSTs the job to its refresh URL and returns "" on a 2xx answer,
// otherwise what went wrong in words (kept on the job as the refresh error).
func (d *Dispatcher) callHook(ctx context.Context, j *jobs.Job) string {
	if j.Spec.Refresh == nil || j.Spec.Refresh.URL == "" {
		return "the job owes a refresh but has no refresh url"
	}
	body, err := json.Marshal(j.Public())
	if err != nil {
		return "the job could not be encoded"
	}
	cctx, cancel := context.WithTimeout(ctx, d.cfg.RefreshTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodPost, j.Spec.Refresh.URL, bytes.NewReader(body))
	if err != nil {
		return "the refresh url is not usable"
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "jobfence-refresh")
	resp, err := d.refresh.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || cctx.Err() != nil {
			return "the refresh hook did not answer in time"
		}
		return "the refresh hook could not be reached"
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Sprintf("the refresh hook answered %d", resp.StatusCode)
	}
	return ""
}

// finishRefresh lands DONE or FAILED. A concurrent write (a late report, an
// epoch-sweep proof) can move the revision after markRefreshRunning, so a
// lost compare is re-read a few times; a refresh that still cannot land
// stays RUNNING until the next leader downgrades it.
func (d *Dispatcher) finishRefresh(ctx context.Context, t *term, j *jobs.Job, problem string) {
	for attempt := 0; attempt < 3; attempt++ {
		var err error
		if problem == "" {
			_, err = d.store.MarkRefreshDone(ctx, t.l, j.ID, j.Revision)
		} else {
			_, err = d.store.MarkRefreshFailed(ctx, t.l, j.ID, j.Revision, problem)
		}
		if err == nil {
			if problem == "" {
				d.log.Info("refresh_done", "job_id", j.ID)
			} else {
				d.log.Warn("refresh_failed", "job_id", j.ID, "problem", problem)
			}
			return
		}
		if fatal(ctx, err) || !errors.Is(err, jobs.ErrStale) {
			d.log.Warn("refresh_result_not_recorded", "job_id", j.ID, "err", err)
			return
		}
		fresh, gerr := d.store.Get(ctx, j.ID)
		if gerr != nil || fresh.RefreshState != jobs.RefreshRunning {
			return
		}
		j = fresh
	}
	d.log.Error("refresh_result_kept_losing_its_compare", "job_id", j.ID)
}

func (t *term) startRefresh(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, busy := t.refreshing[id]; busy || len(t.refreshing) >= maxRefreshesInFlight {
		return false
	}
	t.refreshing[id] = struct{}{}
	return true
}

func (t *term) endRefresh(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.refreshing, id)
}
