package web

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/a-h/templ"

	"jobfence/internal/store"
	"jobfence/jobs"
)

var update = flag.Bool("update", false, "rewrite web/testdata/*.golden.html")

var goldenNow = time.Date(2026, 3, 4, 12, 0, 0, 0, time.UTC)

const goldenCSRF = "csrf-token-of-the-golden-session"

func goldenOperator() *User {
	return &User{Subject: "alice", Role: "operator", CSRF: goldenCSRF, CanOperate: true}
}

// unknownJob is a job the deadline sweep moved to UNKNOWN; a late report then
// brought CHILD_REAPED (releasing the slot) and an EXIT_COMMITTED kept as
// evidence: the case where the operator most needs the whole story.
func unknownJob() *jobs.Job {
	exit := 0
	t0 := goldenNow.Add(-2 * time.Hour)
	return &jobs.Job{
		ID:        "01938a6e-7c1f-7b2a-9d3e-5f6a7b8c9d0e",
		Revision:  57,
		Target:    jobs.Target{Scope: "warehouse.orders", Name: "idx_customer", Display: "warehouse.orders/IDX_Customer"},
		Operation: "create",
		Spec: jobs.Spec{
			Command:     []string{"/usr/local/bin/build-index", "--table", "orders"},
			Env:         map[string]string{"TABLE": "orders", "MODE": "online"},
			Credentials: "warehouse-rw",
			WorkingDir:  "/",
			Limits:      jobs.Limits{MemoryBytes: 256 << 20, Pids: 64, DeadlineSeconds: 600},
			Outcome:     jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{3}},
			Refresh:     &jobs.Refresh{URL: "http://127.0.0.1:9000/hooks/index-changed"},
			Labels:      map[string]string{"team": "search"},
		},
		State:        jobs.Unknown,
		RefreshState: jobs.RefreshNotRequired,
		Slot:         jobs.Slot{AgentID: "agent-1", Proof: jobs.ProofChildReaped},
		Dispatch: &jobs.Dispatch{
			AgentID: "agent-1", AgentEpoch: "epoch-7f3a", AgentAddress: "10.0.0.7:7443",
			InvocationID: "6f1c2d3e-4b5a-4c6d-8e7f-9a0b1c2d3e4f", DispatchRevision: 41,
			Deadline: t0.Add(10 * time.Minute), SentAt: t0.Add(time.Second),
			SecretHash: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
		},
		Result: &jobs.Result{
			Code: jobs.CodeNoTrustedResult, Detail: "deadline passed without a result",
			ReportedAt: t0.Add(10*time.Minute + 5*time.Second),
			Late: []jobs.LateReport{{
				Code: jobs.CodeExitCommitted, Phase: jobs.PhaseNativeReturn, ExitCode: &exit,
				Proof: jobs.ProofChildReaped, ReportedAt: t0.Add(12 * time.Minute),
			}},
		},
		CreatedBy:      "ci-bot",
		CreatedAt:      t0,
		UpdatedAt:      t0.Add(12 * time.Minute),
		QuotaToken:     "quota-token-internal",
		IdempotencyKey: "idem-key-internal",
		BodyHash:       "bodyhash-internal",
		History: []jobs.HistoryEntry{
			{Revision: 40, At: t0, Actor: "ci-bot", Event: jobs.EventAdmit, To: "PENDING"},
			{Revision: 41, At: t0.Add(time.Second), Actor: "dispatcher@replica-a", Event: jobs.EventMarkRunning, From: "PENDING", To: "RUNNING"},
			{Revision: 55, At: t0.Add(10*time.Minute + 5*time.Second), Actor: "dispatcher@replica-a", Event: jobs.EventDeadline, From: "RUNNING", To: "UNKNOWN", Detail: "NO_TRUSTED_RESULT"},
			{Revision: 57, At: t0.Add(12 * time.Minute), Actor: "agent-1", Event: jobs.EventLateResult, Detail: "EXIT_COMMITTED kept as evidence"},
		},
	}
}

// unknownHeldJob is the same job before any report: its worker domain may
// still be alive.
func unknownHeldJob() *jobs.Job {
	j := unknownJob()
	j.Slot = jobs.Slot{Held: true, AgentID: "agent-1", Proof: jobs.ProofNone}
	j.Result.Late = nil
	j.History = j.History[:3]
	j.Revision = 55
	return j
}

func refreshFailedJob() *jobs.Job {
	t0 := goldenNow.Add(-30 * time.Minute)
	return &jobs.Job{
		ID:           "01938a6f-0000-7000-8000-000000000002",
		Target:       jobs.Target{Scope: "warehouse.orders", Name: "idx_date", Display: "warehouse.orders/idx_date"},
		State:        jobs.Committed,
		RefreshState: jobs.RefreshFailed,
		Slot:         jobs.Slot{Proof: jobs.ProofChildReaped},
		Dispatch:     &jobs.Dispatch{AgentID: "agent-2"},
		History: []jobs.HistoryEntry{
			{Revision: 90, At: t0, Actor: "dispatcher@replica-a", Event: jobs.EventRefreshFailed, Detail: "hook answered 503"},
		},
	}
}

