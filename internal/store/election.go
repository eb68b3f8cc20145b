package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Elector campaigns for leadership of one jobfence cluster. Each term runs
// on its own session (lease): Resign ends the session, so the next Campaign
// starts a fresh one, and a lost session (Done) ends the term.
type Elector struct {
	cli       *clientv3.Client
	prefix    string
	replicaID string
	ttl       time.Duration

	mu       sync.Mutex
	session  *concurrency.Session
	election *concurrency.Election
}

// NewElector prepares an elector for the cluster under prefix (the store's
// Config.Prefix); ttl is the session lease, rounded up to whole seconds.
func NewElector(cli *clientv3.Client, prefix, replicaID string, ttl time.Duration) (*Elector, error) {
	if cli == nil || prefix == "" || replicaID == "" {
		return nil, errors.New("elector: client, prefix and replica id are required")
	}
	if ttl < time.Second {
		ttl = time.Second
	}
	return &Elector{cli: cli, prefix: prefix, replicaID: replicaID, ttl: ttl}, nil
}

func (e *Elector) ensureSession(ctx context.Context) (*concurrency.Election, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.session != nil {
		select {
		case <-e.session.Done():
			e.session = nil
		default:
			return e.election, nil
		}
	}
	secs := int((e.ttl + time.Second - 1) / time.Second)
	sess, err := concurrency.NewSession(e.cli, concurrency.WithTTL(secs), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, translate(err)
	}
	e.session = sess
	e.election = concurrency.NewElection(sess, ElectionPrefix(e.prefix))
	return e.election, nil
}

// Campaign blocks until this replica leads (or ctx ends) and returns the
// Leadership every leader-only write compares.
func (e *Elector) Campaign(ctx context.Context) (Leadership, error) {
	el, err := e.ensureSession(ctx)
	if err != nil {
		return Leadership{}, err
	}
	if err := el.Campaign(ctx, e.replicaID); err != nil {
		// A campaign given up ends its session too, so nothing keeps the
		// lease alive for a replica that stopped campaigning.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = e.Resign(rctx)
		cancel()
		return Leadership{}, translate(err)
	}
	return Leadership{Key: el.Key(), Rev: el.Rev(), ID: e.replicaID}, nil
}

// Done is closed when the current session is lost (lease expired or
// closed); a nil-session elector returns a closed channel.
func (e *Elector) Done() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.session == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return e.session.Done()
}

// Resign gives leadership up and ends the session, so another replica can
// lead at once instead of after the TTL.
func (e *Elector) Resign(ctx context.Context) error {
	e.mu.Lock()
	sess, el := e.session, e.election
	e.session, e.election = nil, nil
	e.mu.Unlock()
	if sess == nil {
		return nil
	}
	var rerr error
	select {
	case <-sess.Done():
	default:
		rerr = translate(el.Resign(ctx))
	}
	sess.Orphan()
	// Revoke the lease so keys tied to it vanish now.
	_, err := e.cli.Revoke(ctx, sess.Lease())
	if rerr == nil && err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		rerr = translate(err)
	}
	return rerr
}

// Close ends the session without resigning explicitly (the lease revoke
// removes the election key all the same).
func (e *Elector) Close() error {
	return e.Resign(context.Background())
}

// Leader returns the current leader's replica id and its election revision.
func (e *Elector) Leader(ctx context.Context) (string, int64, error) {
	resp, err := e.cli.Get(ctx, ElectionPrefix(e.prefix)+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", 0, translate(err)
	}
	if len(resp.Kvs) == 0 {
		return "", 0, nil
	}
	return string(resp.Kvs[0].Value), resp.Kvs[0].CreateRevision, nil
}
