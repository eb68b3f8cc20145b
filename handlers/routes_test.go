package handlers

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"jobfence/internal/apitest"
	"jobfence/internal/problem"
)

// TestRoutesMatchOpenAPI walks the router and the document both ways: every
// served route is documented and every documented operation is served.
func TestRoutesMatchOpenAPI(t *testing.T) {
	doc, _ := apitest.Doc(t)
	api := New(Config{})
	served := map[string]bool{}
	err := chi.Walk(api.Routes(), func(method, route string, _ http.Handler, _ ...func(http.Handler) http.Handler) error {
		route = strings.TrimSuffix(strings.ReplaceAll(route, "/*/", "/"), "/*")
		served[method+" "+route] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	for k := range served {
		if !documented[k] {
			t.Errorf("route %s is served but not in openapi.yaml", k)
		}
	}
	for k := range documented {
		if !served[k] {
			t.Errorf("operation %s is in openapi.yaml but not served", k)
		}
	}
	if len(served) < 18 {
		t.Errorf("only %d routes walked", len(served))
	}
}

// TestProblemSlugsDocumented: every slug the table can produce is in the
// Problem schema's type enum, and the enum has nothing the table lacks.
func TestProblemSlugsDocumented(t *testing.T) {
	doc, _ := apitest.Doc(t)
	var enum []string
	for _, v := range doc.Components.Schemas["Problem"].Value.Properties["type"].Value.Enum {
		enum = append(enum, strings.TrimPrefix(v.(string), problem.TypeBase))
	}
	slugs := problem.Slugs()
	slices.Sort(enum)
	slices.Sort(slugs)
	if !slices.Equal(enum, slugs) {
		t.Fatalf("openapi Problem.type enum %v != problem table %v", enum, slugs)
	}
	want := []string{"malformed", "too-large", "unsupported-media-type", "invalid", "not-found",
		"method-not-allowed", "unauthenticated", "forbidden", "fence-held", "quota-exhausted",
		"admission-closed", "admission-fail-closed", "invalid-transition", "stale",
		"idempotency-mismatch", "not-ready", "internal"}
	slices.Sort(want)
	if !slices.Equal(want, slugs) {
		t.Fatalf("problem table slugs %v, API.md has %v", slugs, want)
	}
}

// The dashboard gets every path the API does not know, and nothing else: a
// wrong method or an unknown /v1 path stays a problem+json answer.
func TestWebGetsOnlyUnknownPaths(t *testing.T) {
	web := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusTeapot)
	})
	h := New(Config{Web: web}).Routes()
	cases := []struct {
		method, path string
		status       int
		ctype        string
	}{
		{"GET", "/", http.StatusTeapot, "text/html"},
		{"GET", "/jobs/x", http.StatusTeapot, "text/html"},
		{"POST", "/login", http.StatusTeapot, "text/html"},
		{"POST", "/healthz", http.StatusMethodNotAllowed, problem.ContentType},
		{"DELETE", "/v1/fences", http.StatusMethodNotAllowed, problem.ContentType},
		{"GET", "/v1/nothing", http.StatusNotFound, problem.ContentType},
		{"GET", "/healthz", http.StatusOK, "application/json"},
	}
	for _, c := range cases {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.status || rec.Header().Get("Content-Type") != c.ctype || rec.Header().Get("X-Request-Id") == "" {
			t.Errorf("%s %s: %d %q", c.method, c.path, rec.Code, rec.Header().Get("Content-Type"))
		}
	}
}
