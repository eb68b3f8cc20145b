package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"jobfence/agent"
	"jobfence/internal/metrics"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// DispatchStore is the part of *store.Store the dispatcher uses. Reads come
// from the watch-fed read model; every write is one identity-compared
// transaction, and the leader-only ones also compare the election key.
type DispatchStore interface {
	// ActiveJobs scans only unresolved or slot-holding jobs, so an idle round
	// costs nothing per retained terminal job.
	ActiveJobs(filter func(*jobs.Job) bool) []*jobs.Job
	Get(ctx context.Context, id string) (*jobs.Job, error)
	Agents() []store.AgentView
	Settings() store.Settings
	MarkRunning(ctx context.Context, l store.Leadership, id string, rev int64, in store.MarkRunningInput) (*jobs.Job, error)
	Classify(ctx context.Context, l store.Leadership, id string, rev int64, code jobs.ResultCode, detail string) (*jobs.Job, error)
	RecordTerminationProof(ctx context.Context, l store.Leadership, id string, rev int64, proof jobs.Proof) (*jobs.Job, error)
	MarkRefreshRunning(ctx context.Context, l store.Leadership, id string, rev int64) (*jobs.Job, error)
	MarkRefreshDone(ctx context.Context, l store.Leadership, id string, rev int64) (*jobs.Job, error)
	MarkRefreshFailed(ctx context.Context, l store.Leadership, id string, rev int64, errText string) (*jobs.Job, error)
	DowngradeRefresh(ctx context.Context, l store.Leadership, id string, rev int64) (*jobs.Job, error)
	RemoveResolved(ctx context.Context, olderThan time.Time, batch int) (int, error)
}

// AgentClient is how the dispatcher reaches agents.
type AgentClient interface {
	// Dispatch sends one invocation. nil means enqueued exactly once; a
	// *RefusalError means the agent never enqueued it; any other error means
	// the outcome is unknown.
	Dispatch(ctx context.Context, address string, d AgentDispatch) error
	// Tombstone asks the agent to make sure the invocation never runs. It
	// returns the invocation's status ("tombstoned", "queued", "running",
	// "reported"), or a *RefusalError (epoch-mismatch) when the agent process
	// is not the one that got the dispatch.
	Tombstone(ctx context.Context, address, invocationID, epoch string) (string, error)
}

// AgentDispatch is one send: the job as re-read after markRunning, the
// resolved credential values and the secret the agent must echo.
type AgentDispatch struct {
	Job         *jobs.Job
	Credentials map[string]string
	Secret      string
}

// RefusalError is an agent's typed refusal (API.md slugs: epoch-mismatch,
// isolation-unverified, payload-too-large, deadline-unfundable, queue-full,
// invocation-tombstoned). Only Type is read.
type RefusalError struct {
	Type   string
	Status int
}

func (e *RefusalError) Error() string { return "agent refused: " + e.Type }

// Invocation statuses an agent reports.
const (
	InvocationTombstoned = agent.StatusTombstoned
	InvocationQueued     = agent.StatusQueued
	InvocationRunning    = agent.StatusRunning
	InvocationReported   = agent.StatusReported
	InvocationUnknown    = agent.StatusUnknown
)

// RefusalEpochMismatch is the refusal a restarted agent gives for an
// invocation addressed to its predecessor.
const RefusalEpochMismatch = agent.RefusalEpochMismatch

// DispatcherOptions wires a Dispatcher.
type DispatcherOptions struct {
	Config DispatchConfig
	Store  DispatchStore
	Agents AgentClient
	Logger *slog.Logger
	// Now defaults to time.Now.
	Now func() time.Time
	// RefreshClient calls refresh hooks; nil = a client with Config.RefreshTimeout.
	RefreshClient *http.Client
	// Phases receives each round phase's duration; nil records nothing.
	Phases PhaseRecorder
}

