package etcdtest

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Shutdown()
	os.Exit(code)
}

func TestSharedMemberAndDistinctPrefixes(t *testing.T) {
	c1, c2 := New(t), New(t)
	if c1 != c2 {
		t.Fatal("New started a second member")
	}
	p1, p2 := Prefix(t), Prefix(t)
	if p1 == p2 || !strings.HasPrefix(p1, "/") || strings.HasSuffix(p1, "/") {
		t.Fatalf("prefixes %q %q", p1, p2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c1.Put(ctx, p1+"/k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := c1.Get(ctx, p2+"/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatalf("prefix %s sees keys of %s", p2, p1)
	}
}
