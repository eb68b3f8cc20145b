package store

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/jobs"
)

// maxAdmitRounds bounds one admission's picks, waits and transactions.
const maxAdmitRounds = 64

// Admit creates a PENDING job holding the target's fence and one quota token
// at each level, in one transaction:
//
//	If   CreateRevision(jobs/<id>) = 0
//	     CreateRevision(fences/<target>) = 0
//	     CreateRevision(quota/global/<g>) = 0
//	     CreateRevision(quota/scope/<scope>/<i>) = 0
//	     ModRevision(settings/admission) = <as the view saw it>
//	     [CreateRevision(idem/<hash>) = 0]
//	Then Put jobs/<id>, fences/<target>=id, quota/global/<g>=id,
//	     quota/scope/<scope>/<i>=id, [idem/<hash>]
//	Else Get fences/<target>, [Get idem/<hash>]
//
// g and i are free tokens picked at random from the view, skipping tokens
// another admission of this replica is trying, so concurrent admissions
// rarely meet on a key; a lost token compare picks again. A limit is exact
// because a level has only as many token keys as its limit.
func (s *Store) Admit(ctx context.Context, in AdmitInput) (*jobs.Job, bool, error) {
	if err := s.waitReady(ctx); err != nil {
		return nil, false, err
	}
	if in.Target.Scope == "" || in.Target.Name == "" {
		return nil, false, &jobs.ValidationError{Errors: []jobs.FieldError{{Field: "target", Problem: "is required"}}}
	}
	id, err := newJobID()
	if err != nil {
		return nil, false, err
	}
	target := in.Target.Key()
	fenceKey := s.k.fence(target)
	idemKey := ""
	if in.IdempotencyKey != "" {
		idemKey = s.k.idem(in.Actor, in.IdempotencyKey)
	}
	taken := map[string]bool{} // tokens found taken by a lost compare, not yet in the view
	for range maxAdmitRounds {
		pre, err := s.admitPrecheck(ctx, idemKey, in.BodyHash)
		if err != nil || pre != nil {
			return pre, false, err
		}
		g, sc, admissionRev, err := s.pickTokens(ctx, in.Target.Scope, target, taken)
		if errors.Is(err, errBusy) {
			continue
		}
		if err != nil {
			return nil, false, err
		}
		gKey, sKey := s.k.quotaGlobal(g), s.k.quotaScope(in.Target.Scope, sc)
		j, _ := jobs.Admit(jobs.AdmitParams{
			ID: id, Target: in.Target, Operation: in.Operation, Spec: in.Spec,
			IdempotencyKey: in.IdempotencyKey, BodyHash: in.BodyHash, QuotaToken: quotaToken(g, sc),
		}, jobs.Meta{Actor: in.Actor, At: s.now()})
		val, err := encodeJob(j)
		if err != nil {
			s.unreserve(gKey, sKey)
			return nil, false, err
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(s.k.job(id)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(gKey), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(sKey), "=", 0),
			clientv3.Compare(clientv3.ModRevision(s.k.settingAdmission()), "=", admissionRev),
		}
		if !mutationSkipFenceCompare {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(fenceKey), "=", 0))
		}
		ops := []clientv3.Op{
			clientv3.OpPut(s.k.job(id), string(val)),
			clientv3.OpPut(fenceKey, id),
			clientv3.OpPut(gKey, id),
			clientv3.OpPut(sKey, id),
		}
		elseOps := []clientv3.Op{clientv3.OpGet(fenceKey), clientv3.OpGet(gKey), clientv3.OpGet(sKey)}
		if idemKey != "" {
			rec, _ := json.Marshal(idemRecord{JobID: id, BodyHash: in.BodyHash})
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(idemKey), "=", 0))
			ops = append(ops, clientv3.OpPut(idemKey, string(rec)))
			elseOps = append(elseOps, clientv3.OpGet(idemKey))
		}
		s.attempts.Add(1)
		resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(elseOps...).Commit()
		if err != nil {
			s.unreserve(gKey, sKey)
			return nil, false, translate(err)
		}
		if resp.Succeeded {
			rev := resp.Header.Revision
			// The reservation lasts until the view shows the token held.
			err := s.WaitSynced(ctx, rev)
			s.unreserve(gKey, sKey)
			if err != nil {
				return nil, false, err
			}
			s.admissions.Add(1)
			s.transitioned(jobs.EventAdmit)
			// The record as written, with what only the commit knows filled
			// in the way decodeJob fills it, without decoding what was just
			// encoded. j was built by this call and shared with nobody (the
			// read model decodes its own copy from the watch), so it is the
			// caller's without a clone.
			out := j
			out.Revision = rev
			for i := range out.History {
				if out.History[i].Revision == 0 {
					out.History[i].Revision = rev
				}
			}
			return out, true, nil
		}
		s.unreserve(gKey, sKey)
		rr := func(i int) []byte {
			kvs := resp.Responses[i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				return nil
			}
			return kvs[0].Value
		}
		if idemKey != "" {
			if v := rr(3); v != nil {
				// A concurrent request with the same key won; the view
				// answers once it has caught up.
				if err := s.WaitSynced(ctx, resp.Header.Revision); err != nil {
					return nil, false, err
				}
				continue
			}
		}
		if holder := rr(0); holder != nil {
			return nil, false, &jobs.FenceHeldError{Target: target, HolderJobID: string(holder)}
		}
		if rr(1) != nil {
			taken[gKey] = true
		}
		if rr(2) != nil {
			taken[sKey] = true
		}
		if rr(1) == nil && rr(2) == nil {
			// The admission setting moved: re-read it from a view that has
			// seen the change.
			if err := s.WaitSynced(ctx, resp.Header.Revision); err != nil {
				return nil, false, err
			}
		}
	}
	return nil, false, jobs.ErrStale
}