// Dispatcher is the leader's loop: deadline sweep, epoch sweep, refresh
// driver, dispatch, in that order every Config.Interval, plus retention. A
// read-model change that makes a dispatch possible (an admission, a freed
// slot) starts a round at once instead of at the next tick.
// One Dispatcher serves successive terms of leadership, never two at once.
//
// At most once rests on three things. markRunning commits the dispatch
// identity (a fresh invocation id, the secret's hash, the agent epoch read
// once) before the only send, and a job is never sent from any other
// state, so no path resends. A send whose fate is unknown is settled only by
// the agent's tombstone (proof it never ran) or by the deadline (UNKNOWN),
// never by sending again. And every write compares the election key, so a
// deposed leader changes nothing; a send it may still make either reaches
// the agent before its successor's tombstone query (which then waits for
// the report) or after it (and is refused as invocation-tombstoned).
type Dispatcher struct {
	cfg     DispatchConfig
	store   DispatchStore
	agents  AgentClient
	log     *slog.Logger
	now     func() time.Time
	refresh *http.Client
	creds   *credentialProfiles
	phases  PhaseRecorder

	// afterMarkRunning, when set, runs between a committed markRunning and
	// the re-read; returning true abandons the send as a crash would. Only
	// tests set it.
	afterMarkRunning func(jobID string) bool

	runMu sync.Mutex // one term at a time

	mu      sync.Mutex
	blocked map[string]string // job id -> why it stays PENDING
}

// testHookAfterMarkRunning is installed by a build-tagged file in test
// binaries only; production builds leave it nil.
var testHookAfterMarkRunning func(jobID string) bool

// NewDispatcher checks the options.
func NewDispatcher(o DispatcherOptions) (*Dispatcher, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if o.Store == nil || o.Agents == nil {
		return nil, errors.New("dispatcher needs a store and an agent client")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RefreshClient == nil {
		o.RefreshClient = &http.Client{Timeout: o.Config.RefreshTimeout}
	}
	return &Dispatcher{
		cfg:              o.Config,
		store:            o.Store,
		agents:           o.Agents,
		log:              o.Logger,
		now:              o.Now,
		refresh:          o.RefreshClient,
		phases:           o.Phases,
		creds:            newCredentialProfiles(o.Config.CredentialsFile, o.Logger),
		afterMarkRunning: testHookAfterMarkRunning,
		blocked:          map[string]string{},
	}, nil
}

// BlockedReason says why a PENDING job is not being dispatched, or "" when
// nothing blocks it. Only the leader's dispatcher knows; followers answer "".
func (d *Dispatcher) BlockedReason(jobID string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.blocked[jobID]
}

// BlockedReasons is a copy of every current blocked reason.
func (d *Dispatcher) BlockedReasons() map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]string, len(d.blocked))
	for k, v := range d.blocked {
		out[k] = v
	}
	return out
}

// term is what one leadership term keeps in memory. Nothing here is needed
// for safety: a new leader rebuilds it from the read model.
type term struct {
	l store.Leadership
	// unsure holds RUNNING jobs whose send may or may not have arrived; later
	// rounds ask the agent to tombstone them.
	unsure map[string]struct{}
	// refreshing holds jobs whose hook call is in flight.
	refreshing map[string]struct{}
	mu         sync.Mutex
	wg         sync.WaitGroup
	lastRetain time.Time
}

// Run drives rounds while ctx lives (the caller cancels it when leadership
// is lost). It returns jobs.ErrNotLeader when a write shows the election
// key is gone, and nil when ctx ends.
func (d *Dispatcher) Run(ctx context.Context, l store.Leadership) error {
	d.runMu.Lock()
	defer d.runMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	t := &term{l: l, unsure: map[string]struct{}{}, refreshing: map[string]struct{}{}}
	defer func() {
		cancel()
		t.wg.Wait()
		d.refresh.CloseIdleConnections()
		// A follower does not know why jobs wait; it shows no stale reason.
		for id := range d.BlockedReasons() {
			d.setBlocked(id, "")
		}
	}()
	d.log.Info("dispatcher_started", "leader", l.ID, "election_revision", l.Rev)
	if err := d.takeOver(ctx, t); err != nil {
		return d.endTerm(ctx, err)
	}
	changes, unsubscribe := d.subscribe()
	defer unsubscribe()
	tick := time.NewTicker(d.cfg.Interval)
	defer tick.Stop()
	for {
		start := time.Now()
		if err := d.round(ctx, t); err != nil {
			return d.endTerm(ctx, err)
		}
		if !d.waitNext(ctx, tick.C, changes, time.Since(start)) {
			return d.endTerm(ctx, nil)
		}
	}
}

func (d *Dispatcher) endTerm(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, jobs.ErrNotLeader) {
		err = nil
	}
	d.log.Info("dispatcher_stopped", "err", err)
	return err
}

