package apitest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// recorder stands in for a test so the validator's verdicts can be read.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

func (r *recorder) Helper() {}

// TestTransportCatchesContractBreaks serves answers that break openapi.yaml
// in different ways and checks each is reported, and that a conforming one
// is not.
func TestTransportCatchesContractBreaks(t *testing.T) {
	cases := []struct {
		name    string
		path    string
		status  int
		ctype   string
		body    string
		noReqID bool
		wantErr string
	}{
		{"conforming health", "/healthz", 200, "application/json", `{"status":"ok"}`, false, ""},
		{"extra field", "/healthz", 200, "application/json", `{"status":"ok","secret_hash":"x"}`, false, "does not match"},
		{"no request id", "/healthz", 200, "application/json", `{"status":"ok"}`, true, "X-Request-Id"},
		{"error not a problem", "/v1/fences", 403, "application/json", `{"error":"no"}`, false, "problem+json"},
		{"problem with foreign slug", "/v1/fences", 403, "application/problem+json",
			`{"type":"https://jobfence.dev/problems/nope","title":"t","status":403,"detail":"d","instance":"/v1/fences","request_id":"RID"}`, false, "problem body"},
		{"problem request_id differs", "/v1/fences", 403, "application/problem+json",
			`{"type":"https://jobfence.dev/problems/forbidden","title":"t","status":403,"detail":"d","instance":"/v1/fences","request_id":"other"}`, false, "request_id"},
		// Every operation has a default problem response, so an unlisted
		// error status is accepted as long as it is a well-formed problem.
		{"unlisted error status", "/v1/fences", 418, "application/problem+json",
			`{"type":"https://jobfence.dev/problems/internal","title":"t","status":418,"detail":"d","instance":"/v1/fences","request_id":"RID"}`, false, ""},
		{"job missing required", "/v1/jobs/0193a0c0-0000-7000-8000-000000000000", 200, "application/json", `{"id":"x"}`, false, "does not match"},
		{"conforming problem", "/v1/fences", 401, "application/problem+json",
			`{"type":"https://jobfence.dev/problems/unauthenticated","title":"t","status":401,"detail":"d","instance":"/v1/fences","request_id":"RID"}`, false, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !c.noReqID {
					w.Header().Set("X-Request-Id", "RID")
				}
				w.Header().Set("Content-Type", c.ctype)
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			rec := &recorder{TB: t}
			client := &http.Client{Transport: Transport(rec, nil)}
			resp, err := client.Get(srv.URL + c.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			joined := strings.Join(rec.errors, "\n")
			switch {
			case c.wantErr == "" && len(rec.errors) != 0:
				t.Errorf("conforming answer reported: %s", joined)
			case c.wantErr != "" && !strings.Contains(joined, c.wantErr):
				t.Errorf("want a report containing %q, got %q", c.wantErr, joined)
			}
		})
	}
}
