package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// Must-show 1: 201 with Location, PENDING, an admit entry; GET returns the
// same record; /v1/fences lists the target.
func TestAPIAdmitGetAndFence(t *testing.T) {
	h := startAPI(t, nil)
	r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, map[string]any{
		"target":    "warehouse.orders/IDX_Customer",
		"operation": "create",
		"command":   []string{"/usr/local/bin/build-index", "--table", "orders"},
		"env":       map[string]string{"TABLE": "orders"},
		"labels":    map[string]string{"team": "search"},
	})
	if r.status != http.StatusCreated {
		t.Fatalf("admit: %d %s", r.status, r.body)
	}
	var j jobView
	r.decode(t, &j)
	if loc := r.header.Get("Location"); loc != "/v1/jobs/"+j.ID {
		t.Errorf("Location %q for job %s", loc, j.ID)
	}
	if j.State != "PENDING" || len(j.History) != 1 || j.History[0].Event != "admit" || j.History[0].Actor != "test-submitter" {
		t.Errorf("admitted job: %+v", j)
	}
	if j.Target.Scope != "warehouse.orders" || j.Target.Name != "idx_customer" || j.Target.Display != "warehouse.orders/IDX_Customer" {
		t.Errorf("target %+v", j.Target)
	}
	if strings.Contains(string(r.body), "secret") || strings.Contains(string(r.body), "body_hash") || strings.Contains(string(r.body), "quota_token") {
		t.Errorf("admission answer shows internals: %s", r.body)
	}
	g := h.do("GET", "/v1/jobs/"+j.ID, handlers.RoleViewer, nil)
	if g.status != http.StatusOK {
		t.Fatalf("get: %d %s", g.status, g.body)
	}
	var got jobView
	g.decode(t, &got)
	if got.ID != j.ID || got.Revision != j.Revision || got.State != j.State || len(got.History) != 1 {
		t.Errorf("GET %+v differs from the admitted %+v", got, j)
	}
	if holder := h.fences()["warehouse.orders/idx_customer"]; holder != j.ID {
		t.Errorf("fence holder %q, want %s", holder, j.ID)
	}
	l := h.do("GET", "/v1/jobs?state=PENDING&scope=warehouse.orders&limit=5", handlers.RoleViewer, nil)
	var list struct {
		Jobs []jobView `json:"jobs"`
	}
	l.decode(t, &list)
	if l.status != http.StatusOK || len(list.Jobs) != 1 || list.Jobs[0].ID != j.ID {
		t.Errorf("list: %d %s", l.status, l.body)
	}
}

// Must-show 2: another spelling of a fenced target is 409 fence-held with
// the holder, and nothing is written.
func TestAPIFenceHeldOtherSpelling(t *testing.T) {
	h := startAPI(t, nil)
	first := h.admit("warehouse.orders/idx_customer")
	before := h.rev()
	r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody("  Warehouse.Orders/IDX_customer  "))
	if r.status != http.StatusConflict {
		t.Fatalf("second admission: %d %s", r.status, r.body)
	}
	slug, p := r.problem(t)
	if slug != "fence-held" || p["holder_job_id"] != first.ID {
		t.Errorf("problem %v", p)
	}
	if after := h.rev(); after != before {
		t.Errorf("etcd revision moved %d -> %d", before, after)
	}
}

// Must-show 3a: 64 concurrent admissions on one target: one 201, 63 x 409.
func TestAPIConcurrentAdmissionsOneTarget(t *testing.T) {
	h := startAPI(t, nil)
	codes := h.admitConcurrently(64, func(i int) string {
		// Spellings differ; the normalized target is the same.
		if i%2 == 0 {
			return "race/T"
		}
		return " RACE/t "
	})
	if codes[http.StatusCreated] != 1 || codes[http.StatusConflict] != 63 {
		t.Fatalf("answers %v, want one 201 and 63 409", codes)
	}
	if f := h.fences(); len(f) != 1 || f["race/t"] == "" {
		t.Errorf("fences %v", f)
	}
}

