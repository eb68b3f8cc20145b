package metrics

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"jobfence/jobs"
)

const freeText = "Bearer jft_live_0123456789abcdef leaked"

// scrape fetches h over a real listener and returns the raw body and the
// parsed families.
func scrape(t *testing.T, h http.Handler) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape answered %d: %s", resp.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("scrape is not the text format: %v", err)
	}
	return string(body), fams
}

// value returns the gauge, counter or histogram count of the series of name
// whose labels include all of labels ("k=v").
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("%s missing from the scrape", name)
	}
	for _, m := range f.GetMetric() {
		var have []string
		for _, l := range m.GetLabel() {
			have = append(have, l.GetName()+"="+l.GetValue())
		}
		if !containsAll(have, labels) {
			continue
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("%s has no series with %v", name, labels)
	return 0
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

func series(fams map[string]*dto.MetricFamily, name string) int {
	return len(fams[name].GetMetric())
}

func TestServerScrapeShowsEveryNameWithRecordedValues(t *testing.T) {
	s := NewServer()
	s.AdmissionOutcome(AdmissionAdmitted)
	s.AdmissionOutcome(AdmissionAdmitted)
	s.AdmissionOutcome(AdmissionOutcomeOf(&jobs.FenceHeldError{Target: "db/main", HolderJobID: "j1"}))
	s.Transition(string(jobs.EventAdmit))
	s.Transition(string(jobs.EventMarkRunning))
	s.Transition(string(jobs.EventMarkRunning))
	s.DispatchOutcome(DispatchEnqueued)
	s.DispatchOutcome(DispatchUnknown)
	s.ObservePhase(PhaseDispatch, 10*time.Millisecond)
	s.ObservePhase(PhaseDispatch, 20*time.Millisecond)
	s.SetLeader(true)
	s.SetLag(7)
	s.SetJobs(map[string]int{string(jobs.Pending): 3, string(jobs.Unknown): 1})
	s.SetFencesHeld(4)

	body, fams := scrape(t, s.Handler())
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"jobfence_admissions_total", []string{"outcome=admitted"}, 2},
		{"jobfence_admissions_total", []string{"outcome=fence_held"}, 1},
		{"jobfence_admissions_total", []string{"outcome=quota_exhausted"}, 0},
		{"jobfence_transitions_total", []string{"event=admit"}, 1},
		{"jobfence_transitions_total", []string{"event=mark_running"}, 2},
		{"jobfence_transitions_total", []string{"event=force_release"}, 0},
		{"jobfence_dispatch_outcomes_total", []string{"classification=enqueued"}, 1},
		{"jobfence_dispatch_outcomes_total", []string{"classification=unknown"}, 1},
		{"jobfence_dispatch_outcomes_total", []string{"classification=refused"}, 0},
		{"jobfence_round_phase_seconds", []string{"phase=dispatch"}, 2},
		{"jobfence_round_phase_seconds", []string{"phase=deadline"}, 0},
		{"jobfence_read_model_lag_revisions", nil, 7},
		{"jobfence_leader", nil, 1},
		{"jobfence_jobs", []string{"state=PENDING"}, 3},
		{"jobfence_jobs", []string{"state=UNKNOWN"}, 1},
		{"jobfence_jobs", []string{"state=RUNNING"}, 0},
		{"jobfence_fences_held", nil, 4},
	} {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	h := fams["jobfence_round_phase_seconds"]
	for _, m := range h.GetMetric() {
		if m.GetLabel()[0].GetValue() != PhaseDispatch {
			continue
		}
		if sum := m.GetHistogram().GetSampleSum(); math.Abs(sum-0.03) > 1e-9 {
			t.Errorf("dispatch phase sum = %v, want 0.03", sum)
		}
	}
	if n := series(fams, "jobfence_jobs"); n != len(jobs.States) {
		t.Errorf("jobfence_jobs has %d series, want one per state (%d)", n, len(jobs.States))
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing: Go or process collector not registered", name)
		}
	}

	s.SetLeader(false)
	_, fams = scrape(t, s.Handler())
	if got := value(t, fams, "jobfence_leader"); got != 0 {
		t.Errorf("jobfence_leader after losing leadership = %v", got)
	}
	if strings.Contains(body, "db/main") {
		t.Error("an error's text reached a label")
	}
}

