package server

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"

	"jobfence/handlers"
	"jobfence/internal/store"
	"jobfence/web"
)

// dashboard builds the operator pages on the API's store, tokens and leader
// view, so the JSON API and the pages cannot disagree about who may do what.
func dashboard(cfg Config, api *handlers.API, peers *replicaPeers) *web.Dashboard {
	return web.New(web.Config{
		Store: api.Store,
		Authenticate: func(token string) (string, string, bool) {
			p, ok := api.Auth.Authenticate(token)
			return p.Subject, string(p.Role), ok
		},
		Leader: func() (string, time.Time, int64) {
			li := api.LeaderInfo()
			return li.ID, li.Since, li.ElectionRevision
		},
		ReplicaID:     cfg.ReplicaID,
		Replicas:      peers.list,
		QuotaGlobal:   cfg.QuotaGlobal,
		QuotaPerScope: cfg.QuotaPerScope,
		Logger:        cfg.Logger.With("component", "web"),
		Now:           cfg.Now,
	})
}

var _ http.Handler = (*web.Dashboard)(nil)

// Bounds of asking the other replicas for their cursors: an overview waits
// for the slowest peer at most peerTimeout, and renders within peerCacheFor
// of each other share one round of questions.
const (
	peerTimeout   = 300 * time.Millisecond
	peerCacheFor  = time.Second
	peerBodyLimit = 64 << 10
)

// replicaPeers asks every other registered replica for its read-model
// cursor, over /readyz, which needs no credential: no token of any kind is
// sent between replicas.
type replicaPeers struct {
	self     string
	registry func() []store.ReplicaInfo
	client   *http.Client

	mu   sync.Mutex
	at   time.Time
	last []web.Replica
}

// newReplicaPeers verifies https peers with tlsCfg (--tls-ca; nil: the
// system roots).
func newReplicaPeers(self string, registry func() []store.ReplicaInfo, tlsCfg *tls.Config) *replicaPeers {
	tr := &http.Transport{
		Proxy:               nil,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     30 * time.Second,
	}
	if tlsCfg != nil {
		tr.TLSClientConfig = tlsCfg.Clone()
	}
	return &replicaPeers{self: self, registry: registry, client: &http.Client{
		Timeout:   peerTimeout,
		Transport: tr,
		// The answer must come from the registered address itself.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// list is every other registered replica with its cursor, or why there is
// none: a replica that does not answer is shown unreachable, never lag 0.
func (p *replicaPeers) list() []web.Replica {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// A monotonic clock, not Config.Now: a fixed test clock must not freeze
	// the cache.
	if !p.at.IsZero() && time.Since(p.at) < peerCacheFor {
		return p.last
	}
	var peers []store.ReplicaInfo
	for _, r := range p.registry() {
		if r.ID != p.self {
			peers = append(peers, r)
		}
	}
	out := make([]web.Replica, len(peers))
	ctx, cancel := context.WithTimeout(context.Background(), peerTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, r := range peers {
		wg.Go(func() { out[i] = p.ask(ctx, r) })
	}
	wg.Wait()
	p.at, p.last = time.Now(), out
	return out
}

func (p *replicaPeers) ask(ctx context.Context, r store.ReplicaInfo) web.Replica {
	row := web.Replica{ID: r.ID, Unreachable: true, Detail: "did not answer"}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.URL+"/readyz", nil)
	if err != nil {
		row.Detail = "registered address is not usable"
		return row
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return row
	}
	defer resp.Body.Close()
	var body handlers.Ready
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, peerBodyLimit))
		row.Detail = "not ready"
		return row
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, peerBodyLimit)).Decode(&body); err != nil || body.Replica.ID != r.ID {
		row.Detail = "answered as another replica"
		if err != nil {
			row.Detail = "answer not understood"
		}
		return row
	}
	return web.Replica{ID: r.ID, Cursor: body.Replica.Cursor, Lag: body.Replica.Lag}
}