// Must-show 3b: with --quota-per-scope 10, 64 targets of one scope admit
// exactly ten.
func TestAPIQuotaPerScope(t *testing.T) {
	h := startAPI(t, func(c *Config) { c.QuotaPerScope = 10 })
	codes := h.admitConcurrently(64, func(i int) string { return fmt.Sprintf("quota/t%02d", i) })
	if codes[http.StatusCreated] != 10 || codes[http.StatusTooManyRequests] != 54 {
		t.Fatalf("answers %v, want ten 201 and 54 429", codes)
	}
	if g, s := h.quotaUse("quota"); g != 10 || s != 10 {
		t.Errorf("quota use global %d scope %d, want 10 and 10", g, s)
	}
	r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody("quota/one-more"))
	if slug, p := r.problem(t); r.status != http.StatusTooManyRequests || slug != "quota-exhausted" || p["scope"] != "quota" {
		t.Errorf("one more: %d %v", r.status, p)
	}
	if r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody("other/t")); r.status != http.StatusCreated {
		t.Errorf("another scope: %d %s", r.status, r.body)
	}
}

func (h *apiH) admitConcurrently(n int, target func(i int) string) map[int]int {
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody(target(i)))
			if r.status >= 400 {
				slug, _ := r.problem(h.t)
				want := map[int]string{409: "fence-held", 429: "quota-exhausted"}[r.status]
				if slug != want {
					h.t.Errorf("status %d slug %q", r.status, slug)
				}
			}
			mu.Lock()
			codes[r.status]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return codes
}

// Must-show 4: bad input is 400/413/415/422 with the field named, and the
// etcd revision does not move.
func TestAPIBadInputWritesNothing(t *testing.T) {
	h := startAPI(t, nil)
	valid := `{"target":"bad/input","command":["/bin/true"]}`
	cases := []struct {
		name   string
		body   string
		ct     string
		status int
		slug   string
		fields []string
	}{
		{"malformed", `{"target":"bad/input","command":["/bin/true"]`, "", 400, "malformed", nil},
		{"unknown field", `{"target":"bad/input","command":["/bin/true"],"priority":1}`, "", 400, "malformed", nil},
		{"trailing data", valid + `{"x":1}`, "", 400, "malformed", nil},
		{"case variant", `{"Target":"bad/input","command":["/bin/true"]}`, "", 400, "malformed", nil},
		{"duplicate key", `{"target":"bad/input","target":"bad/other","command":["/bin/true"]}`, "", 400, "malformed", nil},
		{"wrong type", `{"target":"bad/input","command":"/bin/true"}`, "", 400, "malformed", nil},
		{"not an object", `["bad/input"]`, "", 400, "malformed", nil},
		{"too large", `{"target":"bad/input","command":["/bin/true"],"operation":"` + strings.Repeat("a", 1<<20) + `"}`, "", 413, "too-large", nil},
		{"wrong content type", valid, "text/plain", 415, "unsupported-media-type", nil},
		{"missing content type", valid, "-", 415, "unsupported-media-type", nil},
		{"missing target", `{"command":["/bin/true"]}`, "", 422, "invalid", []string{"target"}},
		{"relative command", `{"target":"bad/input","command":["true"]}`, "", 422, "invalid", []string{"command[0]"}},
		{"zero pids", `{"target":"bad/input","command":["/bin/true"],"limits":{"pids":0}}`, "", 422, "invalid", []string{"limits.pids"}},
		{"memory too big", `{"target":"bad/input","command":["/bin/true"],"limits":{"memory_bytes":1099511627776}}`, "", 422, "invalid", []string{"limits.memory_bytes"}},
		{"deadline too long", `{"target":"bad/input","command":["/bin/true"],"limits":{"deadline_seconds":604801}}`, "", 422, "invalid", []string{"limits.deadline_seconds"}},
		{"overlapping exit codes", `{"target":"bad/input","command":["/bin/true"],"outcome":{"committed_exit_codes":[0,3],"not_committed_exit_codes":[3]}}`, "", 422, "invalid", nil},
		{"bad env name", `{"target":"bad/input","command":["/bin/true"],"env":{"1X":"y"}}`, "", 422, "invalid", nil},
		{"rtl override", "{\"target\":\"bad/in\u202eput\",\"command\":[\"/bin/true\"]}", "", 422, "invalid", []string{"target"}},
		{"refresh not http", `{"target":"bad/input","command":["/bin/true"],"refresh":{"url":"ftp://x/y"}}`, "", 422, "invalid", nil},
		{"several fields", `{"target":"nope","command":[],"working_dir":"rel"}`, "", 422, "invalid", []string{"target", "command", "working_dir"}},
	}
	before := h.rev()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			extra := []string{}
			switch c.ct {
			case "":
			case "-":
				extra = []string{"Content-Type", ""}
			default:
				extra = []string{"Content-Type", c.ct}
			}
			r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, c.body, extra...)
			if r.status != c.status {
				t.Fatalf("status %d, want %d: %s", r.status, c.status, r.body)
			}
			slug, p := r.problem(t)
			if slug != c.slug {
				t.Errorf("slug %q, want %q", slug, c.slug)
			}
			if c.status == 422 {
				errs, _ := p["errors"].([]any)
				if len(errs) == 0 {
					t.Fatalf("422 without errors[]: %s", r.body)
				}
				seen := map[string]bool{}
				for _, e := range errs {
					seen[e.(map[string]any)["field"].(string)] = true
				}
				for _, f := range c.fields {
					if !seen[f] {
						t.Errorf("errors[] %v lacks field %q", errs, f)
					}
				}
			}
			if c.slug == "malformed" && c.name == "unknown field" && !strings.Contains(p["detail"].(string), "priority") {
				t.Errorf("detail %q does not name the field", p["detail"])
			}
		})
	}
	// The same rules hold on every body-taking route.
	if r := h.do("PUT", "/v1/settings/admission", handlers.RoleOperator, `{"open":"yes"}`); r.status != 400 {
		t.Errorf("settings wrong type: %d", r.status)
	}
	if r := h.do("PUT", "/v1/settings/dispatch", handlers.RoleOperator, `{}`); r.status != 422 {
		t.Errorf("settings missing field: %d", r.status)
	}
	if r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, valid, "Idempotency-Key", strings.Repeat("k", 129)); r.status != 400 {
		t.Errorf("long Idempotency-Key: %d", r.status)
	}
	if after := h.rev(); after != before {
		t.Errorf("etcd revision moved %d -> %d", before, after)
	}
}