func TestSnapshotIsReadOnlyWhenScraped(t *testing.T) {
	s := NewServer()
	s.SetJobs(map[string]int{string(jobs.Running): 9})
	var calls atomic.Int32
	s.SetSnapshot(func() Snapshot {
		calls.Add(1)
		return Snapshot{LagRevisions: 2, FencesHeld: 5, Jobs: map[string]int{
			string(jobs.Running): 1, string(jobs.Committed): 6, "SOMETHING_NEW": 2,
		}}
	})
	s.SetJobs(map[string]int{string(jobs.Running): 9})
	s.SetFencesHeld(100)
	if n := calls.Load(); n != 0 {
		t.Fatalf("snapshot read %d times before any scrape", n)
	}
	_, fams := scrape(t, s.Handler())
	if n := calls.Load(); n != 1 {
		t.Errorf("one scrape read the snapshot %d times", n)
	}
	for _, c := range []struct {
		name  string
		label []string
		want  float64
	}{
		{"jobfence_read_model_lag_revisions", nil, 2},
		{"jobfence_fences_held", nil, 5},
		{"jobfence_jobs", []string{"state=RUNNING"}, 1},
		{"jobfence_jobs", []string{"state=COMMITTED"}, 6},
		{"jobfence_jobs", []string{"state=other"}, 2},
	} {
		if got := value(t, fams, c.name, c.label...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.label, got, c.want)
		}
	}

	s.SetSnapshot(nil)
	_, fams = scrape(t, s.Handler())
	if got := value(t, fams, "jobfence_jobs", "state=RUNNING"); got != 9 {
		t.Errorf("after SetSnapshot(nil) RUNNING = %v, want the set value 9", got)
	}
	if got := value(t, fams, "jobfence_fences_held"); got != 100 {
		t.Errorf("after SetSnapshot(nil) fences = %v, want 100", got)
	}
}

// Label values outside the fixed sets collapse to "other": a caller that
// passes error text by mistake can neither leak it nor grow the series.
func TestLabelsNeverCarryFreeText(t *testing.T) {
	s := NewServer()
	a := NewAgent()
	_, before := scrape(t, s.Handler())
	_, abefore := scrape(t, a.Handler())
	for i := range 3 {
		text := fmt.Sprintf("%s %d", freeText, i)
		s.AdmissionOutcome(text)
		s.Transition(text)
		s.DispatchOutcome(text)
		s.ObservePhase(text, time.Millisecond)
		s.SetJobs(map[string]int{text: 1})
		a.Outcome(text)
	}
	body, fams := scrape(t, s.Handler())
	abody, afams := scrape(t, a.Handler())
	if strings.Contains(body+abody, "jft_live") {
		t.Fatal("free text reached a label value")
	}
	for _, c := range []struct {
		fams, before map[string]*dto.MetricFamily
		name, label  string
	}{
		{fams, before, "jobfence_admissions_total", "outcome"},
		{fams, before, "jobfence_transitions_total", "event"},
		{fams, before, "jobfence_dispatch_outcomes_total", "classification"},
		{fams, before, "jobfence_round_phase_seconds", "phase"},
		{afams, abefore, "jobfence_agent_outcomes_total", "code"},
	} {
		if got := value(t, c.fams, c.name, c.label+"="+Other); got != 3 {
			t.Errorf("%s{%s=other} = %v, want 3", c.name, c.label, got)
		}
		if n, was := series(c.fams, c.name), series(c.before, c.name); n != was+1 {
			t.Errorf("%s grew from %d to %d series, want one more (other)", c.name, was, n)
		}
	}
	if got := value(t, fams, "jobfence_jobs", "state=other"); got != 1 {
		t.Errorf("jobfence_jobs{state=other} = %v", got)
	}
}

