package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/jobs"
)

// Store is the only code that reads or writes jobfence's etcd data. Writes
// are one transaction per transition; reads come from the watch-fed view,
// which Run keeps and every write waits for.
type Store struct {
	cfg Config
	cli *clientv3.Client
	k   keys
	log *slog.Logger
	now func() time.Time

	mu      sync.RWMutex
	v       *view
	rev     int64
	latest  int64
	ready   bool
	relists atomic.Uint64
	watcher atomic.Pointer[clientv3.Watcher]

	subsMu sync.Mutex
	subs   map[*subscriber]struct{}

	// reserved are quota token keys an admission of this replica is trying,
	// so concurrent admissions here never pick the same token.
	resMu    sync.Mutex
	reserved map[string]struct{}
	resFreed chan struct{}

	blocked blockedReasons

	attempts, admissions atomic.Uint64
}

// New checks cfg and returns a Store. Run must be running to feed its view:
// every write waits until the view has seen it.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.QuotaGlobal == 0 {
		cfg.QuotaGlobal = 10000
	}
	if cfg.QuotaPerScope == 0 {
		cfg.QuotaPerScope = 1000
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.AgentLiveFor == 0 {
		cfg.AgentLiveFor = 15 * time.Second
	}
	if cfg.ReplicaID == "" {
		cfg.ReplicaID = "replica"
	}
	return &Store{
		cfg: cfg, cli: cfg.Client, k: keys{prefix: cfg.Prefix}, log: cfg.Logger,
		now:      func() time.Time { return cfg.Now().UTC() },
		v:        newView(),
		subs:     map[*subscriber]struct{}{},
		reserved: map[string]struct{}{}, resFreed: make(chan struct{}),
	}, nil
}

// Validate reports every problem of cfg at once.
func (c Config) Validate() error {
	var errs []error
	if c.Client == nil {
		errs = append(errs, errors.New("store: Client is required"))
	}
	if c.Prefix == "" || !strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/") {
		errs = append(errs, errors.New("store: Prefix must start and must not end with /"))
	}
	if c.QuotaGlobal < 0 || c.QuotaPerScope < 0 {
		errs = append(errs, errors.New("store: quotas must not be negative"))
	}
	return errors.Join(errs...)
}

// ElectionPrefix is the key prefix leader election uses under cfg.Prefix.
func ElectionPrefix(prefix string) string { return keys{prefix: prefix}.election() }

// AdmitAttempts counts admission transactions issued and admissions won, for
// the attempts-per-admission figure.
func (s *Store) AdmitAttempts() (attempts, admissions uint64) {
	return s.attempts.Load(), s.admissions.Load()
}

// translate turns etcd errors into ours at the boundary.
func translate(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return fmt.Errorf("etcd: %s", ee.Error())
	}
	return fmt.Errorf("etcd: %s", err.Error())
}

// errConflict is a lost ModRevision compare inside the store; callers that
// may re-evaluate do so, others report jobs.ErrStale.
var errConflict = errors.New("record changed")

// load reads one record straight from etcd (not the view), so a transition
// starts from the committed truth.
func (s *Store) load(ctx context.Context, id string) (*jobs.Job, error) {
	resp, err := s.cli.Get(ctx, s.k.job(id))
	if err != nil {
		return nil, translate(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, jobs.ErrNotFound
	}
	kv := resp.Kvs[0]
	j, err := decodeJob(id, kv.Value, kv.ModRevision)
	if err != nil {
		return nil, &jobs.FailClosedError{JobID: id}
	}
	return j, nil
}

// guardedDelete deletes key only while it still names jobID, so releasing
// never removes another job's fence, token or slot.
func guardedDelete(key, jobID string) clientv3.Op {
	return clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(key), "=", jobID)},
		[]clientv3.Op{clientv3.OpDelete(key)}, nil)
}