// Must-show 5 and the agent-only rule.
func TestAPIAuthentication(t *testing.T) {
	h := startAPI(t, nil)
	before := h.rev()
	check := func(name string, r apiResp, status int, slug string) {
		t.Helper()
		got, _ := r.problem(t)
		if r.status != status || got != slug {
			t.Errorf("%s: %d %q, want %d %q", name, r.status, got, status, slug)
		}
	}
	check("no token", h.do("GET", "/v1/jobs", "", nil), 401, "unauthenticated")
	check("unknown token", h.do("GET", "/v1/jobs", "", nil, "Authorization", "Bearer not-a-known-token-000000"), 401, "unauthenticated")
	check("viewer POST", h.do("POST", "/v1/jobs", handlers.RoleViewer, jobBody("auth/x")), 403, "forbidden")
	someID := "0193a0c0-0000-7000-8000-000000000000"
	check("submitter force-release", h.do("POST", "/v1/jobs/"+someID+"/force-release", handlers.RoleSubmitter, `{"note":"n"}`), 403, "forbidden")
	check("submitter settings", h.do("PUT", "/v1/settings/admission", handlers.RoleSubmitter, `{"open":false}`), 403, "forbidden")
	check("operator on agent endpoint", h.do("PUT", "/v1/agents/a1", handlers.RoleOperator, `{}`), 403, "forbidden")
	check("operator on result endpoint", h.do("POST", "/v1/jobs/"+someID+"/result", handlers.RoleOperator, `{}`), 403, "forbidden")
	check("agent on viewer endpoint", h.do("GET", "/v1/jobs", handlers.RoleAgent, nil), 403, "forbidden")
	check("agent admits", h.do("POST", "/v1/jobs", handlers.RoleAgent, jobBody("auth/x")), 403, "forbidden")
	if r := h.do("GET", "/v1/jobs", handlers.RoleOperator, nil); r.status != 200 {
		t.Errorf("operator reads: %d", r.status)
	}
	if after := h.rev(); after != before {
		t.Errorf("etcd revision moved %d -> %d", before, after)
	}
}

