package server

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/internal/store"
)

// elect wins this test's election and returns the leadership every
// leader-only write compares.
func elect(t *testing.T, ctx context.Context, cli *clientv3.Client, prefix, id string) store.Leadership {
	t.Helper()
	e, err := store.NewElector(cli, prefix, id, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := e.Campaign(cctx)
	if err != nil {
		t.Fatalf("campaign: %v", err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return l
}

// resign removes the election key, as a lost lease would.
func resign(t *testing.T, ctx context.Context, cli *clientv3.Client, l store.Leadership) {
	t.Helper()
	if _, err := cli.Delete(ctx, l.Key); err != nil {
		t.Fatal(err)
	}
}
