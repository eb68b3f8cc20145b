package web

import (
	"strings"
	"testing"
	"time"

	"jobfence/internal/store"
	"jobfence/jobs"
)

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                     "/",
		"/fences":              "/fences",
		"/jobs?state=UNKNOWN":  "/jobs?state=UNKNOWN",
		"//evil.example/":      "/",
		"/\t/evil.example/":    "/",
		"/\n/evil.example/":    "/",
		"/\\evil.example/":     "/",
		"https://evil.example": "/",
		"fences":               "/",
		"/ /x":                 "/",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestValidNote(t *testing.T) {
	for note, ok := range map[string]bool{
		"checked by hand":         true,
		"":                        false,
		strings.Repeat("x", 1024): true,
		strings.Repeat("x", 1025): false,
		"line\nbreak":             false,
		"rtl\u202eoverride":       false,
		"zero\u200dwidth joiner":  false,
		"nul\x00":                 false,
		"\xff not utf-8":          false,
		"ünïcödé is fine, 日本語も":   true,
	} {
		if got := validNote(note) == ""; got != ok {
			t.Errorf("validNote(%q) accepted=%v, want %v", note, got, ok)
		}
	}
}

func TestFenceReasonInWords(t *testing.T) {
	failed := &jobs.Job{History: []jobs.HistoryEntry{
		{Event: jobs.EventRefreshFailed, Detail: "first error"},
		{Event: jobs.EventRefreshRunning},
		{Event: jobs.EventRefreshFailed, Detail: "hook answered 502"},
	}}
	cases := []struct {
		f    store.Fence
		j    *jobs.Job
		want string
	}{
		{store.Fence{State: jobs.Pending}, &jobs.Job{BlockedReason: "credential profile warehouse-rw is missing"}, "waiting for dispatch: credential profile warehouse-rw is missing"},
		{store.Fence{State: jobs.Running}, nil, "waiting for the result"},
		{store.Fence{State: jobs.Unknown}, nil, "UNKNOWN: needs an operator"},
		{store.Fence{State: jobs.Committed, RefreshState: jobs.RefreshFailed}, failed, "refresh FAILED: hook answered 502"},
		{store.Fence{State: jobs.NotCommitted, RefreshState: jobs.RefreshFailed}, nil, "refresh FAILED: no error recorded"},
		{store.Fence{State: jobs.Committed, RefreshState: jobs.RefreshRequired}, nil, "refresh owed: waiting for the leader to call the hook"},
	}
	for _, c := range cases {
		if got := fenceReason(c.f, c.j); got != c.want {
			t.Errorf("fenceReason(%s/%s) = %q, want %q", c.f.State, c.f.RefreshState, got, c.want)
		}
	}
}

// TestDomainStatementIsHonest: only a recorded proof lets the dialog say the
// worker domain is gone.
func TestDomainStatementIsHonest(t *testing.T) {
	d := &jobs.Dispatch{AgentID: "agent-9"}
	cases := []struct {
		slot  jobs.Slot
		disp  *jobs.Dispatch
		alive bool
		words string
	}{
		{jobs.Slot{Held: true, AgentID: "agent-9"}, d, true, "may still be alive"},
		{jobs.Slot{Proof: jobs.ProofChildReaped}, d, false, "was reaped"},
		{jobs.Slot{Proof: jobs.ProofAgentEpochReplaced}, d, false, "AGENT_EPOCH_REPLACED"},
		{jobs.Slot{Proof: jobs.ProofNotEnqueued}, d, false, "never ran"},
		{jobs.Slot{Proof: jobs.ProofNeverLaunched}, d, false, "never launched"},
		{jobs.Slot{Proof: jobs.ProofForceReleased}, d, true, "nothing proves"},
		{jobs.Slot{Proof: jobs.ProofNone}, d, true, "may still be alive"},
		{jobs.Slot{Proof: jobs.ProofNone}, nil, false, "never dispatched"},
	}
	for _, c := range cases {
		words, alive := domainStatement(&jobs.Job{Slot: c.slot, Dispatch: c.disp})
		if alive != c.alive || !strings.Contains(words, c.words) {
			t.Errorf("slot %+v: alive=%v %q, want alive=%v and %q", c.slot, alive, words, c.alive, c.words)
		}
	}
}

func TestForceReleasable(t *testing.T) {
	for _, c := range []struct {
		j    *jobs.Job
		want bool
	}{
		{nil, false},
		{&jobs.Job{State: jobs.Unknown}, true},
		{&jobs.Job{State: jobs.Unknown, Resolved: true}, false},
		{&jobs.Job{State: jobs.Committed, RefreshState: jobs.RefreshFailed}, true},
		{&jobs.Job{State: jobs.Committed, RefreshState: jobs.RefreshRequired}, false},
		{&jobs.Job{State: jobs.Running}, false},
		{&jobs.Job{State: jobs.Pending}, false},
	} {
		if got := forceReleasable(c.j); got != c.want {
			t.Errorf("forceReleasable(%+v) = %v, want %v", c.j, got, c.want)
		}
	}
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{
		5 * time.Second:             "5s ago",
		3 * time.Minute:             "3m ago",
		2*time.Hour + 5*time.Minute: "2h05m ago",
		72 * time.Hour:              "3d ago",
		-47 * time.Second:           "in 47s",
	} {
		if got := age(d); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestConfigValidateListsEveryProblem(t *testing.T) {
	err := Config{PageSize: 501, KeepAlive: -time.Second}.Validate()
	if err == nil {
		t.Fatal("an empty Config validated")
	}
	for _, want := range []string{"Store is required", "Authenticate is required", "PageSize", "negative"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %q, lacks %q", err, want)
		}
	}
}