// Must-show 6: cancel a PENDING job; the target admits again; a second
// cancel is 409.
func TestAPICancel(t *testing.T) {
	h := startAPI(t, nil)
	j := h.admit("cancel/t")
	if _, s := h.quotaUse("cancel"); s != 1 {
		t.Fatalf("scope quota use %d before cancel", s)
	}
	r := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", handlers.RoleSubmitter, nil)
	if r.status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	var c jobView
	r.decode(t, &c)
	if c.State != "NOT_COMMITTED" || c.Result == nil || c.Result.Code != "CANCELLED" || !c.Resolved {
		t.Errorf("cancelled job %s", r.body)
	}
	if _, ok := h.fences()["cancel/t"]; ok {
		t.Error("fence still held after cancel")
	}
	if g, s := h.quotaUse("cancel"); g != 0 || s != 0 {
		t.Errorf("quota still used: global %d scope %d", g, s)
	}
	h.admit("cancel/t")
	again := h.do("POST", "/v1/jobs/"+j.ID+"/cancel", handlers.RoleSubmitter, nil)
	if slug, _ := again.problem(t); again.status != http.StatusConflict || slug != "invalid-transition" {
		t.Errorf("second cancel: %d %s", again.status, again.body)
	}
	if r := h.do("POST", "/v1/jobs/not-a-uuid/cancel", handlers.RoleSubmitter, nil); r.status != 404 {
		t.Errorf("non-UUID id: %d", r.status)
	}
	if r := h.do("GET", "/v1/jobs/0193a0c0-0000-7000-8000-000000000000", handlers.RoleViewer, nil); r.status != 404 {
		t.Errorf("unknown id: %d", r.status)
	}
}

// Must-show 7: force release is 409 on PENDING; on UNKNOWN (reached through
// store transitions) it releases fence, quota and slot and records actor,
// time, note and warning; a repeat answers 200 with the same record; a
// missing note is 422.
func TestAPIForceRelease(t *testing.T) {
	h := startAPI(t, nil)
	j := h.admit("force/t")
	r := h.do("POST", "/v1/jobs/"+j.ID+"/force-release", handlers.RoleOperator, `{"note":"checked"}`)
	if slug, _ := r.problem(t); r.status != 409 || slug != "invalid-transition" {
		t.Fatalf("force release of PENDING: %d %s", r.status, r.body)
	}
	h.driveUnknown(j.ID, "agent-1")
	if slots := h.do("GET", "/v1/slots", handlers.RoleViewer, nil); !strings.Contains(string(slots.body), j.ID) {
		t.Fatalf("UNKNOWN job holds no slot: %s", slots.body)
	}
	before := h.rev()
	for _, body := range []string{`{}`, `{"note":""}`, `{"note":"` + strings.Repeat("n", 1025) + `"}`} {
		r := h.do("POST", "/v1/jobs/"+j.ID+"/force-release", handlers.RoleOperator, body)
		if slug, p := r.problem(t); r.status != 422 || slug != "invalid" || !strings.Contains(string(r.body), `"field":"note"`) {
			t.Errorf("note %s: %d %v", body, r.status, p)
		}
	}
	if after := h.rev(); after != before {
		t.Errorf("a refused force release wrote: revision %d -> %d", before, after)
	}
	note := "verified on the replica: the index exists"
	fr := h.do("POST", "/v1/jobs/"+j.ID+"/force-release", handlers.RoleOperator, map[string]string{"note": note})
	if fr.status != 200 {
		t.Fatalf("force release: %d %s", fr.status, fr.body)
	}
	var rel jobView
	fr.decode(t, &rel)
	if rel.State != "UNKNOWN" || !rel.Resolved || rel.Slot.Held || rel.Slot.Proof != "FORCE_RELEASED" {
		t.Errorf("released job %s", fr.body)
	}
	if rel.Force == nil || rel.Force.Actor != "test-operator" || rel.Force.Note != note || rel.Force.Warning == "" || rel.Force.At.IsZero() {
		t.Errorf("force record %+v", rel.Force)
	}
	if _, ok := h.fences()["force/t"]; ok {
		t.Error("fence still held")
	}
	if g, s := h.quotaUse("force"); g != 0 || s != 0 {
		t.Errorf("quota still used: %d %d", g, s)
	}
	if slots := h.do("GET", "/v1/slots", handlers.RoleViewer, nil); strings.Contains(string(slots.body), j.ID) {
		t.Errorf("slot still held: %s", slots.body)
	}
	again := h.do("POST", "/v1/jobs/"+j.ID+"/force-release", handlers.RoleOperator, map[string]string{"note": "again"})
	var rel2 jobView
	again.decode(t, &rel2)
	if again.status != 200 || rel2.Revision != rel.Revision || rel2.Force == nil || rel2.Force.Note != note {
		t.Errorf("repeat: %d %s", again.status, again.body)
	}
	h.admit("force/t")
}