func (s *Store) waitReady(ctx context.Context) error {
	return s.WaitSynced(ctx, 0)
}

// admitPrecheck answers what the view can answer without a write: closed
// admission, a corrupt record (fail closed), a known idempotency key.
func (s *Store) admitPrecheck(ctx context.Context, idemKey, bodyHash string) (*jobs.Job, error) {
	s.mu.RLock()
	open := s.v.settings.AdmissionOpen
	var corrupt string
	for id := range s.v.corrupt {
		if corrupt == "" || id < corrupt {
			corrupt = id
		}
	}
	var rec idemRecord
	var seen bool
	if idemKey != "" {
		rec, seen = s.v.idem[idemKey[len(s.k.prefix)+len("/idem/"):]]
	}
	s.mu.RUnlock()
	if !open {
		return nil, jobs.ErrAdmissionClosed
	}
	if corrupt != "" {
		return nil, &jobs.FailClosedError{JobID: corrupt}
	}
	if !seen {
		return nil, nil
	}
	if rec.BodyHash != bodyHash {
		return nil, jobs.ErrIdempotencyMismatch
	}
	j, err := s.Get(ctx, rec.JobID)
	if errors.Is(err, jobs.ErrNotFound) {
		// The job exists in etcd (its idempotency key does) but the view
		// is behind or the record is unreadable: read it directly.
		return s.load(ctx, rec.JobID)
	}
	return j, err
}

// errBusy: every free token is being tried by another admission of this
// replica; wait for one of them to finish and pick again.
var errBusy = errors.New("quota tokens busy")

// pickTokens reserves one free global and one free scope token. When the
// view shows a level full, it confirms with etcd before answering
// QuotaExhaustedError (the view may not have seen a release yet), and a
// fenced target answers FenceHeldError first.
func (s *Store) pickTokens(ctx context.Context, scope, target string, taken map[string]bool) (g, sc int, admissionRev int64, err error) {
	for range 2 {
		s.mu.RLock()
		admissionRev = s.v.admissionRev
		holder := s.v.fences[target]
		s.resMu.Lock()
		g, gFull, gBusy := s.freeToken(s.cfg.QuotaGlobal, s.v.quotaGlobal, func(i int) string { return s.k.quotaGlobal(i) }, taken)
		sc, sFull, sBusy := s.freeToken(s.cfg.QuotaPerScope, s.v.quotaScope[scope], func(i int) string { return s.k.quotaScope(scope, i) }, taken)
		ok := !gFull && !gBusy && !sFull && !sBusy
		if ok {
			s.reserved[s.k.quotaGlobal(g)] = struct{}{}
			s.reserved[s.k.quotaScope(scope, sc)] = struct{}{}
		}
		freed := s.resFreed
		s.resMu.Unlock()
		s.mu.RUnlock()
		if ok {
			return g, sc, admissionRev, nil
		}
		if !gFull && !sFull {
			// Wait for a reservation to end; the timer covers tokens known
			// taken by another replica, which only a fresher view frees.
			t := time.NewTimer(20 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-freed:
			case <-t.C:
			}
			t.Stop()
			if err := s.syncNow(ctx); err != nil {
				return 0, 0, 0, err
			}
			clear(taken)
			return 0, 0, 0, errBusy
		}
		if holder != "" {
			return 0, 0, 0, &jobs.FenceHeldError{Target: target, HolderJobID: holder}
		}
		// Confirm the full level against etcd itself.
		prefix, limit := s.k.quotaGlobalPrefix(), s.cfg.QuotaGlobal
		if sFull {
			prefix, limit = s.k.quotaScopePrefix(scope), s.cfg.QuotaPerScope
		}
		resp, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, 0, 0, translate(err)
		}
		if resp.Count >= int64(limit) {
			if sFull {
				return 0, 0, 0, &jobs.QuotaExhaustedError{Scope: scope}
			}
			return 0, 0, 0, &jobs.QuotaExhaustedError{Scope: scope, Global: true}
		}
		clear(taken)
		if err := s.WaitSynced(ctx, resp.Header.Revision); err != nil {
			return 0, 0, 0, err
		}
	}
	return 0, 0, 0, errBusy
}

// freeToken picks a random index in [0, limit) not held, not reserved and
// not known taken. full: the view holds limit tokens (or more, after a
// lowered limit); busy: the rest are reserved or known taken.
func (s *Store) freeToken(limit int, held map[int]string, key func(int) string, taken map[string]bool) (idx int, full, busy bool) {
	if len(held) >= limit {
		return 0, true, false
	}
	free := func(i int) bool {
		if _, h := held[i]; h {
			return false
		}
		k := key(i)
		if taken[k] {
			return false
		}
		_, r := s.reserved[k]
		return !r
	}
	for range 16 {
		i := rand.IntN(limit)
		if free(i) {
			return i, false, false
		}
	}
	start := rand.IntN(limit)
	for n := range limit {
		i := (start + n) % limit
		if free(i) {
			return i, false, false
		}
	}
	return 0, false, true
}

// syncNow waits until the view reflects etcd's current revision.
func (s *Store) syncNow(ctx context.Context) error {
	resp, err := s.cli.Get(ctx, s.k.settingAdmission(), clientv3.WithCountOnly())
	if err != nil {
		return translate(err)
	}
	return s.WaitSynced(ctx, resp.Header.Revision)
}

func (s *Store) unreserve(keys ...string) {
	s.resMu.Lock()
	for _, k := range keys {
		delete(s.reserved, k)
	}
	close(s.resFreed)
	s.resFreed = make(chan struct{})
	s.resMu.Unlock()
}
