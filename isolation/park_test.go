//go:build linux

package isolation

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A check that fails while the worker is parked at its exec stop kills it
// there: the command never runs an instruction (its first action would have
// left a file), the result says so, and the domain is still reaped, seen
// empty and removed.
func TestFailedParkCheckNeverRunsTheCommand(t *testing.T) {
	h := testHost(t)
	marker := filepath.Join(t.TempDir(), "ran")
	d, err := createDomain(h.l, "d."+h.Epoch()+".parkfail", 64<<20, 16)
	if err != nil {
		t.Fatal(err)
	}
	// A limit that no longer reads what was written, as if changed behind
	// the agent's back between creation and start.
	d.checks = append(d.checks, limitCheck{Path: d.checks[0].Path, Want: "1"})
	s := spec(t, "parkfail", "/bin/sh", "-c", "echo ran > "+marker)
	res, err := h.runDomain(context.Background(), d, s)
	if err != nil {
		t.Fatal(err)
	}
	if res.Launched || !strings.Contains(res.Rejection, "limits") || !res.ReapProof() || !res.Removed {
		t.Fatalf("want a rejection at the park, got %+v", res)
	}
	if res.Signal != syscall.SIGKILL {
		t.Fatalf("the parked worker ended with %+v, not SIGKILL", res)
	}
	if _, err := os.Stat(marker); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the command ran: %v", err)
	}
}
