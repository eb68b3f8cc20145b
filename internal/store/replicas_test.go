package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"jobfence/internal/etcdtest"
)

// startRegistration runs a registration of id on cli and returns a stop
// that cancels it and waits for Run to return.
func startRegistration(t *testing.T, cli *clientv3.Client, prefix, id string, ttl time.Duration) (*ReplicaRegistration, func()) {
	t.Helper()
	reg, err := NewReplicaRegistration(cli, prefix, ReplicaInfo{ID: id, URL: "http://127.0.0.1:1/" + id, StartedAt: time.Now().UTC()}, ttl, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- reg.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("registration run: %v", err)
		}
	}
	t.Cleanup(stop)
	return reg, stop
}

// replicaKV reads the registry key of id straight from etcd (nil: absent).
func (h *harness) replicaKV(id string) *clientv3.GetResponse {
	h.t.Helper()
	resp, err := h.cli.Get(h.ctx, h.st.k.replica(id))
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

func poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// outlivesTTLTwice watches the lease over twice its granted TTL: without
// keepalives it would have expired within that window, so the window holds
// keepalives and the revision compare around it says they write nothing.
func (h *harness) outlivesTTLTwice(lease clientv3.LeaseID) {
	h.t.Helper()
	start := time.Now()
	var window time.Duration
	poll(h.t.(*testing.T), "an idle window of two lease TTLs", func() bool {
		resp, err := h.cli.TimeToLive(h.ctx, lease)
		if err != nil || resp.TTL < 0 { // -1: gone; 0 is under a second left (whole seconds, truncated)
			h.t.Fatalf("lease %x expired while its registration ran: %+v %v", lease, resp, err)
		}
		window = 2 * time.Duration(resp.GrantedTTL) * time.Second
		return time.Since(start) > window
	})
}

// The key is written once, bound to a lease; keepalives move no revision;
// a stop revokes the lease and the key goes with it.
func TestReplicaRegistrationWriteOnceRevokeOnStop(t *testing.T) {
	h := newHarness(t, nil)
	reg, stop := startRegistration(t, h.cli, h.prefix, "replica a", 3*time.Second) // keepalives every second: a loaded machine does not miss three
	poll(t, "the read model lists the replica", func() bool {
		rs := h.st.Replicas()
		return len(rs) == 1 && rs[0].ID == "replica a" && rs[0].URL == "http://127.0.0.1:1/replica a" && !rs[0].StartedAt.IsZero()
	})
	kv := h.replicaKV("replica a").Kvs[0]
	if lease := clientv3.LeaseID(kv.Lease); lease == 0 || lease != reg.currentLease() {
		t.Fatalf("key lease %x, registration lease %x", kv.Lease, reg.currentLease())
	}
	if kv.Version != 1 {
		t.Fatalf("key written %d times", kv.Version)
	}

	// A value nobody can read is left out of the view; it is not a corrupt
	// record and does not make the view list again.
	if _, err := h.cli.Put(h.ctx, h.st.k.replica("garbled"), "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Put(h.ctx, h.st.k.replica("other"), `{"id":"someone-else","url":"http://x"}`); err != nil {
		t.Fatal(err)
	}
	if err := h.st.WaitSynced(h.ctx, h.etcdRev()); err != nil {
		t.Fatal(err)
	}
	if rs := h.st.Replicas(); len(rs) != 1 || len(h.st.CorruptRecords()) != 0 || h.st.Relists() != 0 {
		t.Fatalf("replicas %+v, corrupt %v, relists %d", rs, h.st.CorruptRecords(), h.st.Relists())
	}

	before := h.etcdRev()
	h.outlivesTTLTwice(clientv3.LeaseID(kv.Lease))
	if after := h.etcdRev(); after != before {
		t.Fatalf("an idle registration moved the etcd revision %d -> %d", before, after)
	}

	stop()
	if n := len(h.replicaKV("replica a").Kvs); n != 0 {
		t.Fatal("the key outlived a stopped registration")
	}
	poll(t, "the read model drops the replica", func() bool {
		for _, r := range h.st.Replicas() {
			if r.ID == "replica a" {
				return false
			}
		}
		return true
	})
}

// A replica that dies (its client gone, no revoke) leaves its key to expire
// with the lease.
func TestReplicaKeyExpiresWithKilledReplicasLease(t *testing.T) {
	h := newHarness(t, nil)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	reg, stop := startRegistration(t, cli, h.prefix, "doomed", time.Second)
	poll(t, "the replica registers", func() bool { return len(h.st.Replicas()) == 1 })
	lease := reg.currentLease()
	if err := cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	poll(t, "the dead replica's key expires", func() bool { return len(h.replicaKV("doomed").Kvs) == 0 })
	poll(t, "the read model drops it", func() bool { return len(h.st.Replicas()) == 0 })
	if resp, err := h.cli.TimeToLive(h.ctx, lease); err != nil || resp.TTL != -1 {
		t.Fatalf("lease %x after expiry: %+v %v", lease, resp, err)
	}
	stop()
}

// A lost lease (as after a partition longer than the TTL) is replaced and
// the key written again on the new one.
func TestReplicaReRegistersAfterLeaseLoss(t *testing.T) {
	h := newHarness(t, nil)
	reg, _ := startRegistration(t, h.cli, h.prefix, "r2", time.Second)
	poll(t, "the replica registers", func() bool { return reg.currentLease() != 0 })
	old := reg.currentLease()
	if _, err := h.cli.Revoke(h.ctx, old); err != nil {
		t.Fatal(err)
	}
	poll(t, "a new lease carries the key", func() bool {
		kvs := h.replicaKV("r2").Kvs
		return len(kvs) == 1 && kvs[0].Lease != 0 && clientv3.LeaseID(kvs[0].Lease) != old
	})
	if l := reg.currentLease(); l == old {
		t.Fatalf("registration still on the revoked lease %x", l)
	}
	poll(t, "the read model lists it again", func() bool { return len(h.st.Replicas()) == 1 })
}

// A predecessor's key under the same id (a restart within the TTL) is taken
// over, not refused.
func TestReplicaRegistrationTakesOverLeftoverKey(t *testing.T) {
	h := newHarness(t, nil)
	g, err := h.cli.Grant(h.ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = h.cli.Revoke(context.Background(), g.ID) })
	if _, err := h.cli.Put(h.ctx, h.st.k.replica("r3"), `{"id":"r3","url":"http://old"}`, clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	reg, _ := startRegistration(t, h.cli, h.prefix, "r3", time.Second)
	poll(t, "the new registration holds the key", func() bool {
		kvs := h.replicaKV("r3").Kvs
		return reg.currentLease() != 0 && len(kvs) == 1 && clientv3.LeaseID(kvs[0].Lease) == reg.currentLease()
	})
	poll(t, "the view shows the new url", func() bool {
		rs := h.st.Replicas()
		return len(rs) == 1 && rs[0].URL == "http://127.0.0.1:1/r3"
	})
}

func TestNewReplicaRegistrationNamesEveryProblem(t *testing.T) {
	_, err := NewReplicaRegistration(nil, "", ReplicaInfo{}, time.Second, nil)
	if err == nil {
		t.Fatal("accepted an empty registration")
	}
	for _, want := range []string{"client", "prefix", "replica id and url"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q missing from %v", want, err)
		}
	}
}
