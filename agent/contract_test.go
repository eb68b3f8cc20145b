package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"jobfence/internal/apitest"
	"jobfence/internal/metrics"
	"jobfence/jobs"
)

// genericSlugs are the problems that are not refusals, with their statuses.
var genericSlugs = map[string]int{
	"malformed":              400,
	"unauthenticated":        401,
	"not-found":              404,
	"method-not-allowed":     405,
	"too-large":              413,
	"unsupported-media-type": 415,
}

var pathParam = regexp.MustCompile(`\{[^}]*\}`)

// bareAgent has what the router needs and nothing that runs.
func bareAgent() *Agent {
	return &Agent{cfg: Config{DispatchToken: "contract-token"}, m: metrics.NewAgent()}
}

// TestContractRoutesMatchOpenAPI walks the listener's route table and the
// document both ways: every served route is documented and every documented
// operation is served, and the served handler (not the 404/405 fallback)
// answers each documented one.
func TestContractRoutesMatchOpenAPI(t *testing.T) {
	doc, _ := apitest.Load(t, OpenAPI)
	a := bareAgent()
	served := map[string]bool{}
	for _, rt := range a.routeTable() {
		method, path, ok := strings.Cut(rt.pattern, " ")
		if !ok {
			t.Fatalf("route %q serves every method", rt.pattern)
		}
		served[method+" "+pathParam.ReplaceAllString(path, "{}")] = true
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+pathParam.ReplaceAllString(path, "{}")] = true
		}
	}
	for k := range served {
		if !documented[k] {
			t.Errorf("route %s is served but not in agent/openapi.yaml", k)
		}
	}
	for k := range documented {
		if !served[k] {
			t.Errorf("operation %s is in agent/openapi.yaml but not served", k)
		}
	}
	if len(served) != 6 {
		t.Errorf("%d routes walked, want 6", len(served))
	}

	h := a.routes()
	for k := range documented {
		method, path, _ := strings.Cut(k, " ")
		rec := httptest.NewRecorder()
		// No token: the protected routes answer 401 from their own handler.
		h.ServeHTTP(rec, httptest.NewRequest(method, strings.ReplaceAll(path, "{}", "inv-1"), nil))
		if rec.Code == http.StatusNotFound || rec.Code == http.StatusMethodNotAllowed || rec.Header().Get("X-Request-Id") == "" {
			t.Errorf("%s: answered %d by the fallback (X-Request-Id %q)", k, rec.Code, rec.Header().Get("X-Request-Id"))
		}
	}
}

// TestContractProblemSlugs holds the document to wire.go: the Problem enum is
// the refusal table plus the generic problems, and each error response of a
// dispatch admits exactly the slugs whose status it is.
func TestContractProblemSlugs(t *testing.T) {
	doc, _ := apitest.Load(t, OpenAPI)
	var enum []string
	for _, v := range doc.Components.Schemas["Problem"].Value.Properties["type"].Value.Enum {
		slug, ok := strings.CutPrefix(v.(string), ProblemTypeBase)
		if !ok {
			t.Fatalf("problem type %v outside %s", v, ProblemTypeBase)
		}
		enum = append(enum, slug)
	}
	want := slices.Concat(slices.Collect(maps.Keys(RefusalStatus)), slices.Collect(maps.Keys(genericSlugs)))
	slices.Sort(enum)
	slices.Sort(want)
	if !slices.Equal(enum, want) {
		t.Fatalf("Problem.type enum %v, want refusals and generic problems %v", enum, want)
	}

	dispatch := doc.Paths.Find("/v1/dispatches").Post
	statuses := 0
	for code, ref := range dispatch.Responses.Map() {
		status, err := strconv.Atoi(code)
		if err != nil {
			t.Fatalf("dispatch response %q: not a status (a default would hide wrong statuses)", code)
		}
		if status < 400 {
			continue
		}
		statuses++
		schema := ref.Value.Content.Get("application/problem+json").Schema.Value
		for _, slug := range enum {
			refusal, isRefusal := RefusalStatus[slug]
			allowed := (isRefusal && refusal == status) ||
				(!isRefusal && genericSlugs[slug] == status && slug != "too-large" && slug != "not-found" && slug != "method-not-allowed")
			p := map[string]any{"type": ProblemTypeBase + slug, "title": "t", "status": float64(status),
				"detail": "d", "instance": "/v1/dispatches", "request_id": "r"}
			err := schema.VisitJSON(p, openapi3.EnableJSONSchema2020())
			if allowed && err != nil {
				t.Errorf("dispatch %d rejects %s: %v", status, slug, err)
			}
			if !allowed && err == nil {
				t.Errorf("dispatch %d admits %s", status, slug)
			}
		}
	}
	for slug, status := range RefusalStatus {
		if dispatch.Responses.Status(status) == nil {
			t.Errorf("refusal %s: dispatch documents no %d", slug, status)
		}
	}
	if statuses != 7 {
		t.Errorf("dispatch documents %d error statuses, want 400 401 409 413 415 422 503", statuses)
	}
}

