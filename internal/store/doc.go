// Package store is the only code that reads or writes jobfence's etcd data.
//
// # Keys
//
// keys.go spells every key and opens with the schema. Everything lives under
// Config.Prefix, so several clusters (or tests) share one etcd.
//
// # Transactions
//
// Every transition is one transaction built from what a pure function in
// package jobs returned (the new record and its Effects):
//
//   - the record is compared by ModRevision (or CreateRevision = 0 to create);
//   - leader-only writes also compare CreateRevision(Leadership.Key) =
//     Leadership.Rev, so a deposed leader's write changes nothing and returns
//     jobs.ErrNotLeader;
//   - fence, quota token and slot keys are taken (compared CreateRevision = 0)
//     or released in the same transaction as the record; a release is a
//     nested transaction deleting the key only while it still names the job.
//
// A lost compare writes nothing and comes back typed: jobs.ErrStale,
// *jobs.FenceHeldError, *jobs.QuotaExhaustedError, jobs.ErrNotLeader. etcd's
// own errors are translated at this boundary.
//
// # Revisions
//
// A record does not know the revision of the transaction that writes it, so
// the newest history entry (and markRunning's dispatch revision) is stored as
// 0 and filled with the record's ModRevision when it is decoded; the next
// transition starts from that decoded record, so the filled value is stored
// from then on. Job.Revision is always the ModRevision it was read at.
//
// # Quota
//
// Each level (global, each scope) is a pool of token keys 0..limit-1. An
// admission picks a free token of each level at random from the view,
// skipping tokens this replica is already trying, and compares both
// CreateRevision = 0 with the fence. There is no shared counter to fight
// over, and a limit is exact because a level has no more keys than its limit.
//
// # Read model
//
// Run lists the prefix at revision R, then watches from R+1. A compaction, a
// failed watch, or a value it cannot apply makes it list again. A job value
// that cannot be decoded, or an unresolved record without a target, is kept
// as a CorruptRecord: admission fails closed until ForceRelease removes it.
// Every write answers only after WaitSynced saw its revision, so a client
// reads its own writes from the same replica.
//
// The view keeps a summary of every job (state, scope, target, agent,
// update time, revision) and the whole record only of an active one:
// unresolved, or holding a slot. A resolved record changes only by a late
// report or its removal, so Get and List read it from etcd when asked, and
// a replica's memory follows its working set rather than its retained
// history. A restart reads only the summary's members of a resolved record.
//
// # Leadership
//
// Elector wraps concurrency.Session and concurrency.Election under
// <prefix>/election. A term's Leadership (election key and its create
// revision) is passed to every leader-only write. Leases only show
// leadership and liveness: they never release a fence, quota token or slot.
//
// # Replicas
//
// ReplicaRegistration writes <prefix>/replicas/<id> (id, API URL, start
// time) once, bound to a lease with the election TTL, and revokes it on a
// clean stop. Keepalives are not revisions, so an idle cluster's revision
// stands still; a replica that died leaves the list when its lease expires.
// The view lists the registered replicas for the dashboard, which asks each
// one's /readyz for its cursor.
package store