// commit writes a transition: the record compared at old.Revision (and the
// election key for leader writes) together with the keys its effects take or
// release. It answers after the view reached the write.
func (s *Store) commit(ctx context.Context, l *Leadership, old, n *jobs.Job, eff jobs.Effects) (*jobs.Job, error) {
	jobKey := s.k.job(n.ID)
	val, err := encodeJob(n)
	if err != nil {
		return nil, err
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(jobKey), "=", old.Revision)}
	if l != nil && !mutationSkipLeaderCompare {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(l.Key), "=", l.Rev))
	}
	ops := []clientv3.Op{clientv3.OpPut(jobKey, string(val))}
	if eff.ReleaseFence {
		ops = append(ops, guardedDelete(s.k.fence(old.Target.Key()), n.ID))
	}
	if eff.ReleaseQuota {
		if g, sc, err := parseQuotaToken(old.QuotaToken); err == nil {
			ops = append(ops, guardedDelete(s.k.quotaGlobal(g), n.ID), guardedDelete(s.k.quotaScope(old.Target.Scope, sc), n.ID))
		}
	}
	if eff.TakeSlot {
		slotKey := s.k.slot(eff.SlotAgent, n.ID)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(slotKey), "=", 0))
		ops = append(ops, clientv3.OpPut(slotKey, n.ID))
	}
	if eff.ReleaseSlot {
		ops = append(ops, guardedDelete(s.k.slot(eff.SlotAgent, n.ID), n.ID))
	}
	var elseOps []clientv3.Op
	if l != nil {
		elseOps = append(elseOps, clientv3.OpGet(l.Key))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(elseOps...).Commit()
	if err != nil {
		return nil, translate(err)
	}
	if !resp.Succeeded {
		if l != nil {
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != l.Rev {
				return nil, jobs.ErrNotLeader
			}
		}
		return nil, errConflict
	}
	rev := resp.Header.Revision
	if err := s.WaitSynced(ctx, rev); err != nil {
		return nil, err
	}
	if len(n.History) > 0 {
		s.transitioned(n.History[len(n.History)-1].Event)
	}
	return decodeJob(n.ID, val, rev)
}

// transitioned tells Config.OnTransition about one committed transition.
func (s *Store) transitioned(e jobs.Event) {
	if s.cfg.OnTransition != nil {
		s.cfg.OnTransition(string(e))
	}
}

// leaderStep is the shape of every leader-only transition: the record must
// still be at rev, the transition decides, commit applies.
func (s *Store) leaderStep(ctx context.Context, l Leadership, id string, rev int64,
	fn func(*jobs.Job, jobs.Meta) (*jobs.Job, jobs.Effects, error)) (*jobs.Job, error) {
	j, err := s.load(ctx, id)
	if err != nil {
		return nil, err
	}
	if j.Revision != rev {
		return nil, jobs.ErrStale
	}
	n, eff, err := fn(j, jobs.Meta{Actor: "dispatcher@" + l.ID, At: s.now()})
	if err != nil {
		return nil, err
	}
	if eff.NoChange {
		return j, nil
	}
	out, err := s.commit(ctx, &l, j, n, eff)
	if errors.Is(err, errConflict) {
		return nil, jobs.ErrStale
	}
	return out, err
}

// anyStep re-evaluates the transition on a record that changed under it,
// a bounded number of times: the transition re-checks state and identity on
// the new record, so this is not a blind retry.
func (s *Store) anyStep(ctx context.Context, id, actor string,
	fn func(*jobs.Job, jobs.Meta) (*jobs.Job, jobs.Effects, error)) (*jobs.Job, jobs.Effects, error) {
	for range 5 {
		j, err := s.load(ctx, id)
		if err != nil {
			return nil, jobs.Effects{}, err
		}
		n, eff, err := fn(j, jobs.Meta{Actor: actor, At: s.now()})
		if err != nil {
			return nil, jobs.Effects{}, err
		}
		if eff.NoChange {
			return j, eff, nil
		}
		out, err := s.commit(ctx, nil, j, n, eff)
		if errors.Is(err, errConflict) {
			continue
		}
		return out, eff, err
	}
	return nil, jobs.Effects{}, jobs.ErrStale
}

// Cancel moves a PENDING job to NOT_COMMITTED (CANCELLED), releasing fence and quota.
func (s *Store) Cancel(ctx context.Context, id, actor string) (*jobs.Job, error) {
	j, _, err := s.anyStep(ctx, id, actor, jobs.Cancel)
	return j, err
}

// CompleteWithResult applies an agent's envelope (with the slot proof it
// carries, in the same transaction). applied is true when it moved the job,
// released the slot, was kept as late evidence, or repeated an applied one.
func (s *Store) CompleteWithResult(ctx context.Context, id string, env jobs.ResultEnvelope) (*jobs.Job, bool, error) {
	actor := "agent"
	j, _, err := s.anyStep(ctx, id, actor, func(j *jobs.Job, m jobs.Meta) (*jobs.Job, jobs.Effects, error) {
		if j.Dispatch != nil {
			m.Actor = "agent:" + j.Dispatch.AgentID
		}
		return jobs.ApplyResult(j, env, m)
	})
	if err != nil {
		return nil, false, err
	}
	return j, true, nil
}

