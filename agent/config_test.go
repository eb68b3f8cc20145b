package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestValidateListsEveryProblem(t *testing.T) {
	c := Config{ID: "bad id", ServerURL: "ftp://x", Capacity: 0, TermGrace: -time.Second, DefaultMemory: 1}
	c.setDefaults()
	err := c.Validate()
	if err == nil {
		t.Fatal("invalid config accepted")
	}
	for _, want := range []string{"id:", "listen:", "server:", "token-file:", "dispatch-token-file:", "capacity:", "term-grace:", "default-memory:"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("validation misses %q: %v", want, err)
		}
	}
}

// Only a documented slug with its documented status is a refusal; anything
// else means the outcome of the send is unknown.
func TestClientTellsRefusalsFromUnknowns(t *testing.T) {
	cases := []struct {
		status int
		ctype  string
		body   string
		slug   string
		err    bool
	}{
		{202, "application/json", `{"status":"queued"}`, "", false},
		{409, "application/problem+json", `{"type":"https://jobfence.dev/problems/epoch-mismatch","status":409}`, RefusalEpochMismatch, false},
		{503, "application/problem+json", `{"type":"https://jobfence.dev/problems/queue-full","status":503}`, RefusalQueueFull, false},
		{500, "application/problem+json", `{"type":"https://jobfence.dev/problems/queue-full","status":500}`, "", true},
		{409, "application/problem+json", `{"type":"https://jobfence.dev/problems/something-else","status":409}`, "", true},
		{409, "application/json", `{"type":"https://jobfence.dev/problems/epoch-mismatch","status":409}`, "", true},
		{413, "application/problem+json", `not json`, "", true},
		{200, "application/json", `{}`, "", true},
	}
	for _, c := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" || r.URL.Path != "/v1/dispatches" {
				w.WriteHeader(400)
				return
			}
			w.Header().Set("Content-Type", c.ctype)
			w.WriteHeader(c.status)
			w.Write([]byte(c.body))
		}))
		cl := &Client{HTTP: srv.Client(), Token: "tok"}
		slug, err := cl.Dispatch(context.Background(), strings.TrimPrefix(srv.URL, "http://"), DispatchRequest{InvocationID: "i"})
		if slug != c.slug || (err != nil) != c.err {
			t.Errorf("%d %s %s: got %q %v", c.status, c.ctype, c.body, slug, err)
		}
		cl.HTTP.CloseIdleConnections()
		srv.Close()
	}
	// A reset connection is not a refusal either.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer srv.Close()
	cl := &Client{HTTP: srv.Client(), Token: "tok"}
	if slug, err := cl.Dispatch(context.Background(), srv.URL, DispatchRequest{InvocationID: "i"}); slug != "" || err == nil {
		t.Fatalf("reset: %q %v", slug, err)
	}
}
