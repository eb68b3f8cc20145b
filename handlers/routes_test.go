package handlers

import (
	"net/http"
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
