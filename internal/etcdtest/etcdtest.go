// Package etcdtest gives tests one embedded etcd per test binary and a key
// prefix per test, so tests share a real server without seeing each other.
package etcdtest

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/internal/etcdembed"
)

var (
	once    sync.Once
	server  *etcdembed.Server
	dataDir string
	initErr error
	counter atomic.Int64
)

// New returns the client of this test binary's embedded etcd, starting it on
// first use. The member lives until the process exits (or Shutdown is called
// from TestMain); its data dir is a temporary directory.
func New(t testing.TB) *clientv3.Client {
	t.Helper()
	once.Do(func() {
		dataDir, initErr = os.MkdirTemp("", "jobfence-etcdtest-")
		if initErr != nil {
			return
		}
		server, initErr = etcdembed.Start(etcdembed.Config{DataDir: dataDir, UnsafeNoFsync: true})
	})
	if initErr != nil {
		t.Fatalf("etcdtest: %v", initErr)
	}
	return server.Client
}

// Endpoint is the running member's client URL ("" before New).
func Endpoint() string {
	if server == nil {
		return ""
	}
	return server.Endpoint
}

// Shutdown stops the member and removes its data; call it from TestMain after
// m.Run so goroutine-leak checks see a quiet process.
func Shutdown() {
	if server != nil {
		_ = server.Close()
		server = nil
	}
	if dataDir != "" {
		_ = os.RemoveAll(dataDir)
	}
}

// Prefix returns a key prefix no other test in this binary uses.
func Prefix(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return fmt.Sprintf("/t%d-%s", counter.Add(1), name)
}
