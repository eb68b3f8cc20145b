package server

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/handlers"
	"jobfence/internal/store"
)

// leaderState is what this replica knows about leadership, for /v1/status
// and for tests that drive leader-only transitions.
type leaderState struct {
	mu   sync.Mutex
	info handlers.LeaderInfo
	l    store.Leadership
	held bool
	el   *store.Elector
}

// get answers from memory while this replica leads, and asks the election
// otherwise, so a follower's status names the leader too.
func (ls *leaderState) get() handlers.LeaderInfo {
	ls.mu.Lock()
	info, held, el := ls.info, ls.held, ls.el
	ls.mu.Unlock()
	if held || el == nil {
		return info
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	id, rev, err := el.Leader(ctx)
	if err != nil {
		return handlers.LeaderInfo{}
	}
	return handlers.LeaderInfo{ID: id, ElectionRevision: rev}
}

func (ls *leaderState) set(l store.Leadership, held bool, since time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.l, ls.held = l, held
	if l.ID == "" {
		ls.info = handlers.LeaderInfo{}
		return
	}
	if ls.info.ID != l.ID || ls.info.ElectionRevision != l.Rev {
		ls.info = handlers.LeaderInfo{ID: l.ID, Since: since, ElectionRevision: l.Rev}
	}
}

// Leadership returns this replica's leadership while it holds it.
func (s *Server) Leadership() (store.Leadership, bool) {
	s.leader.mu.Lock()
	defer s.leader.mu.Unlock()
	return s.leader.l, s.leader.held
}

// campaignRetry spaces campaigns after an etcd error.
const campaignRetry = time.Second

// lead campaigns until ctx ends. While elected it runs OnLeader; it gives
// leadership up (resigns) when the hook returns, the session is lost or ctx
// ends, so a stopping replica hands over without waiting for the TTL.
func (s *Server) lead(ctx context.Context, cli *clientv3.Client, st *store.Store) error {
	el, err := store.NewElector(cli, s.cfg.Prefix, s.cfg.ReplicaID, s.cfg.ElectionTTL)
	if err != nil {
		return err
	}
	s.leader.mu.Lock()
	s.leader.el = el
	s.leader.mu.Unlock()
	// Close revokes the session of a campaign that never won, so its lease
	// keep-alive stops with the server.
	defer func() {
		if err := el.Close(); err != nil {
			s.cfg.Logger.Warn("election_close_failed", "err", err.Error())
		}
	}()
	lg := s.cfg.Logger
	for ctx.Err() == nil {
		l, err := el.Campaign(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			lg.Warn("campaign_failed", "err", err.Error())
			t := time.NewTimer(campaignRetry)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		s.leader.set(l, true, s.cfg.Now().UTC())
		s.metrics.SetLeader(true)
		lg.Info("leadership_won", "replica_id", s.cfg.ReplicaID, "election_revision", l.Rev)

		termCtx, endTerm := context.WithCancel(ctx)
		hookDone := make(chan struct{})
		go func() {
			defer close(hookDone)
			if s.cfg.OnLeader == nil {
				<-termCtx.Done()
				return
			}
			if err := s.cfg.OnLeader(termCtx, l); err != nil && termCtx.Err() == nil {
				lg.Error("leader_hook_failed", "err", err.Error())
			}
		}()
		select {
		case <-el.Done():
			lg.Warn("leadership_lost", "replica_id", s.cfg.ReplicaID)
		case <-ctx.Done():
		case <-hookDone:
		}
		endTerm()
		<-hookDone
		s.leader.set(store.Leadership{}, false, time.Time{})
		s.metrics.SetLeader(false)
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := el.Resign(rctx); err != nil {
			lg.Warn("resign_failed", "err", err.Error())
		}
		cancel()
	}
	return nil
}
