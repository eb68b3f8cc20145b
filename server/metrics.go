package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"jobfence/internal/logging"
	"jobfence/internal/metrics"
	"jobfence/internal/store"
)

// Metrics is this replica's Prometheus metrics, served at /metrics (nil
// before New).
func (s *Server) Metrics() *metrics.Server { return s.metrics }

// Redactor is the secret set this replica's logs are scrubbed of. It is
// Config.Redactor, or one of the server's own when none was given.
func (s *Server) Redactor() *logging.Redactor { return s.cfg.Redactor }

// snapshot is the scrape-time view of the read-model gauges.
func snapshot(st *store.Store) func() metrics.Snapshot {
	return func() metrics.Snapshot {
		counts := st.Counts()
		byState := make(map[string]int, len(counts))
		for k, v := range counts {
			byState[string(k)] = v
		}
		return metrics.Snapshot{LagRevisions: st.Cursor().Lag, Jobs: byState, FencesHeld: len(st.Fences())}
	}
}

// PhaseRecorder is what a dispatcher round reports its phase durations to;
// *metrics.Server is one.
type PhaseRecorder interface {
	ObservePhase(phase string, d time.Duration)
}

// observePhase records the time since start for one round phase (a
// metrics.Phase* value); a nil recorder records nothing.
func observePhase(r PhaseRecorder, phase string, start time.Time) {
	if r != nil {
		r.ObservePhase(phase, time.Since(start))
	}
}

// DispatchClassification maps what AgentClient.Dispatch returned to its
// jobfence_dispatch_outcomes_total label.
func DispatchClassification(err error) string {
	var refusal *RefusalError
	switch {
	case err == nil:
		return metrics.DispatchEnqueued
	case errors.As(err, &refusal):
		return metrics.DispatchRefused
	}
	return metrics.DispatchUnknown
}

// recentSecrets bounds how many dispatch secrets stay registered with the
// redactor: a secret is only ever at risk while its dispatch is in flight
// and shortly after, and the set must not grow with every job ever sent.
const recentSecrets = 4096

// instrumentedAgents counts each send by classification and registers the
// send's secret and credential values with the redactor before any part
// could log them.
type instrumentedAgents struct {
	next    AgentClient
	metrics *metrics.Server
	secrets *logging.Redactor

	mu     sync.Mutex
	recent []string
}

// InstrumentAgents wraps the dispatcher's agent client with this replica's
// dispatch-outcome metric and secret registration.
func (s *Server) InstrumentAgents(c AgentClient) AgentClient {
	return &instrumentedAgents{next: c, metrics: s.metrics, secrets: s.cfg.Redactor}
}

func (a *instrumentedAgents) Dispatch(ctx context.Context, address string, d AgentDispatch) error {
	a.remember(d)
	err := a.next.Dispatch(ctx, address, d)
	a.metrics.DispatchOutcome(DispatchClassification(err))
	return err
}

func (a *instrumentedAgents) Tombstone(ctx context.Context, address, invocationID, epoch string) (string, error) {
	return a.next.Tombstone(ctx, address, invocationID, epoch)
}

func (a *instrumentedAgents) remember(d AgentDispatch) {
	if a.secrets == nil {
		return
	}
	// Credential values are registered for good: the profiles file bounds
	// them, and a value must stay hidden as long as it may be in use.
	for _, v := range d.Credentials {
		a.secrets.Add(v)
	}
	if d.Secret == "" {
		return
	}
	a.secrets.Add(d.Secret)
	a.mu.Lock()
	a.recent = append(a.recent, d.Secret)
	var drop []string
	if len(a.recent) > recentSecrets {
		drop = append(drop, a.recent[0])
		a.recent = a.recent[1:]
	}
	a.mu.Unlock()
	a.secrets.Remove(drop...)
}

// transitionCounter feeds the store's transition hook into the metric.
func transitionCounter(m *metrics.Server) func(string) {
	return func(e string) { m.Transition(e) }
}
