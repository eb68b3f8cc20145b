package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"jobfence/isolation"
	"jobfence/jobs"
)

// executor takes dispatches off the queue until ctx ends. runCtx ends only
// after ctx, when Run shuts down: it starts the ladder of a running domain.
func (a *Agent) executor(ctx, runCtx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case inv := <-a.queue:
			a.m.SetQueueDepth(len(a.queue))
			a.m.AddInflightWorkers(1)
			a.execute(ctx, runCtx, inv)
			a.m.AddInflightWorkers(-1)
		}
	}
}

func (a *Agent) execute(ctx, runCtx context.Context, inv *invocation) {
	a.mu.Lock()
	req := *inv.req
	inv.status = StatusRunning
	a.mu.Unlock()
	log := a.log.With("job_id", req.JobID, "invocation_id", req.InvocationID)

	env := envelope(req)
	if left := req.Deadline.Sub(a.cfg.Now()); left < a.cfg.reservation()+a.cfg.MinRunWindow {
		// The budget was spent in the queue: never started, so nothing ran.
		env.Code, env.Phase, env.Proof = jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched
		env.Detail = "the run budget was spent in the queue"
	} else if ctx.Err() != nil || runCtx.Err() != nil {
		env.Code, env.Phase, env.Proof = jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched
		env.Detail = "the agent shut down before the run started"
	} else {
		spec := a.isolationSpec(req)
		res, err := a.host.Run(runCtx, spec)
		a.classify(&env, req, res, err)
	}
	env.Detail = sanitize(env.Detail, req.Credentials)
	a.m.Outcome(string(env.Code))
	log.Info("invocation finished", "code", string(env.Code), "phase", string(env.Phase), "proof", string(env.Proof))
	a.report(ctx, inv, req, env, log)
	if a.cfg.ReapOrphans {
		// Orphans adopted from the domain are dead already (it was seen
		// empty): only their zombies wait, and they do not hold up the report.
		isolation.ReapOrphans()
	}
}

func (a *Agent) neverStarted(ctx context.Context, inv *invocation, detail string) {
	a.mu.Lock()
	req := *inv.req
	inv.status = StatusRunning
	a.mu.Unlock()
	env := envelope(req)
	env.Code, env.Phase, env.Proof, env.Detail = jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched, detail
	a.m.Outcome(string(env.Code))
	a.report(ctx, inv, req, env, a.log.With("job_id", req.JobID, "invocation_id", req.InvocationID))
}

func envelope(req DispatchRequest) jobs.ResultEnvelope {
	return jobs.ResultEnvelope{
		DispatchRevision: req.DispatchRevision,
		InvocationID:     req.InvocationID,
		AgentEpoch:       req.AgentEpoch,
		Secret:           req.Secret,
		Proof:            jobs.ProofNone,
	}
}

