package server

import (
	"testing"

	"go.uber.org/goleak"

	"jobfence/handlers"
	"jobfence/internal/etcdtest"
)

// A stopped server leaves no goroutine behind: read model, election session,
// HTTP server, event streams and its etcd client all end with Run.
func TestServerStopLeavesNoGoroutines(t *testing.T) {
	etcdtest.New(t) // the shared member's goroutines predate the snapshot
	snapshot := goleak.IgnoreCurrent()
	h := startAPI(t, nil)
	h.admit("leak/t")
	h.do("GET", "/v1/status", handlers.RoleViewer, nil)
	h.client.CloseIdleConnections()
	h.stop()
	goleak.VerifyNone(t, snapshot)
}