// takeOver settles what a previous leader may have left in flight: a
// refresh left RUNNING goes back to REQUIRED (its driver is gone), and every
// RUNNING job without a report is asked about through the tombstone
// endpoint, exactly as after a transport error.
func (d *Dispatcher) takeOver(ctx context.Context, t *term) error {
	for _, j := range d.store.ActiveJobs(func(j *jobs.Job) bool {
		return j.State.Terminal() && j.RefreshState == jobs.RefreshRunning
	}) {
		if _, err := d.store.DowngradeRefresh(ctx, t.l, j.ID, j.Revision); err != nil {
			if errors.Is(err, jobs.ErrNotLeader) || ctx.Err() != nil {
				return err
			}
			d.log.Warn("refresh_downgrade_failed", "job_id", j.ID, "err", err)
			continue
		}
		d.log.Info("refresh_downgraded", "job_id", j.ID)
	}
	for _, j := range d.store.ActiveJobs(func(j *jobs.Job) bool {
		return j.State == jobs.Running && j.Dispatch != nil
	}) {
		t.unsure[j.ID] = struct{}{}
	}
	return nil
}

// round runs the phases in their fixed order. Only leadership loss stops
// it; a failing job is logged and left for the next round.
func (d *Dispatcher) round(ctx context.Context, t *term) error {
	now := d.now()
	phases := []struct {
		name string
		run  func() error
	}{
		{metrics.PhaseDeadline, func() error { return d.deadlineSweep(ctx, t, now) }},
		{metrics.PhaseEpoch, func() error { return d.epochSweep(ctx, t) }},
		{metrics.PhaseRefresh, func() error { return d.refreshPhase(ctx, t, now) }},
		{metrics.PhaseSettle, func() error { return d.settlePhase(ctx, t) }},
		{metrics.PhaseDispatch, func() error { return d.dispatchPhase(ctx, t) }},
		{metrics.PhaseRetention, func() error { return d.retentionPhase(ctx, t, now) }},
	}
	for _, p := range phases {
		start := time.Now()
		err := p.run()
		observePhase(d.phases, p.name, start)
		if err != nil {
			return err
		}
	}
	return nil
}

// fatal reports whether err ends the term.
func fatal(ctx context.Context, err error) bool {
	return errors.Is(err, jobs.ErrNotLeader) || ctx.Err() != nil
}

func (d *Dispatcher) budget(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.cfg.PhaseBudget)
}

// deadlineSweep: a RUNNING job past its deadline has no trusted result and
// becomes UNKNOWN. The deadline bounds the wait; it proves nothing about the
// process, so slot, fence and quota stay held.
func (d *Dispatcher) deadlineSweep(ctx context.Context, t *term, now time.Time) error {
	expired := d.store.ActiveJobs(func(j *jobs.Job) bool {
		return j.State == jobs.Running && j.Dispatch != nil && now.After(j.Dispatch.Deadline)
	})
	if len(expired) == 0 {
		return nil
	}
	sortByID(expired)
	bctx, cancel := d.budget(ctx)
	defer cancel()
	for _, j := range expired {
		if bctx.Err() != nil {
			break
		}
		_, err := d.store.Classify(bctx, t.l, j.ID, j.Revision, jobs.CodeNoTrustedResult,
			"the deadline passed without a trusted result")
		switch {
		case err == nil:
			t.forget(j.ID)
			if mutationReleaseSlotAtDeadline != nil {
				mutationReleaseSlotAtDeadline(bctx, d, t, j.ID)
			}
			d.log.Warn("job_unknown_at_deadline", "job_id", j.ID, "agent_id", j.Dispatch.AgentID,
				"invocation_id", j.Dispatch.InvocationID)
		case fatal(ctx, err):
			return err
		default:
			// A report or another sweep won the compare; the next round sees it.
			d.log.Info("deadline_sweep_skipped_job", "job_id", j.ID, "err", err)
		}
	}
	return nil
}

