package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unique"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/jobs"
)

// errResync ends a watch so Run lists again.
var errResync = errors.New("read model resync")

// CorruptRecord is a job key whose value cannot be decoded, or an unresolved
// record without a target. Admission fails closed while one exists.
type CorruptRecord struct {
	ID       string `json:"id"`
	Reason   string `json:"reason"`
	Revision int64  `json:"revision"`
}

// view is the read model's data at one revision.
type view struct {
	jobs         map[string]jobEntry  // every job, summarized: see jobEntry
	active       map[string]*jobs.Job // unresolved or holding a slot: see ActiveJobs
	corrupt      map[string]CorruptRecord
	fences       map[string]string // normalized target -> job id
	quotaGlobal  map[int]string
	quotaScope   map[string]map[int]string
	slots        map[string]map[string]string // agent -> job id -> value
	agents       map[string]*jobs.Agent
	replicas     map[string]ReplicaInfo // registered replicas, by id
	idem         map[string]idemRecord  // idem hash -> record
	waiters      []waiter               // WaitSynced callers, carried across relists
	settings     Settings
	admissionRev int64 // ModRevision of the admission setting (0 = absent)
}

func newView() *view {
	return &view{
		jobs: map[string]jobEntry{}, active: map[string]*jobs.Job{}, corrupt: map[string]CorruptRecord{},
		fences: map[string]string{}, quotaGlobal: map[int]string{}, quotaScope: map[string]map[int]string{},
		slots: map[string]map[string]string{}, agents: map[string]*jobs.Agent{}, idem: map[string]idemRecord{},
		replicas: map[string]ReplicaInfo{},
		settings: Settings{AdmissionOpen: true},
	}
}

// applyKV folds one key/value (nil value = deleted) into v. It returns the
// change to publish, and errResync for a value that cannot be decoded where
// a list would have to decide what it means.
func (s *Store) applyKV(v *view, key string, value []byte, modRev int64, deleted bool) (Change, error) {
	return s.applyPrepared(v, s.prepareKV(key, value, modRev, deleted))
}

// preparedKV is one key/value parsed, and a job record decoded, ahead of
// applying it, so the watch decodes outside the view's lock and readers (the
// admissions picking tokens, every WaitSynced) are not held behind JSON.
type preparedKV struct {
	p       parsed
	known   bool
	value   []byte
	modRev  int64
	deleted bool
	job     *jobs.Job
	entry   jobEntry // a resolved job's summary when job is nil
	jobErr  error
}

var resolvedMember = []byte(`"resolved":true`)

func (s *Store) prepareKV(key string, value []byte, modRev int64, deleted bool) preparedKV {
	p, err := s.k.parse(key)
	kv := preparedKV{p: p, known: err == nil, value: value, modRev: modRev, deleted: deleted}
	if kv.known && p.kind == kindJob && !deleted {
		// An active record is decoded whole anyway; only a record that can
		// be resolved is worth reading for a summary first. The encoder
		// writes the member without spaces, and a string value cannot hold
		// it unescaped; a miss only costs the whole decode.
		if bytes.Contains(value, resolvedMember) {
			var ok bool
			if kv.entry, ok, kv.jobErr = summarizeRecord(p.id, value, modRev); ok || kv.jobErr != nil {
				return kv
			}
		}
		kv.job, kv.jobErr = decodeJob(p.id, value, modRev)
		if kv.job != nil {
			intern(kv.job)
		}
	}
	return kv
}

// prepareAll prepares one page of a list on every core: decoding the
// records is most of a restart's time.
func (s *Store) prepareAll(kvs []*mvccpb.KeyValue) []preparedKV {
	out := make([]preparedKV, len(kvs))
	workers := min(runtime.GOMAXPROCS(0), max(1, len(kvs)/64))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(kvs); i += workers {
				kv := kvs[i]
				out[i] = s.prepareKV(string(kv.Key), kv.Value, kv.ModRevision, false)
			}
		})
	}
	wg.Wait()
	return out
}