// TestContractRequestBodies: what the dispatcher sends (encoding/json of
// DispatchRequest and TombstoneRequest) is what the document describes, and
// the document refuses a member the agent would refuse.
func TestContractRequestBodies(t *testing.T) {
	doc, _ := apitest.Load(t, OpenAPI)
	bodySchema := func(path string) *openapi3.Schema {
		return doc.Paths.Find(path).Post.RequestBody.Value.Content.Get("application/json").Schema.Value
	}
	req := DispatchRequest{
		JobID: "0193a0c0-0000-7000-8000-000000000000", DispatchRevision: 12, InvocationID: "inv_1-a",
		Secret: "s", AgentEpoch: "e1", Deadline: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
		Spec: jobs.Spec{
			Command: []string{"/bin/true", "x"}, Env: map[string]string{"A": "b"}, Credentials: "profile",
			WorkingDir: "/", Limits: jobs.Limits{MemoryBytes: 64 << 20, Pids: 8, DeadlineSeconds: 60},
			Outcome: jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{3}},
			Refresh: &jobs.Refresh{URL: "http://127.0.0.1:9/hook"}, Labels: map[string]string{"team": "x"},
		},
		Credentials: map[string]string{"DB_PASSWORD": "v"},
	}
	check := func(schema *openapi3.Schema, v any, ok bool) {
		t.Helper()
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var decoded any
		if err := json.Unmarshal(raw, &decoded); err != nil {
			t.Fatal(err)
		}
		err = schema.VisitJSON(decoded, openapi3.EnableJSONSchema2020())
		if ok && err != nil {
			t.Errorf("%s: %v", raw, err)
		}
		if !ok && err == nil {
			t.Errorf("%s: accepted", raw)
		}
	}
	dispatch := bodySchema("/v1/dispatches")
	check(dispatch, req, true)
	var withExtra map[string]any
	raw, _ := json.Marshal(req)
	_ = json.Unmarshal(raw, &withExtra)
	withExtra["bogus"] = 1
	check(dispatch, withExtra, false)
	relative := req
	relative.InvocationID = "has space"
	check(dispatch, relative, false)

	tombstone := bodySchema("/v1/invocations/{invocation_id}/tombstone")
	check(tombstone, TombstoneRequest{AgentEpoch: "e1"}, true)
	check(tombstone, map[string]any{"agent_epoch": "e1", "x": 1}, false)
}

// TestContractServedOverHTTP: the listener serves its own contract, and the
// answers that need no running executor conform to it on the wire.
func TestContractServedOverHTTP(t *testing.T) {
	srv := httptest.NewServer(bareAgent().routes())
	defer srv.Close()
	client := &http.Client{Transport: apitest.TransportFor(t, OpenAPI, srv.Client().Transport), Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()

	resp, err := client.Get(srv.URL + "/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Equal(body, OpenAPI) {
		t.Fatalf("/openapi.yaml: %d, %d bytes, want the embedded %d", resp.StatusCode, len(body), len(OpenAPI))
	}

	for _, c := range []struct {
		method, path, auth, ctype, body string
		status                          int
	}{
		{"GET", "/healthz", "", "", "", 200},
		{"GET", "/metrics", "", "", "", 200},
		{"POST", "/v1/dispatches", "", "application/json", `{}`, 401},
		{"GET", "/v1/invocations/inv-1", "Bearer wrong", "", "", 401},
		{"POST", "/v1/invocations/inv-1/tombstone", "Bearer contract-token", "text/plain", `{}`, 415},
		{"POST", "/v1/invocations/inv-1/tombstone", "Bearer contract-token", "application/json", `[]`, 400},
		{"POST", "/v1/invocations/inv-1/tombstone", "Bearer contract-token", "application/json", `{"agent_epoch":"not-this-one"}`, 409},
		{"PUT", "/v1/dispatches", "", "", "", 405},
		{"GET", "/v2/nothing", "", "", "", 404},
	} {
		r, err := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		if c.ctype != "" {
			r.Header.Set("Content-Type", c.ctype)
		}
		resp, err := client.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, resp.StatusCode, c.status)
		}
	}
}