func TestAgentScrapeShowsEveryNameWithRecordedValues(t *testing.T) {
	a := NewAgent()
	a.SetQueueDepth(3)
	a.SetInflightWorkers(2)
	a.Outcome(string(jobs.CodeExitCommitted))
	a.Outcome(string(jobs.CodeExitCommitted))
	a.Outcome(string(jobs.CodeKilledOOM))
	a.ReportFailure()
	a.SetIsolationVerified(true)
	_, fams := scrape(t, a.Handler())
	for _, c := range []struct {
		name  string
		label []string
		want  float64
	}{
		{"jobfence_agent_queue_depth", nil, 3},
		{"jobfence_agent_inflight_workers", nil, 2},
		{"jobfence_agent_outcomes_total", []string{"code=EXIT_COMMITTED"}, 2},
		{"jobfence_agent_outcomes_total", []string{"code=KILLED_OOM"}, 1},
		{"jobfence_agent_outcomes_total", []string{"code=NEVER_LAUNCHED"}, 0},
		{"jobfence_agent_report_failures_total", nil, 1},
		{"jobfence_agent_isolation_verified", nil, 1},
	} {
		if got := value(t, fams, c.name, c.label...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.label, got, c.want)
		}
	}
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := fams[name]; !ok {
			t.Errorf("%s missing: Go or process collector not registered", name)
		}
	}
	a.SetIsolationVerified(false)
	a.SetQueueDepth(0)
	_, fams = scrape(t, a.Handler())
	if got := value(t, fams, "jobfence_agent_isolation_verified"); got != 0 {
		t.Errorf("isolation_verified after failure = %v", got)
	}
	if got := value(t, fams, "jobfence_agent_queue_depth"); got != 0 {
		t.Errorf("queue_depth after drain = %v", got)
	}
}

// Two of each in one process (as in tests that run a cluster) must not
// collide, and the names must pass Prometheus' own lint.
func TestRegistriesAreIndependentAndLintClean(t *testing.T) {
	s1, s2 := NewServer(), NewServer()
	a1, a2 := NewAgent(), NewAgent()
	s1.Transition(string(jobs.EventCancel))
	a1.ReportFailure()
	_, f2 := scrape(t, s2.Handler())
	if got := value(t, f2, "jobfence_transitions_total", "event=cancel"); got != 0 {
		t.Errorf("second server saw the first's transition: %v", got)
	}
	_, fa2 := scrape(t, a2.Handler())
	if got := value(t, fa2, "jobfence_agent_report_failures_total"); got != 0 {
		t.Errorf("second agent saw the first's report failure: %v", got)
	}
	for name, g := range map[string]interface {
		Gather() ([]*dto.MetricFamily, error)
	}{"server": s1.Registry(), "agent": a1.Registry()} {
		mfs, err := g.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var ours []*dto.MetricFamily
		for _, mf := range mfs {
			if strings.HasPrefix(mf.GetName(), "jobfence_") {
				ours = append(ours, mf)
			}
		}
		problems, err := promlint.NewWithMetricFamilies(ours).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("%s: %s: %s", name, p.Metric, p.Text)
		}
	}
}

// The fixed label sets must follow the domain: a new event, state or code in
// jobs would otherwise be counted as "other" without anyone noticing.
func TestLabelSetsCoverTheDomain(t *testing.T) {
	for _, r := range jobs.Rules {
		if !slices.Contains(TransitionEvents, string(r.Event)) {
			t.Errorf("transition event %q missing from TransitionEvents", r.Event)
		}
	}
	if len(JobStates) != len(jobs.States) {
		t.Errorf("JobStates = %v", JobStates)
	}
	for err, want := range map[error]string{
		nil:                                     AdmissionAdmitted,
		&jobs.ValidationError{}:                 AdmissionInvalid,
		&jobs.QuotaExhaustedError{Global: true}: AdmissionQuotaExhausted,
		&jobs.FailClosedError{JobID: "x"}:       AdmissionFailClosed,
		fmt.Errorf("w: %w", jobs.ErrAdmissionClosed): AdmissionClosed,
		jobs.ErrIdempotencyMismatch:                  AdmissionIdempotencyMismatch,
		errors.New("etcd down"):                      AdmissionError,
	} {
		if got := AdmissionOutcomeOf(err); got != want {
			t.Errorf("AdmissionOutcomeOf(%v) = %q, want %q", err, got, want)
		}
	}
}