// epochSweep releases a held slot when the agent that got the dispatch now
// announces another epoch: its startup sweep emptied every domain of the
// old process before the announcement. A missing agent record or a stale
// heartbeat proves nothing and releases nothing. The state is not touched.
func (d *Dispatcher) epochSweep(ctx context.Context, t *term) error {
	epochs := map[string]string{}
	for _, a := range d.store.Agents() {
		epochs[a.ID] = a.Epoch
	}
	replaced := d.store.ActiveJobs(func(j *jobs.Job) bool {
		if !j.Slot.Held || j.Dispatch == nil {
			return false
		}
		e, ok := epochs[j.Dispatch.AgentID]
		return ok && e != "" && e != j.Dispatch.AgentEpoch
	})
	if len(replaced) == 0 {
		return nil
	}
	sortByID(replaced)
	bctx, cancel := d.budget(ctx)
	defer cancel()
	for _, j := range replaced {
		if bctx.Err() != nil {
			break
		}
		_, err := d.store.RecordTerminationProof(bctx, t.l, j.ID, j.Revision, jobs.ProofAgentEpochReplaced)
		switch {
		case err == nil:
			d.log.Info("slot_released_by_epoch_change", "job_id", j.ID, "agent_id", j.Dispatch.AgentID,
				"old_epoch", j.Dispatch.AgentEpoch, "new_epoch", epochs[j.Dispatch.AgentID])
		case fatal(ctx, err):
			return err
		default:
			d.log.Info("epoch_sweep_skipped_job", "job_id", j.ID, "err", err)
		}
	}
	return nil
}

// settlePhase asks agents about RUNNING jobs whose send may not have
// arrived. A tombstone proves the invocation never ran and never will; a
// live status means a report will come; an agent that answers with another
// epoch or not at all leaves the job to the epoch sweep and the deadline.
func (d *Dispatcher) settlePhase(ctx context.Context, t *term) error {
	ids := t.unsureIDs()
	if len(ids) == 0 {
		return nil
	}
	bctx, cancel := d.budget(ctx)
	defer cancel()
	for _, id := range ids {
		if bctx.Err() != nil {
			break
		}
		j, err := d.store.Get(bctx, id)
		if err != nil || j.State != jobs.Running || j.Dispatch == nil {
			t.forget(id)
			continue
		}
		addr := j.Dispatch.AgentAddress
		if addr == "" {
			addr = d.agentAddress(j.Dispatch.AgentID)
		}
		qctx, qcancel := context.WithTimeout(bctx, d.cfg.QueryTimeout)
		status, err := d.agents.Tombstone(qctx, addr, j.Dispatch.InvocationID, j.Dispatch.AgentEpoch)
		qcancel()
		var refusal *RefusalError
		switch {
		case errors.As(err, &refusal):
			t.forget(id)
			d.log.Info("tombstone_refused", "job_id", id, "agent_id", j.Dispatch.AgentID,
				"invocation_id", j.Dispatch.InvocationID, "refusal", refusal.Type)
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			d.log.Info("tombstone_query_failed", "job_id", id, "agent_id", j.Dispatch.AgentID,
				"invocation_id", j.Dispatch.InvocationID, "err", err)
		case status == InvocationTombstoned:
			if err := d.classifyRunning(bctx, t, j, jobs.CodeTombstoned,
				"the agent confirmed the invocation never arrived and never will"); err != nil {
				return err
			}
			t.forget(id)
		case status == InvocationQueued || status == InvocationRunning || status == InvocationReported:
			t.forget(id)
			d.log.Info("invocation_arrived", "job_id", id, "invocation_id", j.Dispatch.InvocationID, "status", status)
		default:
			d.log.Warn("tombstone_answer_not_understood", "job_id", id, "status", status)
		}
	}
	return nil
}

// agentAddress is the registered address of an agent, for records that
// did not keep the one they were sent to.
func (d *Dispatcher) agentAddress(id string) string {
	for _, a := range d.store.Agents() {
		if a.ID == id {
			return a.Address
		}
	}
	return ""
}

// classifyRunning applies a server-side classification to the dispatch in
// j. A lost compare is re-read a few times: a termination proof or a
// refresh of the read model may have moved the revision, while the dispatch
// identity stayed the same.
func (d *Dispatcher) classifyRunning(ctx context.Context, t *term, j *jobs.Job, code jobs.ResultCode, detail string) error {
	inv := j.Dispatch.InvocationID
	for attempt := 0; attempt < 3; attempt++ {
		_, err := d.store.Classify(ctx, t.l, j.ID, j.Revision, code, detail)
		if err == nil {
			d.log.Info("job_classified", "job_id", j.ID, "invocation_id", inv, "code", string(code))
			return nil
		}
		if fatal(ctx, err) {
			return err
		}
		if !errors.Is(err, jobs.ErrStale) {
			d.log.Warn("classification_failed", "job_id", j.ID, "code", string(code), "err", err)
			return nil
		}
		fresh, gerr := d.store.Get(ctx, j.ID)
		if gerr != nil || fresh.State != jobs.Running || fresh.Dispatch == nil || fresh.Dispatch.InvocationID != inv {
			return nil
		}
		j = fresh
	}
	d.log.Warn("classification_kept_losing_its_compare", "job_id", j.ID, "code", string(code))
	return nil
}