// driveUnknown takes a PENDING job to UNKNOWN with a held slot the way the
// dispatcher would: markRunning, then "deadline passed without a result".
func (h *apiH) driveUnknown(id, agent string) {
	h.t.Helper()
	st := h.srv.Store()
	l, ok := h.srv.Leadership()
	if !ok {
		h.t.Fatal("test server is not the leader")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	j, err := st.Get(ctx, id)
	if err != nil {
		h.t.Fatal(err)
	}
	j, err = st.MarkRunning(ctx, l, id, j.Revision, store.MarkRunningInput{
		AgentID: agent, AgentEpoch: "epoch-1", AgentAddress: "http://127.0.0.1:1",
		InvocationID: "0193a0c0-0000-4000-8000-000000000001", SecretHash: jobs.HashSecret("s3cret"),
		Deadline: time.Now().Add(time.Minute),
	})
	if err != nil {
		h.t.Fatalf("mark running: %v", err)
	}
	j, err = st.Classify(ctx, l, id, j.Revision, jobs.CodeNoTrustedResult, "deadline passed without a result")
	if err != nil {
		h.t.Fatalf("classify: %v", err)
	}
	if j.State != jobs.Unknown || !j.Slot.Held {
		h.t.Fatalf("driven to %s, slot held %v", j.State, j.Slot.Held)
	}
}

// Must-show 11: the same Idempotency-Key and body answers 200 with the same
// job; another body is 422.
func TestAPIIdempotencyKey(t *testing.T) {
	h := startAPI(t, nil)
	body := `{"target":"idem/t","command":["/bin/true"],"labels":{"a":"1","b":"2"}}`
	first := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, body, "Idempotency-Key", "key-1")
	if first.status != 201 {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	var j1 jobView
	first.decode(t, &j1)
	before := h.rev()
	// Same body, other whitespace and member order.
	same := "{ \"labels\":{\"b\":\"2\",\"a\":\"1\"}, \"command\":[\"/bin/true\"], \"target\":\"idem/t\" }"
	second := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, same, "Idempotency-Key", "key-1")
	var j2 jobView
	second.decode(t, &j2)
	if second.status != 200 || j2.ID != j1.ID || j2.Revision != j1.Revision {
		t.Errorf("repeat: %d %s", second.status, second.body)
	}
	diff := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, `{"target":"idem/t","command":["/bin/false"]}`, "Idempotency-Key", "key-1")
	if slug, _ := diff.problem(t); diff.status != 422 || slug != "idempotency-mismatch" {
		t.Errorf("different body: %d %s", diff.status, diff.body)
	}
	if after := h.rev(); after != before {
		t.Errorf("etcd revision moved %d -> %d", before, after)
	}
}

