package chaos

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// event is one key change as etcd's watch delivered it.
type event struct {
	Rev       int64 // ModRevision of the change
	CreateRev int64
	Key       string
	Value     []byte
	Delete    bool
}

// history is every change under the prefix since revision 1, from a watch
// the harness keeps open for the whole run (so a later compaction loses
// nothing already seen). Only the harness reads etcd directly.
type history struct {
	mu      sync.Mutex
	events  []event
	seen    int64 // highest revision the watch has confirmed
	err     error
	cancel  context.CancelFunc
	stopped chan struct{}
}

func watchHistory(t *testing.T, cli *clientv3.Client) *history {
	ctx, cancel := context.WithCancel(context.Background())
	h := &history{cancel: cancel, stopped: make(chan struct{})}
	t.Cleanup(h.stop)
	go func() {
		defer close(h.stopped)
		rev := int64(1)
		for ctx.Err() == nil {
			wc := cli.Watch(clientv3.WithRequireLeader(ctx), prefix+"/", clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithProgressNotify())
			for wr := range wc {
				if err := wr.Err(); err != nil {
					h.mu.Lock()
					h.err = err
					h.mu.Unlock()
					break
				}
				h.mu.Lock()
				for _, ev := range wr.Events {
					h.events = append(h.events, event{Rev: ev.Kv.ModRevision, CreateRev: ev.Kv.CreateRevision,
						Key: string(ev.Kv.Key), Value: ev.Kv.Value, Delete: ev.Type == clientv3.EventTypeDelete})
					rev = ev.Kv.ModRevision + 1
				}
				if wr.Header.Revision > h.seen {
					h.seen = wr.Header.Revision
				}
				h.mu.Unlock()
			}
			// The server went away (a restart of the embedded member) or
			// the stream broke: resume after the last revision seen.
			if ctx.Err() == nil {
				t := time.NewTimer(200 * time.Millisecond)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
		}
	}()
	return h
}

func (h *history) stop() {
	h.cancel()
	<-h.stopped
}

// catchUp waits until the watch has confirmed the cluster's current revision.
func (h *history) catchUp(cli *clientv3.Client, within time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var target int64
	if !poll(within, func() bool {
		resp, err := cli.Get(ctx, prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false
		}
		target = resp.Header.Revision
		return true
	}) {
		return false
	}
	return poll(within, func() bool {
		_ = cli.RequestProgress(clientv3.WithRequireLeader(ctx)) // the watch stream is keyed by its metadata
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.seen >= target
	})
}

func (h *history) snapshot() []event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]event(nil), h.events...)
}
