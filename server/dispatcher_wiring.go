package server

import (
	"context"
	"errors"
	"sync"

	"jobfence/internal/store"
)

// EnableDispatch makes this replica run the dispatcher while it leads, over
// the store Run opens. Call it after New and before Run; it replaces
// Config.OnLeader. The dispatch token is read now, so a missing file fails
// at start and not at the first election.
func (s *Server) EnableDispatch(dc DispatchConfig) error {
	if err := dc.Validate(); err != nil {
		return err
	}
	client, err := NewHTTPAgentClient(dc.DispatchTokenFile)
	if err != nil {
		return err
	}
	client.UseTLS(s.AgentTLS())
	var (
		once sync.Once
		d    *Dispatcher
		derr error
	)
	lg := s.cfg.Logger.With("component", "dispatcher")
	s.cfg.OnLeader = func(ctx context.Context, l store.Leadership) error {
		once.Do(func() {
			st := s.Store()
			if st == nil {
				derr = errors.New("dispatcher: the store is not open")
				return
			}
			opts := DispatcherOptions{Config: dc, Store: st, Agents: s.InstrumentAgents(client), Logger: lg, Now: s.cfg.Now}
			if m := s.Metrics(); m != nil {
				opts.Phases = m
			}
			d, derr = NewDispatcher(opts)
		})
		if derr != nil {
			return derr
		}
		return d.Run(ctx, l)
	}
	return nil
}
