package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/handlers"
	"jobfence/internal/apitest"
	"jobfence/internal/etcdtest"
)

// apiTokens are the test tokens file: one per role.
var apiTokens = map[handlers.Role]string{
	handlers.RoleViewer:    "viewer-token-0123456789abcdef",
	handlers.RoleSubmitter: "submitter-token-0123456789abcd",
	handlers.RoleOperator:  "operator-token-0123456789abcde",
	handlers.RoleAgent:     "agent-token-0123456789abcdefgh",
}

func writeAPITokens(t testing.TB, dir string) string {
	var entries []handlers.TokenEntry
	for _, r := range []handlers.Role{handlers.RoleViewer, handlers.RoleSubmitter, handlers.RoleOperator, handlers.RoleAgent} {
		entries = append(entries, handlers.TokenEntry{Subject: "test-" + string(r), Role: r, Token: apiTokens[r]})
	}
	raw, err := json.Marshal(entries)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// apiH is one real server (store, election, HTTP) on the test binary's
// embedded etcd under its own prefix, reached over 127.0.0.1 with a client
// that validates every answer against openapi.yaml.
type apiH struct {
	t      testing.TB
	srv    *Server
	base   string
	client *http.Client
	etcd   *clientv3.Client
	// stop shuts the server down and waits for Run to return (idempotent).
	stop func()
}

func startAPI(t testing.TB, mutate func(*Config)) *apiH {
	t.Helper()
	cli := etcdtest.New(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Listener:      ln,
		EtcdEndpoints: []string{etcdtest.Endpoint()},
		Prefix:        etcdtest.Prefix(t),
		TokensFile:    writeAPITokens(t, t.TempDir()),
		ElectionTTL:   2 * time.Second,
		ReplicaID:     "replica-test",
	}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case <-s.Started():
	case err := <-done:
		cancel()
		t.Fatalf("server stopped before starting: %v", err)
	}
	var stopOnce sync.Once
	stop := func() {
		stopOnce.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("server run: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("server did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	t.Cleanup(tr.CloseIdleConnections)
	h := &apiH{t: t, srv: s, base: "http://" + s.Addr(), etcd: cli, stop: stop,
		client: &http.Client{Transport: apitest.Transport(t, tr), Timeout: 30 * time.Second}}
	// Ready means the read model listed and the election settled (this
	// replica leads or knows who does), so the etcd revision stands still
	// from here unless a request writes.
	pollUntil(t, "server ready with a known leader", func() bool {
		return s.leader.get().ID != "" && h.do("GET", "/readyz", "", nil).status == http.StatusOK
	})
	return h
}

// pollUntil re-checks cond until it holds or 20s pass.
func pollUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type apiResp struct {
	status int
	header http.Header
	body   []byte
}

func (r apiResp) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %s: %v", r.body, err)
	}
}

// problemOf returns the problem's slug and body.
func (r apiResp) problem(t testing.TB) (string, map[string]any) {
	t.Helper()
	var p map[string]any
	r.decode(t, &p)
	typ, _ := p["type"].(string)
	return strings.TrimPrefix(typ, "https://jobfence.dev/problems/"), p
}

// do sends body as JSON (a string or []byte is sent as is) with the role's
// token; extra is header name/value pairs.
func (h *apiH) do(method, path string, role handlers.Role, body any, extra ...string) apiResp {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			h.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, h.base+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if role != "" {
		req.Header.Set("Authorization", "Bearer "+apiTokens[role])
	}
	for i := 0; i+1 < len(extra); i += 2 {
		if extra[i+1] == "" {
			req.Header.Del(extra[i])
			continue
		}
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return apiResp{status: resp.StatusCode, header: resp.Header, body: raw}
}

// rev is etcd's current revision, read with a Get on the client.
func (h *apiH) rev() int64 {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := h.etcd.Get(ctx, "revision-probe")
	if err != nil {
		h.t.Fatal(err)
	}
	return resp.Header.Revision
}

// jobBody is a minimal valid submission.
func jobBody(target string) map[string]any {
	return map[string]any{"target": target, "command": []string{"/bin/true"}}
}

type jobView struct {
	ID       string `json:"id"`
	Revision int64  `json:"revision"`
	State    string `json:"state"`
	Resolved bool   `json:"resolved"`
	Target   struct {
		Scope, Name, Display string
	} `json:"target"`
	Slot struct {
		Held  bool   `json:"held"`
		Proof string `json:"proof"`
	} `json:"slot"`
	Result *struct {
		Code string `json:"code"`
	} `json:"result"`
	Force *struct {
		Actor, Note, Warning string
		At                   time.Time
	} `json:"force"`
	History []struct {
		Event string `json:"event"`
		Actor string `json:"actor"`
	} `json:"history"`
}

func (h *apiH) admit(target string) jobView {
	h.t.Helper()
	r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody(target))
	if r.status != http.StatusCreated {
		h.t.Fatalf("admit %s: %d %s", target, r.status, r.body)
	}
	var j jobView
	r.decode(h.t, &j)
	return j
}

type fenceView struct {
	Fences []struct {
		Target string `json:"target"`
		JobID  string `json:"job_id"`
	} `json:"fences"`
}

func (h *apiH) fences() map[string]string {
	h.t.Helper()
	r := h.do("GET", "/v1/fences", handlers.RoleViewer, nil)
	if r.status != http.StatusOK {
		h.t.Fatalf("fences: %d %s", r.status, r.body)
	}
	var f fenceView
	r.decode(h.t, &f)
	out := map[string]string{}
	for _, x := range f.Fences {
		out[x.Target] = x.JobID
	}
	return out
}

func (h *apiH) quotaUse(scope string) (global, perScope int) {
	h.t.Helper()
	r := h.do("GET", "/v1/status", handlers.RoleViewer, nil)
	var s struct {
		Quota struct {
			Global   int            `json:"global"`
			PerScope map[string]int `json:"per_scope"`
		} `json:"quota"`
	}
	r.decode(h.t, &s)
	return s.Quota.Global, s.Quota.PerScope[scope]
}

var _ = fmt.Sprintf