// intern shares the strings most records repeat (scopes, commands, actors,
// events, codes), so a view of many retained jobs holds one copy of each.
func intern(j *jobs.Job) {
	in := func(p *string) {
		if *p != "" {
			*p = unique.Make(*p).Value()
		}
	}
	in(&j.Target.Scope)
	in(&j.Operation)
	in(&j.CreatedBy)
	in(&j.Spec.WorkingDir)
	in(&j.Spec.Credentials)
	in(&j.QuotaToken)
	in((*string)(&j.State))
	in((*string)(&j.RefreshState))
	in((*string)(&j.Slot.Proof))
	in(&j.Slot.AgentID)
	for i := range j.Spec.Command {
		in(&j.Spec.Command[i])
	}
	for i := range j.History {
		h := &j.History[i]
		in(&h.Actor)
		in((*string)(&h.Event))
		in(&h.From)
		in(&h.To)
		in(&h.Detail)
	}
	if r := j.Result; r != nil {
		in((*string)(&r.Code))
		in((*string)(&r.Phase))
		in(&r.Signal)
	}
	if d := j.Dispatch; d != nil {
		in(&d.AgentID)
		in(&d.AgentAddress)
	}
}

func (s *Store) applyPrepared(v *view, kv preparedKV) (Change, error) {
	if !kv.known {
		return Change{}, nil // a key of no family we know: not ours to interpret
	}
	p, value, modRev, deleted := kv.p, kv.value, kv.modRev, kv.deleted
	ch := Change{Revision: modRev}
	switch p.kind {
	case kindJob:
		ch.Kind, ch.ID = "job", p.id
		delete(v.jobs, p.id)
		delete(v.active, p.id)
		delete(v.corrupt, p.id)
		if deleted {
			return ch, nil
		}
		if kv.jobErr != nil {
			v.corrupt[p.id] = CorruptRecord{ID: p.id, Reason: kv.jobErr.Error(), Revision: modRev}
			return ch, nil
		}
		if kv.job == nil {
			v.jobs[p.id] = kv.entry
			return ch, nil
		}
		v.jobs[p.id] = summarize(kv.job)
		if active(kv.job) {
			v.active[p.id] = kv.job
		}
	case kindFence:
		ch.Kind, ch.ID = "fence", p.target
		if deleted {
			delete(v.fences, p.target)
		} else {
			v.fences[p.target] = string(value)
		}
	case kindQuotaGlobal:
		// Quota moves with its job's change; it is not published on its own.
		if deleted {
			delete(v.quotaGlobal, p.index)
		} else {
			v.quotaGlobal[p.index] = string(value)
		}
		return Change{}, nil
	case kindQuotaScope:
		m := v.quotaScope[p.scope]
		if deleted {
			delete(m, p.index)
			if len(m) == 0 {
				delete(v.quotaScope, p.scope)
			}
		} else {
			if m == nil {
				m = map[int]string{}
				v.quotaScope[p.scope] = m
			}
			m[p.index] = string(value)
		}
		return Change{}, nil
	case kindSlot:
		ch.Kind, ch.ID = "slot", p.agent+"/"+p.id
		m := v.slots[p.agent]
		if deleted {
			delete(m, p.id)
			if len(m) == 0 {
				delete(v.slots, p.agent)
			}
		} else {
			if m == nil {
				m = map[string]string{}
				v.slots[p.agent] = m
			}
			m[p.id] = string(value)
		}
	case kindAgent:
		ch.Kind, ch.ID = "agent", p.id
		if deleted {
			delete(v.agents, p.id)
			return ch, nil
		}
		var a jobs.Agent
		if err := json.Unmarshal(value, &a); err != nil {
			return ch, fmt.Errorf("%w: agent %s: %v", errResync, p.id, err)
		}
		v.agents[p.id] = &a
	case kindIdem:
		if deleted {
			delete(v.idem, p.id)
			return Change{}, nil
		}
		var r idemRecord
		if err := json.Unmarshal(value, &r); err != nil {
			return Change{}, fmt.Errorf("%w: idempotency record: %v", errResync, err)
		}
		v.idem[p.id] = r
		return Change{}, nil
	case kindReplica:
		// Display only, so not published, and an unreadable value is left
		// out rather than re-listed: a list would read the same bytes.
		delete(v.replicas, p.id)
		var r ReplicaInfo
		if !deleted && json.Unmarshal(value, &r) == nil && r.ID == p.id {
			v.replicas[p.id] = r
		}
		return Change{}, nil
	case kindSettingAdmission:
		ch.Kind, ch.ID = "settings", "admission"
		v.settings.AdmissionOpen = true
		v.admissionRev = 0
		if !deleted {
			var b struct{ Open bool }
			if err := json.Unmarshal(value, &b); err != nil {
				// An unreadable switch keeps admission closed, not open.
				v.settings.AdmissionOpen = false
				v.admissionRev = modRev
				return ch, fmt.Errorf("%w: admission setting: %v", errResync, err)
			}
			v.settings.AdmissionOpen = b.Open
			v.admissionRev = modRev
		}
	case kindSettingDispatch:
		ch.Kind, ch.ID = "settings", "dispatch"
		v.settings.DispatchPaused = false
		if !deleted {
			var b struct{ Paused bool }
			if err := json.Unmarshal(value, &b); err != nil {
				return ch, fmt.Errorf("%w: dispatch setting: %v", errResync, err)
			}
			v.settings.DispatchPaused = b.Paused
		}
	default:
		return Change{}, nil
	}
	return ch, nil
}