func (a *Agent) isolationSpec(req DispatchRequest) isolation.Spec {
	env := make([]string, 0, len(req.Spec.Env)+len(req.Credentials))
	for k, v := range req.Spec.Env {
		if _, shadowed := req.Credentials[k]; !shadowed {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range req.Credentials {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	mem, pids := req.Spec.Limits.MemoryBytes, req.Spec.Limits.Pids
	if mem == 0 {
		mem = a.cfg.DefaultMemory
	}
	if pids == 0 {
		pids = a.cfg.DefaultPids
	}
	return isolation.Spec{
		Name:        req.InvocationID,
		Argv:        req.Spec.Command,
		Env:         env,
		Dir:         req.Spec.WorkingDir,
		MemoryBytes: mem,
		Pids:        pids,
		// The ladder starts early enough that TERM, the grace, the kill and
		// the reap all end skew before the deadline the server holds.
		TermAt:    req.Deadline.Add(-a.cfg.reservation()),
		Grace:     a.cfg.TermGrace,
		ReapBound: a.cfg.ReapBound,
	}
}

// classify maps what happened to the domain onto DESIGN.md's outcome table.
func (a *Agent) classify(env *jobs.ResultEnvelope, req DispatchRequest, res isolation.Result, err error) {
	var setup *isolation.SetupError
	switch {
	case errors.As(err, &setup), errors.Is(err, isolation.ErrUnverified):
		env.Code, env.Phase, env.Proof = jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched
		env.Detail = err.Error()
		return
	case err != nil:
		env.Code, env.Phase = jobs.CodeNeverLaunched, jobs.PhasePreInvocationRejected
		env.Detail = err.Error()
		return
	}
	if !res.Launched {
		// Refused before the command's first instruction: it never ran.
		env.Code, env.Phase, env.Proof = jobs.CodePreInvocationRejected, jobs.PhasePreInvocationRejected, jobs.ProofNeverLaunched
		env.Detail = res.Rejection
		return
	}
	if res.ReapProof() {
		env.Proof = jobs.ProofChildReaped
	}
	var notes []string
	if res.Leftovers {
		notes = append(notes, "leftover processes were killed after the command exited")
	}
	if res.PidsLimitHit {
		notes = append(notes, "the pids limit was reached")
	}
	if res.Breach {
		notes = append(notes, "the worker escaped its domain")
	}
	if !res.ReapProof() && !res.Breach {
		notes = append(notes, "the domain did not empty within the reap bound")
	}
	code := res.ExitCode
	switch {
	case res.TermDeadline:
		env.Code, env.Phase = jobs.CodeKilledDeadline, jobs.PhaseIndeterminateAfterLaunch
		env.Detail = "the run reached its deadline and was stopped by the kill ladder"
	case res.OOMKilled:
		env.Code, env.Phase = jobs.CodeKilledOOM, jobs.PhaseIndeterminateAfterLaunch
		env.Detail = "the domain exceeded its memory limit and was OOM-killed"
	case res.Signal != 0:
		env.Code, env.Phase = jobs.CodeKilledSignal, jobs.PhaseIndeterminateAfterLaunch
		env.Signal = strings.ToUpper(unixSignalName(int(res.Signal)))
		env.Detail = "the command was ended by " + env.Signal
		if res.Cancelled {
			env.Detail += " when the agent shut down"
		}
	case slices.Contains(req.Spec.Outcome.CommittedExitCodes, code) || (req.Spec.Outcome.CommittedExitCodes == nil && code == 0):
		env.Code, env.Phase, env.ExitCode = jobs.CodeExitCommitted, jobs.PhaseNativeReturn, &code
		env.Detail = fmt.Sprintf("exit code %d", code)
	case slices.Contains(req.Spec.Outcome.NotCommittedExitCodes, code):
		env.Code, env.Phase, env.ExitCode = jobs.CodeExitNotCommitted, jobs.PhaseNativeReturn, &code
		env.Detail = fmt.Sprintf("exit code %d", code)
	default:
		env.Code, env.Phase, env.ExitCode = jobs.CodeExitUnclassified, jobs.PhaseNativeReturn, &code
		env.Detail = fmt.Sprintf("exit code %d is in neither outcome set", code)
	}
	if res.Signal != 0 && env.Signal == "" {
		env.Signal = strings.ToUpper(unixSignalName(int(res.Signal)))
	}
	if len(notes) > 0 {
		env.Detail += "; " + strings.Join(notes, "; ")
	}
}

// sanitize bounds the detail, keeps it printable, and removes any credential
// value that might have found its way into it.
func sanitize(s string, creds map[string]string) string {
	for _, v := range creds {
		if len(v) >= 4 {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
	if len(s) > maxDetail {
		s = s[:maxDetail]
		for len(s) > 0 && !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}

// report POSTs the envelope until the server acknowledges it (200), declares
// it stale (409) or forbidden (403), or the invocation record expires. The
// envelope is idempotent by identity, so repeats are safe.
func (a *Agent) report(ctx context.Context, inv *invocation, req DispatchRequest, env jobs.ResultEnvelope, log *slog.Logger) {
	expires := req.Deadline.Add(a.cfg.Retention)
	// A shutting-down agent still tries briefly: the domain is gone, and the
	// report is what turns that into a released slot.
	rctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
	}
	wait := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		status, err := a.send(rctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(req.JobID)+"/result", env)
		switch {
		case err == nil && status == http.StatusOK:
			a.setStatus(inv, StatusReported)
			log.Info("result reported", "code", string(env.Code), "attempts", attempt)
			return
		case err == nil && (status == http.StatusConflict || status == http.StatusForbidden):
			a.setStatus(inv, StatusReported)
			log.Warn("result not applied by the server", "status", status, "code", string(env.Code))
			return
		}
		a.m.ReportFailure()
		log.Warn("result report failed", "status", status, "error", errString(err), "attempt", attempt)
		if !a.cfg.Now().Before(expires) {
			log.Warn("invocation record expired before the report was acknowledged")
			return
		}
		d := wait/2 + rand.N(wait/2+1)
		select {
		case <-rctx.Done():
			return
		case <-time.After(d):
		}
		wait = min(wait*2, 5*time.Second)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