// dispatchPhase sends PENDING jobs in id order, at most PerRound per round.
func (d *Dispatcher) dispatchPhase(ctx context.Context, t *term) error {
	pending := d.store.ActiveJobs(func(j *jobs.Job) bool { return j.State == jobs.Pending })
	d.pruneBlocked(pending)
	if len(pending) == 0 || d.store.Settings().DispatchPaused {
		return nil
	}
	sortByID(pending)
	d.creds.refresh()
	agents := d.eligibleAgents()
	bctx, cancel := d.budget(ctx)
	defer cancel()
	attempted := 0
	for _, j := range pending {
		if attempted >= d.cfg.PerRound || bctx.Err() != nil {
			break
		}
		creds, err := d.creds.resolve(j.Spec.Credentials)
		if err != nil {
			d.setBlocked(j.ID, err.Error())
			continue
		}
		a := pickAgent(agents)
		if a == nil {
			d.setBlocked(j.ID, "no live agent with verified isolation and a free slot")
			continue
		}
		d.setBlocked(j.ID, "")
		attempted++
		if err := d.dispatchOne(ctx, t, j, a, creds); err != nil {
			return err
		}
	}
	return nil
}

type candidate struct {
	view store.AgentView
	held int
}

func (d *Dispatcher) eligibleAgents() []*candidate {
	var out []*candidate
	for _, a := range d.store.Agents() {
		if a.Live && a.Isolation.Verified && a.Epoch != "" && a.Address != "" && a.SlotsHeld < a.Capacity {
			out = append(out, &candidate{view: a, held: a.SlotsHeld})
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].view.ID < out[k].view.ID })
	return out
}

// pickAgent takes the agent with the most free slots (ties by id), so
// load spreads and the choice is deterministic.
func pickAgent(cands []*candidate) *candidate {
	var best *candidate
	for _, c := range cands {
		if c.held >= c.view.Capacity {
			continue
		}
		if best == nil || c.view.Capacity-c.held > best.view.Capacity-best.held {
			best = c
		}
	}
	return best
}

