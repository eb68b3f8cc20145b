package store

import (
	"sync"

	"jobfence/jobs"
)

// blockedReasons says why PENDING jobs are not dispatched (a missing
// credential profile, no eligible agent). It lives only in this replica's
// memory: the leader's dispatcher sets it every round, so it is never written
// to etcd and a re-list or a leader change loses nothing that is not
// recomputed within one round.
type blockedReasons struct {
	mu sync.Mutex
	m  map[string]string
}

func (b *blockedReasons) set(id, reason string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if reason == "" {
		delete(b.m, id)
		return
	}
	if b.m == nil {
		b.m = map[string]string{}
	}
	b.m[id] = reason
}

// decorate fills j.BlockedReason on a copy handed to a caller. The reason is
// shown only while the job is PENDING.
func (b *blockedReasons) decorate(j *jobs.Job) *jobs.Job {
	if j.State != jobs.Pending {
		return j
	}
	b.mu.Lock()
	j.BlockedReason = b.m[j.ID]
	b.mu.Unlock()
	return j
}

// SetBlockedReason records (or, with "", clears) why a PENDING job is not
// dispatched; reads (Get, List, Jobs) then show it as blocked_reason.
func (s *Store) SetBlockedReason(id, reason string) {
	s.blocked.set(id, reason)
}