// Settings, status, 404/405 and the operational endpoints.
func TestAPISettingsStatusAndRouting(t *testing.T) {
	h := startAPI(t, nil)
	var st struct {
		Leader struct {
			ID string `json:"id"`
		} `json:"leader"`
		Replica struct {
			ID     string `json:"id"`
			Cursor int64  `json:"cursor"`
		} `json:"replica"`
		Admission struct {
			Open bool `json:"open"`
		} `json:"admission"`
	}
	h.do("GET", "/v1/status", handlers.RoleViewer, nil).decode(t, &st)
	if st.Leader.ID != "replica-test" || st.Replica.ID != "replica-test" || st.Replica.Cursor == 0 || !st.Admission.Open {
		t.Errorf("status %+v", st)
	}
	if r := h.do("PUT", "/v1/settings/admission", handlers.RoleOperator, `{"open":false}`); r.status != 200 || !strings.Contains(string(r.body), `"open":false`) {
		t.Fatalf("close admission: %d %s", r.status, r.body)
	}
	r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody("closed/t"))
	if slug, _ := r.problem(t); r.status != 503 || slug != "admission-closed" {
		t.Errorf("admission while closed: %d %s", r.status, r.body)
	}
	h.do("PUT", "/v1/settings/admission", handlers.RoleOperator, `{"open":true}`)
	h.admit("closed/t")
	if r := h.do("PUT", "/v1/settings/dispatch", handlers.RoleOperator, `{"paused":true}`); r.status != 200 {
		t.Errorf("pause: %d", r.status)
	}
	m := h.do("DELETE", "/v1/jobs", handlers.RoleOperator, nil)
	if slug, _ := m.problem(t); m.status != 405 || slug != "method-not-allowed" || !strings.Contains(m.header.Get("Allow"), "POST") || !strings.Contains(m.header.Get("Allow"), "GET") {
		t.Errorf("405: %d %s Allow=%q", m.status, m.body, m.header.Get("Allow"))
	}
	if r := h.do("GET", "/v1/nothing", handlers.RoleViewer, nil); r.status != 404 {
		t.Errorf("unknown route: %d", r.status)
	}
	for _, p := range []string{"/healthz", "/readyz", "/openapi.yaml", "/metrics"} {
		if r := h.do("GET", p, "", nil); r.status != 200 || r.header.Get("X-Request-Id") == "" {
			t.Errorf("%s: %d", p, r.status)
		}
	}
	reg := `{"address":"http://127.0.0.1:9","epoch":"e1","capacity":2,"isolation":{"mode":"cgroup","verified":true,"detail":"ok"}}`
	if r := h.do("PUT", "/v1/agents/agent-7", handlers.RoleAgent, reg); r.status != 200 {
		t.Errorf("agent registration: %d %s", r.status, r.body)
	}
	pollUntil(t, "the agent in /v1/agents", func() bool {
		return strings.Contains(string(h.do("GET", "/v1/agents", handlers.RoleViewer, nil).body), `"id":"agent-7"`)
	})
	if r := h.do("GET", "/v1/slots", handlers.RoleViewer, nil); r.status != 200 {
		t.Errorf("slots: %d", r.status)
	}
	if r := h.do("GET", "/v1/jobs?limit=0&resolved=maybe", handlers.RoleViewer, nil); r.status != 422 {
		t.Errorf("bad list query: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/jobs?colour=red", handlers.RoleViewer, nil); r.status != 400 {
		t.Errorf("unknown list parameter: %d", r.status)
	}
}

// The event stream names a change after an admission, served by the
// dashboard's stream (bearer or session) or, without a dashboard, by the API's.
func TestAPIEventsStream(t *testing.T) {
	for _, noDashboard := range []bool{false, true} {
		t.Run(fmt.Sprintf("no_dashboard=%v", noDashboard), func(t *testing.T) {
			testEventsStream(t, noDashboard)
		})
	}
}

func testEventsStream(t *testing.T, noDashboard bool) {
	h := startAPI(t, func(c *Config) { c.NoDashboard = noDashboard })
	if r := h.do("GET", "/v1/events", "", nil); r.status != http.StatusUnauthorized {
		t.Errorf("events without a token: %d", r.status)
	}
	if r := h.do("GET", "/v1/events", handlers.RoleAgent, nil); r.status != http.StatusForbidden {
		t.Errorf("events with an agent token: %d", r.status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.base+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+apiTokens[handlers.RoleViewer])
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	j := h.admit("events/t")
	buf := make([]byte, 0, 4096)
	chunk := make([]byte, 1024)
	for !strings.Contains(string(buf), j.ID) {
		n, err := resp.Body.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if err != nil {
			t.Fatalf("stream ended before naming %s: %v\n%s", j.ID, err, buf)
		}
	}
}