// dispatchOne is the durable-before-send boundary: markRunning commits the
// identity, the record is re-read, and only then is the one send made. No
// path here sends twice or sends with an identity that did not commit.
func (d *Dispatcher) dispatchOne(ctx context.Context, t *term, j *jobs.Job, a *candidate, creds map[string]string) error {
	secret, hash, err := newSecret()
	if err != nil {
		return fmt.Errorf("dispatch secret: %w", err)
	}
	invID, err := uuid.NewRandom()
	if err != nil {
		return fmt.Errorf("invocation id: %w", err)
	}
	inv := invID.String()
	// The epoch is read once, from the candidate, so the record and the wire
	// carry the same value even if a heartbeat lands in between.
	epoch := a.view.Epoch
	if j.Spec.Limits.DeadlineSeconds <= 0 {
		d.setBlocked(j.ID, "the job has no deadline")
		return nil
	}
	deadline := d.now().Add(time.Duration(j.Spec.Limits.DeadlineSeconds) * time.Second)
	// Once started, the commit runs to its answer even if the term ends
	// meanwhile: the election compare decides whether it lands, and a
	// commit that landed is then sent (below). Cut off by the term's end,
	// the write could land unseen and leave its job to the tombstone.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.SendTimeout)
	defer mcancel()
	_, err = d.store.MarkRunning(mctx, t.l, j.ID, j.Revision, store.MarkRunningInput{
		AgentID:      a.view.ID,
		AgentEpoch:   epoch,
		AgentAddress: a.view.Address,
		InvocationID: inv,
		SecretHash:   hash,
		Deadline:     deadline,
	})
	switch {
	case err == nil:
	case fatal(ctx, err):
		return err
	case errors.Is(err, jobs.ErrStale) || errors.Is(err, jobs.ErrInvalidTransition):
		// Nothing was written; the next round builds a fresh identity.
		d.log.Info("mark_running_lost", "job_id", j.ID, "err", err)
		return nil
	default:
		// The commit's fate is unknown (etcd may have applied it before the
		// error). If it landed, the job is RUNNING under an identity nobody
		// received: the tombstone proves that, where the deadline alone
		// would leave an UNKNOWN. Nothing is sent.
		t.markUnsure(j.ID)
		d.log.Warn("mark_running_outcome_unknown", "job_id", j.ID, "invocation_id", inv, "err", err)
		return nil
	}
	a.held++
	if d.afterMarkRunning != nil && d.afterMarkRunning(j.ID) {
		return nil
	}
	// The dispatch is committed: it is sent even if the term ends now (a
	// graceful stop, a lost session). Abandoned, it would leave a RUNNING job
	// whose invocation nobody received, which the next leader can only settle
	// as NOT_COMMITTED through the tombstone. Sending after the term is safe:
	// the record was written under the election compare, and the agent
	// refuses an invocation id it has tombstoned. The send stays bounded by
	// SendTimeout, so a stopping leader resigns at most that much later.
	sendCtx := context.WithoutCancel(ctx)
	fresh, err := d.store.Get(sendCtx, j.ID)
	if err != nil || fresh.State != jobs.Running || fresh.Dispatch == nil ||
		fresh.Dispatch.InvocationID != inv || fresh.Dispatch.AgentEpoch != epoch {
		// No send. The job is RUNNING under an identity nobody received, so
		// the tombstone settles it (or the deadline does).
		t.markUnsure(j.ID)
		d.log.Warn("recheck_before_send_failed", "job_id", j.ID, "invocation_id", inv, "err", err)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return nil
	}
	sctx, cancel := context.WithTimeout(sendCtx, d.cfg.SendTimeout)
	err = d.agents.Dispatch(sctx, a.view.Address, AgentDispatch{Job: fresh, Credentials: creds, Secret: secret})
	cancel()
	var refusal *RefusalError
	switch {
	case err == nil:
		d.log.Info("job_dispatched", "job_id", j.ID, "agent_id", a.view.ID, "invocation_id", inv,
			"dispatch_revision", fresh.Dispatch.DispatchRevision)
		return nil
	case errors.As(err, &refusal):
		d.log.Info("dispatch_refused", "job_id", j.ID, "agent_id", a.view.ID, "invocation_id", inv, "refusal", refusal.Type)
		return d.classifyRunning(ctx, t, fresh, jobs.CodeRefusedByAgent, refusal.Type)
	default:
		t.markUnsure(j.ID)
		if mutationResendAfterTransportError != nil {
			mutationResendAfterTransportError(ctx, d, fresh, a, creds, secret)
		}
		d.log.Warn("dispatch_outcome_unknown", "job_id", j.ID, "agent_id", a.view.ID, "invocation_id", inv, "err", err)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return nil
	}
}

// newSecret returns a 128-bit secret in hex and the SHA-256 (hex) of that
// hex text, which is all etcd ever holds.
func newSecret() (secret, hash string, err error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	secret = hex.EncodeToString(b[:])
	return secret, jobs.HashSecret(secret), nil
}

// blockedReasonSink is the read-model seam that shows a blocked reason on
// the job itself (jobs.Job.BlockedReason) without writing etcd.
type blockedReasonSink interface {
	SetBlockedReason(id, reason string)
}

func (d *Dispatcher) setBlocked(id, reason string) {
	d.mu.Lock()
	changed := d.blocked[id] != reason
	if reason == "" {
		delete(d.blocked, id)
	} else {
		d.blocked[id] = reason
	}
	d.mu.Unlock()
	if changed && reason != "" {
		d.log.Info("job_blocked", "job_id", id, "reason", reason)
	}
	// Set every round, not only on change: a re-list of the read model
	// replaces the job objects the reason was shown on.
	if sink, ok := d.store.(blockedReasonSink); ok && (changed || reason != "") {
		sink.SetBlockedReason(id, reason)
	}
}

func (d *Dispatcher) pruneBlocked(pending []*jobs.Job) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.blocked) == 0 {
		return
	}
	live := make(map[string]bool, len(pending))
	for _, j := range pending {
		live[j.ID] = true
	}
	sink, _ := d.store.(blockedReasonSink)
	for id := range d.blocked {
		if !live[id] {
			delete(d.blocked, id)
			if sink != nil {
				sink.SetBlockedReason(id, "")
			}
		}
	}
}

func (t *term) markUnsure(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.unsure[id] = struct{}{}
}

func (t *term) forget(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.unsure, id)
}

func (t *term) unsureIDs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := make([]string, 0, len(t.unsure))
	for id := range t.unsure {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func sortByID(js []*jobs.Job) {
	sort.Slice(js, func(i, k int) bool { return js[i].ID < js[k].ID })
}