// Run keeps the read model: list the prefix at revision R, watch from R+1,
// and list again when the watch reports a compaction, fails, or carries a
// value that cannot be applied. It returns nil when ctx ends.
func (s *Store) Run(ctx context.Context) error {
	// A watcher of its own: closing it at the end ends every stream it
	// opened, including one a progress request may open between watches.
	w := clientv3.NewWatcher(s.cli)
	s.watcher.Store(&w)
	defer func() {
		s.watcher.Store(nil)
		_ = w.Close()
	}()
	backoff := 50 * time.Millisecond
	// A restarted Run resumes from its cursor; the watch tells it when that
	// revision is compacted away and a list is due.
	s.mu.RLock()
	resume, rev := s.ready, s.rev
	s.mu.RUnlock()
	if resume {
		err := s.watch(ctx, w, rev)
		if ctx.Err() != nil {
			return nil
		}
		s.relists.Add(1)
		s.log.Info("read_model_resync", "revision", rev, "reason", err.Error())
	}
	for ctx.Err() == nil {
		rev, err := s.relist(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			s.log.Warn("read_model_list_failed", "err", err.Error())
			pause(ctx, backoff)
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		err = s.watch(ctx, w, rev)
		if ctx.Err() != nil {
			break
		}
		s.relists.Add(1)
		s.log.Info("read_model_resync", "revision", rev, "reason", err.Error())
	}
	return nil
}

// relistPage bounds one range of the list. Paging at one revision reads the
// same snapshot as one range, without holding every record of a large
// keyspace in one response (and its buffers) at once.
const relistPage = 1000

// relistFreeAbove is the key count above which a finished list hands its
// transient memory back to the OS at once instead of over minutes of
// background scavenging, so a replica's RSS after start reflects its view.
const relistFreeAbove = 20000

func (s *Store) relist(ctx context.Context) (int64, error) {
	// Pages are fetched while the previous one is decoded: on a restart
	// with many records the range and the decoding each take seconds.
	type page struct {
		resp *clientv3.GetResponse
		err  error
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pages := make(chan page, 2)
	go func() {
		defer close(pages)
		root := s.k.root()
		end := clientv3.GetPrefixRangeEnd(root)
		from := root
		var rev int64
		for {
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(relistPage)}
			if rev != 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			resp, err := s.cli.Get(fctx, from, opts...)
			select {
			case pages <- page{resp, err}:
			case <-fctx.Done():
				return
			}
			if err != nil || !resp.More || len(resp.Kvs) == 0 {
				return
			}
			rev = resp.Header.Revision
			from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
	}()
	v := newView()
	var rev int64
	n := 0
	for pg := range pages {
		if pg.err != nil {
			return 0, pg.err
		}
		if rev == 0 {
			rev = pg.resp.Header.Revision
		}
		for _, kv := range s.prepareAll(pg.resp.Kvs) {
			if _, err := s.applyPrepared(v, kv); err != nil {
				// A broken agent or setting value is logged and skipped; a
				// broken job is already recorded as corrupt.
				s.log.Warn("read_model_skip_value", "err", err.Error())
			}
		}
		n += len(pg.resp.Kvs)
	}
	if rev == 0 {
		return 0, ctx.Err()
	}
	s.mu.Lock()
	v.waiters = s.v.waiters // callers waiting on the old view wait on this one
	s.v = v
	s.setRevLocked(rev)
	if rev > s.latest {
		s.latest = rev
	}
	s.ready = true
	s.wakeLocked()
	s.mu.Unlock()
	s.publish(Change{Kind: "resync", Revision: rev})
	if n > relistFreeAbove {
		debug.FreeOSMemory()
	}
	return rev, nil
}

func (s *Store) watch(ctx context.Context, w clientv3.Watcher, rev int64) error {
	// The watch context carries no values of ctx: progress requests find the
	// watch's stream by the context's gRPC metadata, and they send none.
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	wch := w.Watch(wctx, s.k.root(), clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return fmt.Errorf("compacted at %d", resp.CompactRevision)
		}
		if err := resp.Err(); err != nil {
			return err
		}
		if resp.Canceled {
			return errors.New("watch canceled")
		}
		prepared := make([]preparedKV, len(resp.Events))
		for i, ev := range resp.Events {
			prepared[i] = s.prepareKV(string(ev.Kv.Key), ev.Kv.Value, ev.Kv.ModRevision, ev.Type == mvccpb.DELETE)
		}
		var changes []Change
		var resync error
		s.mu.Lock()
		if resp.Header.Revision > s.latest {
			s.latest = resp.Header.Revision
		}
		// The cursor moves once per response, to the last event applied:
		// one wake-up of the waiters per batch, not one per key.
		cursor := s.rev
		if resp.IsProgressNotify() {
			cursor = resp.Header.Revision
		}
		for _, kv := range prepared {
			ch, err := s.applyPrepared(s.v, kv)
			if err != nil {
				resync = err
				break
			}
			if ch.Kind != "" {
				changes = append(changes, ch)
			}
			cursor = max(cursor, kv.modRev)
		}
		s.setRevLocked(cursor)
		s.mu.Unlock()
		for _, ch := range changes {
			s.publish(ch)
		}
		if resync != nil {
			return resync
		}
	}
	return errors.New("watch closed")
}

// waiter is one WaitSynced caller. Each is woken only when the cursor
// reaches its revision: with many concurrent writers, waking all of them on
// every watch response cost more than the responses themselves.
type waiter struct {
	rev int64
	ch  chan struct{}
}

// setRevLocked moves the cursor forward and wakes the WaitSynced callers it
// satisfies.
func (s *Store) setRevLocked(rev int64) {
	if rev > s.rev || !s.ready {
		s.rev = rev
	}
	s.wakeLocked()
}

func (s *Store) wakeLocked() {
	if !s.ready {
		return
	}
	keep := s.v.waiters[:0]
	for _, w := range s.v.waiters {
		if w.rev <= s.rev {
			close(w.ch)
		} else {
			keep = append(keep, w)
		}
	}
	clear(s.v.waiters[len(keep):])
	s.v.waiters = keep
}

// progressGrace is how long WaitSynced waits for the watch before asking
// etcd for a progress notification. A revision of this replica's own write
// arrives as an event within moments; only a revision written outside the
// prefix needs the request, and asking on every write would add a round
// trip to each admission.
const progressGrace = 5 * time.Millisecond

// WaitSynced blocks until this replica's view reflects rev.
func (s *Store) WaitSynced(ctx context.Context, rev int64) error {
	s.mu.RLock()
	done := s.ready && s.rev >= rev
	s.mu.RUnlock()
	if done {
		return nil
	}
	ch := make(chan struct{})
	s.mu.Lock()
	if s.ready && s.rev >= rev {
		s.mu.Unlock()
		return nil
	}
	s.v.waiters = append(s.v.waiters, waiter{rev: rev, ch: ch})
	s.mu.Unlock()
	timer := time.NewTimer(progressGrace)
	defer timer.Stop()
	for {
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			s.mu.Lock()
			s.v.waiters = slices.DeleteFunc(s.v.waiters, func(w waiter) bool { return w.ch == ch })
			s.mu.Unlock()
			return ctx.Err()
		case <-timer.C:
			// Revisions written under other prefixes produce no event here;
			// a progress notification moves the cursor past them.
			if s.Ready() {
				s.requestProgress(ctx)
			}
			timer.Reset(200 * time.Millisecond)
		}
	}
}

