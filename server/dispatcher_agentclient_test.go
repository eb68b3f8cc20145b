package server

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"jobfence/jobs"
)

// fakeAgentServer answers like an agent's listener with a fixed status and
// problem slug, and remembers the last request.
type fakeAgentServer struct {
	status int
	slug   string
	body   string
	got    chan *http.Request
	bodies chan map[string]any
}

func startFakeAgent(t *testing.T, f *fakeAgentServer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.got = make(chan *http.Request, 1)
	f.bodies = make(chan map[string]any, 1)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		f.got <- r
		f.bodies <- m
		if f.slug != "" {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(f.status)
			_ = json.NewEncoder(w).Encode(map[string]any{"type": "https://jobfence.dev/problems/" + f.slug, "status": f.status})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		_, _ = w.Write([]byte(f.body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func newTestAgentClient(t *testing.T) *HTTPAgentClient {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dispatch-token")
	if err := os.WriteFile(path, []byte("dispatch-token-0123456789\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewHTTPAgentClient(path)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func sampleDispatch() AgentDispatch {
	return AgentDispatch{
		Job: &jobs.Job{ID: "0193a000-0000-7000-8000-000000000001", State: jobs.Running,
			Spec: jobs.Spec{Command: []string{"/bin/true"}, Limits: jobs.Limits{DeadlineSeconds: 60}},
			Dispatch: &jobs.Dispatch{AgentID: "a1", AgentEpoch: "e1", InvocationID: "6b0c1a44-2f9e-4f57-9d53-6a7f3e6b8a11",
				DispatchRevision: 42, Deadline: time.Date(2026, 11, 30, 7, 0, 0, 0, time.UTC), SecretHash: "h"}},
		Credentials: map[string]string{"TOKEN": "v"},
		Secret:      "00112233445566778899aabbccddeeff",
	}
}

func TestAgentClientSortsAnswers(t *testing.T) {
	c := newTestAgentClient(t)
	cases := []struct {
		name    string
		srv     fakeAgentServer
		refusal string // "" = not a refusal
		ok      bool
	}{
		{"accepted", fakeAgentServer{status: http.StatusAccepted}, "", true},
		{"queue full", fakeAgentServer{status: http.StatusServiceUnavailable, slug: "queue-full"}, "queue-full", false},
		{"isolation", fakeAgentServer{status: http.StatusServiceUnavailable, slug: "isolation-unverified"}, "isolation-unverified", false},
		{"tombstoned", fakeAgentServer{status: http.StatusConflict, slug: "invocation-tombstoned"}, "invocation-tombstoned", false},
		// Anything that is not a typed refusal leaves the outcome unknown.
		{"server error", fakeAgentServer{status: http.StatusInternalServerError, body: "{}"}, "", false},
		{"untyped problem", fakeAgentServer{status: http.StatusBadRequest, slug: "malformed"}, "", false},
		{"wrong token", fakeAgentServer{status: http.StatusUnauthorized, slug: "unauthenticated"}, "", false},
		{"ok is not accepted", fakeAgentServer{status: http.StatusOK, body: "{}"}, "", false},
		{"refusal slug with another status", fakeAgentServer{status: http.StatusInternalServerError, slug: "queue-full"}, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.srv
			addr := startFakeAgent(t, &f)
			err := c.Dispatch(context.Background(), addr, sampleDispatch())
			r := <-f.got
			body := <-f.bodies
			if r.URL.Path != "/v1/dispatches" || r.Header.Get("Authorization") != "Bearer dispatch-token-0123456789" {
				t.Fatalf("request %s with auth %q", r.URL.Path, r.Header.Get("Authorization"))
			}
			if body["invocation_id"] != "6b0c1a44-2f9e-4f57-9d53-6a7f3e6b8a11" || body["dispatch_revision"] != float64(42) ||
				body["secret"] != "00112233445566778899aabbccddeeff" || body["agent_epoch"] != "e1" || body["job_id"] == nil {
				t.Fatalf("dispatch body %v", body)
			}
			var refusal *RefusalError
			switch {
			case tc.ok:
				if err != nil {
					t.Fatalf("err %v, want nil", err)
				}
			case tc.refusal != "":
				if !errors.As(err, &refusal) || refusal.Type != tc.refusal {
					t.Fatalf("err %v, want refusal %s", err, tc.refusal)
				}
			default:
				if err == nil || errors.As(err, &refusal) {
					t.Fatalf("err %v, want an unknown outcome", err)
				}
				if strings.Contains(err.Error(), "00112233445566778899aabbccddeeff") {
					t.Fatal("the error carries the secret")
				}
			}
		})
	}
}

func TestAgentClientTombstone(t *testing.T) {
	c := newTestAgentClient(t)
	f := fakeAgentServer{status: http.StatusOK, body: `{"status":"tombstoned"}`}
	addr := startFakeAgent(t, &f)
	st, err := c.Tombstone(context.Background(), addr, "6b0c1a44-2f9e-4f57-9d53-6a7f3e6b8a11", "e1")
	r := <-f.got
	body := <-f.bodies
	if err != nil || st != InvocationTombstoned {
		t.Fatalf("status %q err %v", st, err)
	}
	if r.URL.Path != "/v1/invocations/6b0c1a44-2f9e-4f57-9d53-6a7f3e6b8a11/tombstone" || body["agent_epoch"] != "e1" {
		t.Fatalf("request %s body %v", r.URL.Path, body)
	}

	g := fakeAgentServer{status: http.StatusConflict, slug: RefusalEpochMismatch}
	addr = startFakeAgent(t, &g)
	_, err = c.Tombstone(context.Background(), addr, "6b0c1a44-2f9e-4f57-9d53-6a7f3e6b8a11", "e0")
	<-g.got
	<-g.bodies
	var refusal *RefusalError
	if !errors.As(err, &refusal) || refusal.Type != RefusalEpochMismatch {
		t.Fatalf("err %v, want epoch-mismatch", err)
	}

	// A closed port is no answer: an error, never a status.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	if st, err := c.Tombstone(context.Background(), dead, "x", "e1"); err == nil || st != "" {
		t.Fatalf("unreachable agent: %q %v", st, err)
	}
}