// MarkRunning fixes the dispatch identity and takes the agent slot (leader only).
func (s *Store) MarkRunning(ctx context.Context, l Leadership, id string, rev int64, in MarkRunningInput) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, func(j *jobs.Job, m jobs.Meta) (*jobs.Job, jobs.Effects, error) {
		return jobs.MarkRunning(j, jobs.Dispatch{
			AgentID: in.AgentID, AgentEpoch: in.AgentEpoch, AgentAddress: in.AgentAddress,
			InvocationID: in.InvocationID, SecretHash: in.SecretHash, Deadline: in.Deadline.UTC(), SentAt: m.At,
		}, m)
	})
}

// Classify records a server-established outcome: REFUSED_BY_AGENT,
// TOMBSTONED, or NO_TRUSTED_RESULT after the deadline (leader only).
func (s *Store) Classify(ctx context.Context, l Leadership, id string, rev int64, code jobs.ResultCode, detail string) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, func(j *jobs.Job, m jobs.Meta) (*jobs.Job, jobs.Effects, error) {
		return jobs.ClassifyByServer(j, code, detail, m)
	})
}

// RecordTerminationProof releases a held slot with a server-found proof
// (the epoch sweep); the state is untouched (leader only).
func (s *Store) RecordTerminationProof(ctx context.Context, l Leadership, id string, rev int64, proof jobs.Proof) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, func(j *jobs.Job, m jobs.Meta) (*jobs.Job, jobs.Effects, error) {
		return jobs.RecordTerminationProof(j, proof, m)
	})
}

// MarkRefreshRunning: the leader starts calling the refresh hook.
func (s *Store) MarkRefreshRunning(ctx context.Context, l Leadership, id string, rev int64) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, jobs.MarkRefreshRunning)
}

// MarkRefreshDone: the hook succeeded; fence and quota are released.
func (s *Store) MarkRefreshDone(ctx context.Context, l Leadership, id string, rev int64) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, jobs.MarkRefreshDone)
}

// MarkRefreshFailed: the hook failed; errText is kept in history.
func (s *Store) MarkRefreshFailed(ctx context.Context, l Leadership, id string, rev int64, errText string) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, func(j *jobs.Job, m jobs.Meta) (*jobs.Job, jobs.Effects, error) {
		return jobs.MarkRefreshFailed(j, errText, m)
	})
}

// DowngradeRefresh: a new leader turns an inherited RUNNING refresh back into REQUIRED.
func (s *Store) DowngradeRefresh(ctx context.Context, l Leadership, id string, rev int64) (*jobs.Job, error) {
	return s.leaderStep(ctx, l, id, rev, jobs.DowngradeRefresh)
}

// ForceRelease is the operator's release of an UNKNOWN job (or one whose
// refresh failed): fence, quota and a held slot go, the state stays.
// Repeating it returns the same record without a write. On a corrupt record
// it deletes the record and every fence, quota and slot key naming its id,
// and returns a stand-in record carrying the force fields.
func (s *Store) ForceRelease(ctx context.Context, id, actor, note string) (*jobs.Job, error) {
	if err := jobs.ValidateNote(note); err != nil {
		return nil, &jobs.ValidationError{Errors: []jobs.FieldError{{Field: "note", Problem: err.Error()}}}
	}
	j, _, err := s.anyStep(ctx, id, actor, func(j *jobs.Job, m jobs.Meta) (*jobs.Job, jobs.Effects, error) {
		return jobs.ForceRelease(j, note, m)
	})
	var fc *jobs.FailClosedError
	if errors.As(err, &fc) {
		return s.removeCorrupt(ctx, id, actor, note)
	}
	return j, err
}

func (s *Store) removeCorrupt(ctx context.Context, id, actor, note string) (*jobs.Job, error) {
	resp, err := s.cli.Get(ctx, s.k.job(id))
	if err != nil {
		return nil, translate(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, jobs.ErrNotFound
	}
	modRev := resp.Kvs[0].ModRevision
	// The read model knows which keys name this id; wait until it has seen
	// the record as it is now, so none is missed.
	if err := s.WaitSynced(ctx, resp.Header.Revision); err != nil {
		return nil, err
	}
	ops := []clientv3.Op{clientv3.OpDelete(s.k.job(id))}
	s.mu.RLock()
	for t, holder := range s.v.fences {
		if holder == id {
			ops = append(ops, guardedDelete(s.k.fence(t), id))
		}
	}
	for i, holder := range s.v.quotaGlobal {
		if holder == id {
			ops = append(ops, guardedDelete(s.k.quotaGlobal(i), id))
		}
	}
	for sc, m := range s.v.quotaScope {
		for i, holder := range m {
			if holder == id {
				ops = append(ops, guardedDelete(s.k.quotaScope(sc, i), id))
			}
		}
	}
	for agent, m := range s.v.slots {
		if _, ok := m[id]; ok {
			ops = append(ops, guardedDelete(s.k.slot(agent, id), id))
		}
	}
	s.mu.RUnlock()
	tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.job(id)), "=", modRev)).Then(ops...).Commit()
	if err != nil {
		return nil, translate(err)
	}
	if !tr.Succeeded {
		return nil, jobs.ErrStale
	}
	if err := s.WaitSynced(ctx, tr.Header.Revision); err != nil {
		return nil, err
	}
	s.transitioned(jobs.EventForceRelease)
	at := s.now()
	s.log.Warn("corrupt_record_removed", "job_id", id, "actor", actor)
	return &jobs.Job{
		ID: id, Revision: tr.Header.Revision, State: jobs.Unknown, RefreshState: jobs.RefreshNotRequired,
		Resolved: true, Slot: jobs.Slot{Proof: jobs.ProofForceReleased},
		Force: &jobs.Force{Actor: actor, At: at, Note: note,
			Warning: "the record could not be read and was removed: nothing is known about what its job did"},
		UpdatedAt: at,
		History: []jobs.HistoryEntry{{Revision: tr.Header.Revision, At: at, Actor: actor,
			Event: jobs.EventForceRelease, Detail: "corrupt record removed"}},
	}, nil
}