func (s *Store) requestProgress(ctx context.Context) {
	if w := s.watcher.Load(); w != nil {
		rctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
		_ = (*w).RequestProgress(rctx)
	}
}

// Ready reports whether the first list is done.
func (s *Store) Ready() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.ready
}

// Cursor is the revision the view reflects and how far etcd is ahead of it,
// as far as this replica has heard.
func (s *Store) Cursor() Cursor {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Cursor{Revision: s.rev, Lag: max(0, s.latest-s.rev)}
}

// Relists counts re-lists after the first (compaction, watch failure).
func (s *Store) Relists() uint64 { return s.relists.Load() }

// Subscribe returns a channel of read-model changes and a cancel function.
// A subscriber that falls behind loses changes and then receives one
// Change{Kind: "resync"} telling it to re-read.
func (s *Store) Subscribe() (<-chan Change, func()) {
	sub := &subscriber{ch: make(chan Change, 256)}
	s.subsMu.Lock()
	s.subs[sub] = struct{}{}
	s.subsMu.Unlock()
	var once bool
	return sub.ch, func() {
		s.subsMu.Lock()
		defer s.subsMu.Unlock()
		if !once {
			once = true
			delete(s.subs, sub)
			close(sub.ch)
		}
	}
}

type subscriber struct {
	ch   chan Change
	lost bool
}