func goldenFences() FencesView {
	u := goldenOperator()
	uj, rj := unknownHeldJob(), refreshFailedJob()
	fences := []struct {
		f store.Fence
		j *jobs.Job
	}{
		{store.Fence{Target: "warehouse.orders/idx_customer", Display: "warehouse.orders/IDX_Customer", JobID: uj.ID, State: jobs.Unknown, RefreshState: jobs.RefreshNotRequired, Since: uj.CreatedAt}, uj},
		{store.Fence{Target: "warehouse.orders/idx_date", Display: "warehouse.orders/idx_date", JobID: rj.ID, State: jobs.Committed, RefreshState: jobs.RefreshFailed, Since: goldenNow.Add(-45 * time.Minute)}, rj},
		{store.Fence{Target: "billing/backfill_2025", Display: "billing/backfill_2025", JobID: "01938a70-0000-7000-8000-000000000003", State: jobs.Running, RefreshState: jobs.RefreshNotRequired, Since: goldenNow.Add(-90 * time.Second)}, nil},
	}
	v := FencesView{Page: Page{Title: "Fences", Nav: "/fences", User: u, Live: true}}
	for _, x := range fences {
		row := FenceRow{
			Target: x.f.Display, Key: x.f.Target, JobID: x.f.JobID,
			State: string(x.f.State), RefreshState: string(x.f.RefreshState),
			Since: stamp(x.f.Since, goldenNow), Reason: fenceReason(x.f, x.j),
		}
		if forceReleasable(x.j) {
			row.Release = releaseView(x.j, u.CSRF)
		}
		v.Fences = append(v.Fences, row)
	}
	return v
}

func goldenJob() JobView {
	j := unknownJob()
	v := jobView(j, goldenNow)
	v.Page = Page{Title: "Job " + j.ID, Nav: "/jobs", User: goldenOperator(), Live: true}
	v.Release = releaseView(j, goldenCSRF)
	return v
}

func renderHTML(t *testing.T, c templ.Component) string {
	t.Helper()
	var buf bytes.Buffer
	if err := c.Render(context.Background(), &buf); err != nil {
		t.Fatalf("render: %v", err)
	}
	return buf.String()
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden.html")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./web -run Golden -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s; if the change is intended, rerun with -update and review the diff\n%s", name, path, firstDiff(string(want), got))
	}
}

func firstDiff(want, got string) string {
	wl, gl := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < len(wl) || i < len(gl); i++ {
		var w, g string
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if w != g {
			return "line " + strconv.Itoa(i+1) + ":\n  want: " + w + "\n  got:  " + g
		}
	}
	return ""
}

// prettyHTML puts each tag on its own line so a golden diff points at the
// element that changed instead of one long line.
func prettyHTML(s string) string {
	return strings.ReplaceAll(s, "><", ">\n<")
}

func TestGoldenFencesPage(t *testing.T) {
	got := prettyHTML(renderHTML(t, FencesPage(goldenFences())))
	checkGolden(t, "fences", got)
	for _, want := range []string{
		"UNKNOWN: needs an operator",
		"refresh FAILED: hook answered 503",
		"waiting for the result",
		"may still be alive",
		"Late-commit warning",
		`name="csrf" value="` + goldenCSRF + `"`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("fences page lacks %q", want)
		}
	}
	if n := strings.Count(got, "<dialog"); n != 2 {
		t.Errorf("fences page has %d release dialogs, want 2 (UNKNOWN and refresh FAILED, not RUNNING)", n)
	}
}

func TestGoldenJobPage(t *testing.T) {
	got := prettyHTML(renderHTML(t, JobPage(goldenJob())))
	checkGolden(t, "job", got)
	j := unknownJob()
	for _, secret := range []string{j.Dispatch.SecretHash, j.QuotaToken, j.IdempotencyKey, j.BodyHash} {
		if strings.Contains(got, secret) {
			t.Errorf("job page shows internal value %q", secret)
		}
	}
	for _, want := range []string{"rev 55", "NO_TRUSTED_RESULT", "The worker domain was reaped", "Late reports, kept as evidence", "warehouse-rw", j.Dispatch.InvocationID, "released only by an operator"} {
		if !strings.Contains(got, want) {
			t.Errorf("job page lacks %q", want)
		}
	}
}

// TestViewerSeesNoWriteControls renders the pages a viewer gets: no release
// control, no switch, even for a releasable job.
func TestViewerSeesNoWriteControls(t *testing.T) {
	viewer := &User{Subject: "vic", Role: "viewer", CSRF: "viewer-csrf"}
	fv := goldenFences()
	fv.User = viewer
	for i := range fv.Fences {
		fv.Fences[i].Release = nil
	}
	ov := OverviewView{Page: Page{Title: "Overview", Nav: "/", User: viewer}, AdmissionOpen: true}
	for name, html := range map[string]string{
		"fences":   renderHTML(t, FencesPage(fv)),
		"overview": renderHTML(t, OverviewPage(ov)),
	} {
		for _, bad := range []string{"force-release", "<dialog", "/settings/"} {
			if strings.Contains(html, bad) {
				t.Errorf("%s page for a viewer contains %q", name, bad)
			}
		}
	}
}
