// Package server is jobfence's composition root: it connects to etcd
// (embedded or external), runs the store's read model, campaigns for
// leadership, serves the HTTP API and the dashboard, and shuts all of it down
// in a written order (see (*Server).Run).
//
// # Leader and followers
//
// Every replica is the same process. Each keeps its own watch-fed read model
// and serves the whole API: admissions, cancels, force releases and agent
// results are identity-compared transactions that any replica may apply.
// What only one replica may do (the dispatcher's rounds: markRunning, the
// deadline and epoch sweeps, the refresh driver, retention) runs inside
// Config.OnLeader, which is called only while this replica holds the
// election (store.Elector, a concurrency.Election on a session whose lease
// TTL is Config.ElectionTTL).
//
//	follower ──Campaign wins──▶ leader: OnLeader(ctx, Leadership) runs
//	leader ──session lost / OnLeader returns / shutdown──▶ ctx cancelled,
//	        hook awaited, Resign (lease revoked) ──▶ follower (campaigns again)
//
// Leader-only writes compare the election key's CreateRevision
// (store.Leadership), so a deposed leader that has not noticed yet changes
// nothing. A lease expiring proves nothing about jobs: it only moves
// leadership. A stopping leader resigns, so the next one is elected at once
// rather than after the TTL; a crashed one is replaced within the TTL.
// Followers show the leader from the election's first key.
package server
