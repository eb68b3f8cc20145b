package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ReplicaInfo is one replica's entry in the registry: enough for another
// replica to ask it for its read-model cursor. It holds no credential.
type ReplicaInfo struct {
	ID string `json:"id"`
	// URL is the replica's API base URL as the other replicas reach it
	// (--advertise-url).
	URL       string    `json:"url"`
	StartedAt time.Time `json:"started_at"`
}

// Replicas lists the registered replicas in id order, as the read model
// knows them. A replica that died stays listed until its lease expires.
func (s *Store) Replicas() []ReplicaInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]ReplicaInfo, 0, len(s.v.replicas))
	for _, r := range s.v.replicas {
		out = append(out, r)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// ReplicaRegistration keeps this replica's key under <prefix>/replicas/.
//
// The key is written once per lease and bound to it; the lease's keepalives
// are not writes, so an idle cluster's etcd revision stands still. A replica
// that stops revokes the lease (the key goes at once); one that dies leaves
// the key to expire with the lease. A lost lease (an etcd partition longer
// than the TTL) is replaced by a new one and the key written again, once.
type ReplicaRegistration struct {
	cli  *clientv3.Client
	k    keys
	info ReplicaInfo
	ttl  int
	log  *slog.Logger

	mu    sync.Mutex
	lease clientv3.LeaseID
	first *concurrency.Session // from Register, for Run to keep
}

// NewReplicaRegistration prepares the registration of info under prefix
// (the store's Config.Prefix); ttl is the lease, rounded up to whole
// seconds (the server passes its election TTL). A nil logger discards.
func NewReplicaRegistration(cli *clientv3.Client, prefix string, info ReplicaInfo, ttl time.Duration, lg *slog.Logger) (*ReplicaRegistration, error) {
	var errs []error
	if cli == nil {
		errs = append(errs, errors.New("replica registration: client is required"))
	}
	if prefix == "" {
		errs = append(errs, errors.New("replica registration: prefix is required"))
	}
	if info.ID == "" || info.URL == "" {
		errs = append(errs, errors.New("replica registration: replica id and url are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	secs := max(1, int((ttl+time.Second-1)/time.Second))
	return &ReplicaRegistration{cli: cli, k: keys{prefix: prefix}, info: info, ttl: secs, log: lg}, nil
}

// currentLease is the lease the key is bound to now (0 while unregistered).
func (r *ReplicaRegistration) currentLease() clientv3.LeaseID {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// Register makes one attempt to register now, so a server is listed before
// it serves; Run keeps what it made. Without it (or after its failure) Run
// registers by itself.
func (r *ReplicaRegistration) Register(ctx context.Context) error {
	sess, err := r.register(ctx)
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.first = sess
	r.mu.Unlock()
	return nil
}

// Run registers (unless Register did), registers again whenever the lease
// is lost, and revokes the lease when ctx ends. It returns nil when ctx
// ends.
func (r *ReplicaRegistration) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	r.mu.Lock()
	sess := r.first
	r.first = nil
	r.mu.Unlock()
	for ctx.Err() == nil {
		var err error
		if sess == nil {
			sess, err = r.register(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			r.log.Warn("replica_register_failed", "replica_id", r.info.ID, "err", err.Error())
			pause(ctx, backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		select {
		case <-ctx.Done():
			r.revoke(sess)
			return nil
		case <-sess.Done():
			r.mu.Lock()
			r.lease = 0
			r.mu.Unlock()
			r.log.Warn("replica_lease_lost", "replica_id", r.info.ID)
		}
		sess = nil
	}
	if sess != nil {
		r.revoke(sess)
	}
	return nil
}

// register grants a lease with its keepalive and writes the key on it.
func (r *ReplicaRegistration) register(ctx context.Context) (*concurrency.Session, error) {
	// The session's keepalive must outlive ctx's cancellation until the
	// revoke, which needs the lease it keeps.
	sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(r.ttl), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, translate(err)
	}
	if err := r.put(ctx, sess.Lease()); err != nil {
		r.revoke(sess)
		return nil, err
	}
	r.mu.Lock()
	r.lease = sess.Lease()
	r.mu.Unlock()
	r.log.Info("replica_registered", "replica_id", r.info.ID, "url", r.info.URL)
	return sess, nil
}

// put writes the key on lease: created when absent, taken over when a
// predecessor with this id left it behind (its lease not yet expired).
func (r *ReplicaRegistration) put(ctx context.Context, lease clientv3.LeaseID) error {
	raw, err := json.Marshal(r.info)
	if err != nil {
		return err
	}
	key := r.k.replica(r.info.ID)
	put := clientv3.OpPut(key, string(raw), clientv3.WithLease(lease))
	cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	for range 3 {
		resp, err := r.cli.Txn(ctx).If(cmp).Then(put).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return translate(err)
		}
		if resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		cmp = clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)
	}
	return fmt.Errorf("replica key %s: %w", r.info.ID, errConflict)
}

// revoke ends the session and its lease, so the key goes now rather than
// after the TTL.
func (r *ReplicaRegistration) revoke(sess *concurrency.Session) {
	sess.Orphan()
	r.mu.Lock()
	r.lease = 0
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, sess.Lease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		r.log.Warn("replica_revoke_failed", "replica_id", r.info.ID, "err", translate(err).Error())
	}
}
