package etcdembed

import (
	"context"
	"testing"
	"time"
)

// A member survives a restart on the same data dir: what was written is there.
func TestStartWriteRestart(t *testing.T) {
	dir := t.TempDir()
	s, err := Start(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := s.Client.Put(ctx, "/k", "v"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Start(Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	resp, err := s2.Client.Get(ctx, "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart got %v, want /k=v", resp.Kvs)
	}
}

func TestStartNeedsDataDir(t *testing.T) {
	if _, err := Start(Config{}); err == nil {
		t.Fatal("Start without a data dir succeeded")
	}
}
