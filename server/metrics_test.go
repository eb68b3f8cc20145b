package server

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/internal/metrics"
	"jobfence/jobs"
)

// serverMetricNames and agentMetricNames are every name issue 8 fixes.
var (
	serverMetricNames = []string{
		"jobfence_admissions_total", "jobfence_transitions_total", "jobfence_dispatch_outcomes_total",
		"jobfence_round_phase_seconds_bucket", "jobfence_round_phase_seconds_count",
		"jobfence_read_model_lag_revisions", "jobfence_leader", "jobfence_jobs", "jobfence_fences_held",
		"go_goroutines", "process_resident_memory_bytes", "jobfence_http_requests_total",
	}
	agentMetricNames = []string{
		"jobfence_agent_queue_depth", "jobfence_agent_inflight_workers", "jobfence_agent_outcomes_total",
		"jobfence_agent_report_failures_total", "jobfence_agent_isolation_verified",
		"go_goroutines", "process_resident_memory_bytes",
	}
)

// Must-show 1: a real server and agent; after one committed job, two jobs
// left PENDING while dispatch is paused (one of them submitted twice with
// one Idempotency-Key), a fenced and an invalid submission, both
// /metrics endpoints expose every name with the values those events imply.
func testMetricsEndToEnd(t *testing.T, bin string) {
	o := newOps(t, bin, nil)
	srv := o.startServer("m1", nil)
	o.startAgent("agent-m", srv.base, freeAddr(t), srv.base)
	agentBase := o.agents(srv.base)[0].Address

	done := o.submit(srv.base, opsJob("metrics/done", "exit 0"))
	o.waitState(srv.base, done, jobs.Committed)
	o.waitFor("fence of the committed job released", 30*time.Second, func() bool {
		return o.job(srv.base, done).Resolved
	})
	op := opsTokens[handlers.RoleOperator]
	if st, body := o.callAt(srv.base, "PUT", "/v1/settings/dispatch", op, map[string]any{"paused": true}); st != http.StatusOK {
		t.Fatalf("pause dispatch: %d %s", st, body)
	}
	pending := o.submit(srv.base, opsJob("metrics/pending", "exit 0"))
	if st, _ := o.callAt(srv.base, "POST", "/v1/jobs", opsTokens[handlers.RoleSubmitter], opsJob("metrics/pending", "exit 0")); st != http.StatusConflict {
		t.Fatalf("second admission on a fenced target: %d", st)
	}
	if st, _ := o.callAt(srv.base, "POST", "/v1/jobs", opsTokens[handlers.RoleSubmitter], map[string]any{"target": "no-slash"}); st != http.StatusUnprocessableEntity && st != http.StatusBadRequest {
		t.Fatalf("invalid admission: %d", st)
	}
	for range 2 {
		if st, raw := o.callAt(srv.base, "POST", "/v1/jobs", opsTokens[handlers.RoleSubmitter], opsJob("metrics/idem", "exit 0"), "Idempotency-Key", "metrics-1"); st != http.StatusCreated && st != http.StatusOK {
			t.Fatalf("admission with an Idempotency-Key: %d %s", st, raw)
		}
	}
	if j := o.job(srv.base, pending); j == nil || j.State != jobs.Pending {
		t.Fatalf("the paused job is not PENDING: %+v", j)
	}

	m := o.scrape(srv.base + "/metrics")
	for _, name := range serverMetricNames {
		if !hasName(m, name) {
			t.Errorf("server /metrics lacks %s", name)
		}
	}
	checks := []struct {
		what string
		got  float64
		want float64
	}{
		{"admissions admitted", sumOf(m, "jobfence_admissions_total", `outcome="admitted"`), 3},
		{"admissions replayed", sumOf(m, "jobfence_admissions_total", `outcome="replayed"`), 1},
		{"admissions fence_held", sumOf(m, "jobfence_admissions_total", `outcome="fence_held"`), 1},
		{"admissions invalid", sumOf(m, "jobfence_admissions_total", `outcome="invalid"`), 1},
		{"transitions admit", sumOf(m, "jobfence_transitions_total", `event="admit"`), 3},
		{"transitions mark_running", sumOf(m, "jobfence_transitions_total", `event="mark_running"`), 1},
		{"transitions result", sumOf(m, "jobfence_transitions_total", `event="result"`), 1},
		{"leader", sumOf(m, "jobfence_leader"), 1},
		{"jobs COMMITTED", sumOf(m, "jobfence_jobs", `state="COMMITTED"`), 1},
		{"jobs PENDING", sumOf(m, "jobfence_jobs", `state="PENDING"`), 2},
		{"jobs RUNNING", sumOf(m, "jobfence_jobs", `state="RUNNING"`), 0},
		{"fences held", sumOf(m, "jobfence_fences_held"), 2},
		{"dispatches enqueued", sumOf(m, "jobfence_dispatch_outcomes_total", `classification="enqueued"`), 1},
		{"dispatches refused", sumOf(m, "jobfence_dispatch_outcomes_total", `classification="refused"`), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if lag := sumOf(m, "jobfence_read_model_lag_revisions"); lag < 0 {
		t.Errorf("read-model lag %v", lag)
	}
	for _, c := range metrics.DispatchClassifications {
		if !hasName(m, fmt.Sprintf(`jobfence_dispatch_outcomes_total{classification=%q}`, c)) {
			t.Errorf("dispatch classification %s not exposed", c)
		}
	}
	// Every round runs every phase, and rounds ran while the job went through.
	for _, p := range metrics.RoundPhases {
		if n := sumOf(m, "jobfence_round_phase_seconds_count", fmt.Sprintf(`phase=%q`, p)); n < 1 {
			t.Errorf("round phase %s observed %v times", p, n)
		}
	}

	am := o.scrape(agentBase + "/metrics")
	for _, name := range agentMetricNames {
		if !hasName(am, name) {
			t.Errorf("agent /metrics lacks %s", name)
		}
	}
	if v := sumOf(am, "jobfence_agent_outcomes_total", `code="EXIT_COMMITTED"`); v != 1 {
		t.Errorf("agent EXIT_COMMITTED outcomes = %v, want 1", v)
	}
	if v := sumOf(am, "jobfence_agent_isolation_verified"); v != 1 {
		t.Errorf("agent isolation_verified = %v, want 1", v)
	}
	if v := sumOf(am, "jobfence_agent_inflight_workers") + sumOf(am, "jobfence_agent_queue_depth"); v != 0 {
		t.Errorf("agent busy after every job finished: inflight+queue = %v", v)
	}
}

// The dispatcher's classification of a send is the metric's label: a typed
// refusal is "refused", any other error "unknown", none "enqueued".
func TestDispatchClassification(t *testing.T) {
	cases := map[string]error{
		metrics.DispatchEnqueued: nil,
		metrics.DispatchRefused:  fmt.Errorf("send: %w", &RefusalError{Type: "queue-full"}),
		metrics.DispatchUnknown:  errors.New("connection reset"),
	}
	for want, err := range cases {
		if got := DispatchClassification(err); got != want {
			t.Errorf("DispatchClassification(%v) = %s, want %s", err, got, want)
		}
	}
}
