package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"sync"
	"time"

	"jobfence/agent"
	"jobfence/handlers"
	"jobfence/jobs"
)

// standIn plays an agent at the process boundary where the real agent
// cannot be made to misbehave on cue: it registers through the real
// server's API as verified and answers dispatches as the test decides.
type standIn struct {
	id, epoch, url string
	mu             sync.Mutex
	got            []agent.DispatchRequest
	// answer returns the status and refusal slug ("" for 202).
	answer func(agent.DispatchRequest) (int, string)
}

func (e *e2e) standIn(id string, capacity int, answer func(agent.DispatchRequest) (int, string)) *standIn {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	s := &standIn{id: id, epoch: "standin-" + id, url: "http://" + ln.Addr().String(), answer: answer}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/dispatches" || r.Header.Get("Authorization") != "Bearer "+e2eDispatchToken {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		var req agent.DispatchRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		s.got = append(s.got, req)
		s.mu.Unlock()
		status, slug := s.answer(req)
		if slug == "" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"status":"queued"}`))
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(agent.Problem{Type: agent.ProblemTypeBase + slug, Title: slug, Status: status})
	})}
	go func() { _ = srv.Serve(ln) }()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	reg := jobs.AgentRegistration{Address: s.url, Epoch: s.epoch, Capacity: capacity,
		Isolation: jobs.Isolation{Mode: "stand-in", Verified: true, Detail: "test stand-in"}}
	if st, raw := e.call("PUT", "/v1/agents/"+id, e2eTokens[handlers.RoleAgent], reg); st != http.StatusOK {
		e.t.Fatalf("stand-in registration: %d %s", st, raw)
	}
	go func() {
		defer close(done)
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				raw, _ := json.Marshal(reg)
				req, _ := http.NewRequestWithContext(ctx, "PUT", e.liveBase()+"/v1/agents/"+id, bytes.NewReader(raw))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+e2eTokens[handlers.RoleAgent])
				if resp, err := http.DefaultClient.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		}
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
		_ = srv.Close()
	})
	return s
}

func (s *standIn) dispatches() []agent.DispatchRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]agent.DispatchRequest(nil), s.got...)
}