func (s *Store) publish(ch Change) {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for sub := range s.subs {
		if sub.lost {
			select {
			case sub.ch <- Change{Kind: "resync", Revision: ch.Revision}:
				sub.lost = false
			default:
				continue
			}
		}
		select {
		case sub.ch <- ch:
		default:
			sub.lost = true
		}
	}
}

// Get returns a job the read model knows: an active one from memory, a
// resolved one read from etcd (see jobEntry).
func (s *Store) Get(ctx context.Context, id string) (*jobs.Job, error) {
	s.mu.RLock()
	j, isActive := s.v.active[id]
	_, known := s.v.jobs[id]
	if isActive {
		j = s.blocked.decorate(j.Clone())
	}
	s.mu.RUnlock()
	switch {
	case isActive:
		return j, nil
	case !known:
		return nil, jobs.ErrNotFound
	}
	return s.load(ctx, id)
}

// CorruptRecords lists the records that make admission fail closed.
func (s *Store) CorruptRecords() []CorruptRecord {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]CorruptRecord, 0, len(s.v.corrupt))
	for _, c := range s.v.corrupt {
		out = append(out, c)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// active: a job some leader work may still concern. A resolved job holds
// no fence or quota, and once its slot is released nothing changes it but
// retention.
func active(j *jobs.Job) bool { return !j.Resolved || j.Slot.Held }

// ActiveJobs is Jobs over the unresolved jobs and those still holding a
// slot, in id order. Its cost follows the working set, not the retained
// history: a leader's rounds that look only at such jobs stay cheap with
// any number of resolved jobs kept.
func (s *Store) ActiveJobs(filter func(*jobs.Job) bool) []*jobs.Job {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*jobs.Job
	for _, j := range s.v.active {
		if filter == nil || filter(j) {
			out = append(out, j.Clone())
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// List answers GET /v1/jobs: newest first (UUIDv7 ids sort by time); the
// page token is the last id of the previous page. The filter runs over the
// summaries; only the page's resolved records are read from etcd.
func (s *Store) List(ctx context.Context, f ListFilter) ([]*jobs.Job, string, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	if limit > 500 {
		limit = 500
	}
	scope := strings.ToLower(strings.TrimSpace(f.Scope))
	match := func(id string, e jobEntry) bool {
		switch {
		case f.State != "" && e.State != f.State,
			f.Scope != "" && e.Scope != scope,
			f.Target != "" && e.Target != f.Target,
			f.Resolved != nil && e.Resolved != *f.Resolved,
			f.AgentID != "" && e.AgentID != f.AgentID:
			return false
		}
		return f.PageToken == "" || id < f.PageToken
	}
	s.mu.RLock()
	var ids []string
	for id, e := range s.v.jobs {
		if match(id, e) {
			ids = append(ids, id)
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(ids, func(a, b string) int { return strings.Compare(b, a) })
	next := ""
	if len(ids) > limit {
		ids = ids[:limit]
		next = ids[limit-1]
	}
	out, err := s.fetch(ctx, ids)
	return out, next, err
}

// fetch returns the records of ids in order: active ones from memory, the
// others read from etcd in batches of one transaction each. A record
// removed in between (retention) is left out.
func (s *Store) fetch(ctx context.Context, ids []string) ([]*jobs.Job, error) {
	out := make([]*jobs.Job, len(ids))
	var missing []int
	s.mu.RLock()
	for i, id := range ids {
		if j, ok := s.v.active[id]; ok {
			out[i] = s.blocked.decorate(j.Clone())
		} else {
			missing = append(missing, i)
		}
	}
	s.mu.RUnlock()
	// etcd refuses a transaction of more than --max-txn-ops (default 128).
	const batch = 100
	for len(missing) > 0 {
		n := min(batch, len(missing))
		part := missing[:n]
		missing = missing[n:]
		ops := make([]clientv3.Op, len(part))
		for k, i := range part {
			ops[k] = clientv3.OpGet(s.k.job(ids[i]))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, translate(err)
		}
		for k, i := range part {
			kvs := resp.Responses[k].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			j, err := decodeJob(ids[i], kvs[0].Value, kvs[0].ModRevision)
			if err != nil {
				return nil, &jobs.FailClosedError{JobID: ids[i]}
			}
			out[i] = j
		}
	}
	return slices.DeleteFunc(out, func(j *jobs.Job) bool { return j == nil }), nil
}

// Fences lists held fences with their holders.
func (s *Store) Fences() []Fence {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Fence, 0, len(s.v.fences))
	for t, id := range s.v.fences {
		f := Fence{Target: t, Display: t, JobID: id}
		if j, ok := s.v.active[id]; ok {
			f.Display, f.State, f.RefreshState, f.Since = j.Target.Display, j.State, j.RefreshState, j.CreatedAt
		}
		out = append(out, f)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Target < out[b].Target })
	return out
}

// Slots lists held agent slots and the proof each waits for.
func (s *Store) Slots() []Slot {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []Slot
	for agent, m := range s.v.slots {
		for id := range m {
			sl := Slot{AgentID: agent, JobID: id,
				Awaiting: "a report with CHILD_REAPED or NEVER_LAUNCHED, a new agent epoch (AGENT_EPOCH_REPLACED), or a force release"}
			if j, ok := s.v.active[id]; ok {
				sl.State, sl.Since = j.State, j.UpdatedAt
				for _, h := range j.History {
					if h.Event == jobs.EventMarkRunning {
						sl.Since = h.At
					}
				}
				if j.State == jobs.Running {
					sl.Awaiting = "the agent's result (CHILD_REAPED or NEVER_LAUNCHED), a refusal or tombstone, or a new agent epoch (AGENT_EPOCH_REPLACED)"
				}
			}
			out = append(out, sl)
		}
	}
	sort.Slice(out, func(a, b int) bool {
		if out[a].AgentID != out[b].AgentID {
			return out[a].AgentID < out[b].AgentID
		}
		return out[a].JobID < out[b].JobID
	})
	return out
}

// Agents lists agent records with their held slots and liveness. Liveness
// is for display: it proves nothing about a slot.
func (s *Store) Agents() []AgentView {
	now := s.now()
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]AgentView, 0, len(s.v.agents))
	for id, a := range s.v.agents {
		out = append(out, AgentView{Agent: *a, SlotsHeld: len(s.v.slots[id]), Live: now.Sub(a.LastHeartbeat) < s.cfg.AgentLiveFor})
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// Counts is the number of jobs per state (every state present).
func (s *Store) Counts() map[jobs.State]int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make(map[jobs.State]int, len(jobs.States))
	for _, st := range jobs.States {
		out[st] = 0
	}
	for _, e := range s.v.jobs {
		out[e.State]++
	}
	return out
}

// QuotaUse is the number of held quota units, globally and per scope.
func (s *Store) QuotaUse() (int, map[string]int) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	per := make(map[string]int, len(s.v.quotaScope))
	for sc, m := range s.v.quotaScope {
		per[sc] = len(m)
	}
	return len(s.v.quotaGlobal), per
}

// Settings are the operator switches as the view knows them.
func (s *Store) Settings() Settings {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.v.settings
}
