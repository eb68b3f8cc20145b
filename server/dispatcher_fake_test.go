package server

import (
	"context"
	"errors"
	"sync"
)

// fakeAgents plays the agents' HTTP API in-process. Each answer is decided
// by a function the test sets; every call is recorded.
type fakeAgents struct {
	mu         sync.Mutex
	dispatches []AgentDispatch
	addresses  []string
	tombstones []string // invocation ids asked about
	// onDispatch decides the answer to a send; nil accepts.
	onDispatch func(AgentDispatch) error
	// onTombstone decides the answer to a tombstone query; nil answers tombstoned.
	onTombstone func(invocationID, epoch string) (string, error)
}

var errTransport = errors.New("connection reset by peer")

func (f *fakeAgents) Dispatch(ctx context.Context, address string, d AgentDispatch) error {
	f.mu.Lock()
	f.dispatches = append(f.dispatches, d)
	f.addresses = append(f.addresses, address)
	fn := f.onDispatch
	f.mu.Unlock()
	if fn != nil {
		return fn(d)
	}
	return nil
}

func (f *fakeAgents) Tombstone(ctx context.Context, address, invocationID, epoch string) (string, error) {
	f.mu.Lock()
	f.tombstones = append(f.tombstones, invocationID)
	fn := f.onTombstone
	f.mu.Unlock()
	if fn != nil {
		return fn(invocationID, epoch)
	}
	return InvocationTombstoned, nil
}

func (f *fakeAgents) sent() []AgentDispatch {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]AgentDispatch(nil), f.dispatches...)
}

func (f *fakeAgents) asked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tombstones...)
}

func (f *fakeAgents) set(onDispatch func(AgentDispatch) error, onTombstone func(string, string) (string, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onDispatch = onDispatch
	f.onTombstone = onTombstone
}