// RemoveResolved deletes up to batch resolved records (holding no slot)
// last updated before olderThan, each in its own compared transaction.
func (s *Store) RemoveResolved(ctx context.Context, olderThan time.Time, batch int) (int, error) {
	s.mu.RLock()
	var cands []string
	for id, e := range s.v.jobs {
		if e.Removable && e.updated().Before(olderThan) {
			cands = append(cands, id)
		}
	}
	s.mu.RUnlock()
	slices.Sort(cands)
	removed := 0
	var last int64
	for _, id := range cands {
		if removed >= batch {
			break
		}
		// The summary chose it; the record read now decides, and the
		// delete compares the revision that was read.
		j, err := s.load(ctx, id)
		if errors.Is(err, jobs.ErrNotFound) {
			continue
		}
		if err != nil {
			return removed, err
		}
		if !jobs.Removable(j) || !j.UpdatedAt.Before(olderThan) {
			continue
		}
		ops := []clientv3.Op{clientv3.OpDelete(s.k.job(j.ID))}
		if j.IdempotencyKey != "" {
			ops = append(ops, clientv3.OpDelete(s.k.idem(j.CreatedBy, j.IdempotencyKey)))
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.k.job(j.ID)), "=", j.Revision)).Then(ops...).Commit()
		if err != nil {
			return removed, translate(err)
		}
		if resp.Succeeded {
			removed++
			last = resp.Header.Revision
		}
	}
	if last > 0 {
		return removed, s.WaitSynced(ctx, last)
	}
	return removed, nil
}

func (s *Store) putSetting(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	resp, err := s.cli.Put(ctx, key, string(b))
	if err != nil {
		return translate(err)
	}
	return s.WaitSynced(ctx, resp.Header.Revision)
}

// SetAdmissionOpen opens or closes admission of new jobs.
func (s *Store) SetAdmissionOpen(ctx context.Context, open bool) error {
	return s.putSetting(ctx, s.k.settingAdmission(), struct {
		Open bool `json:"open"`
	}{open})
}

// SetDispatchPaused pauses or resumes dispatch.
func (s *Store) SetDispatchPaused(ctx context.Context, paused bool) error {
	return s.putSetting(ctx, s.k.settingDispatch(), struct {
		Paused bool `json:"paused"`
	}{paused})
}

// PutAgent records a heartbeat or registration. A new epoch restarts
// RegisteredAt; the epoch sweep compares slots against it.
func (s *Store) PutAgent(ctx context.Context, id string, reg jobs.AgentRegistration) (*jobs.Agent, error) {
	now := s.now()
	a := &jobs.Agent{ID: id, Address: reg.Address, Epoch: reg.Epoch, Capacity: reg.Capacity,
		Isolation: reg.Isolation, LastHeartbeat: now, RegisteredAt: now}
	s.mu.RLock()
	if old, ok := s.v.agents[id]; ok && old.Epoch == reg.Epoch {
		a.RegisteredAt = old.RegisteredAt
	}
	s.mu.RUnlock()
	b, err := json.Marshal(a)
	if err != nil {
		return nil, err
	}
	resp, err := s.cli.Put(ctx, s.k.agent(id), string(b))
	if err != nil {
		return nil, translate(err)
	}
	if err := s.WaitSynced(ctx, resp.Header.Revision); err != nil {
		return nil, err
	}
	return a, nil
}

// newJobID is a UUIDv7, so ids sort by admission time.
func newJobID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// pause waits d or until ctx ends, whichever comes first: the backoff of a
// loop that retries until its context ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
