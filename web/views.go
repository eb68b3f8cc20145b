package web

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"jobfence/internal/store"
	"jobfence/jobs"
)

// User is the signed-in operator or viewer as the layout needs it.
type User struct {
	Subject string
	Role    string
	// CSRF is the session's token, echoed by every form and by app.js.
	CSRF string
	// CanOperate decides whether write controls are rendered at all; the
	// server refuses a viewer's write regardless.
	CanOperate bool
}

// Page is what the layout needs from every page.
type Page struct {
	Title string
	// Nav is the path of the section to mark as current.
	Nav  string
	User *User
	// Live asks app.js to follow /v1/events and refresh <main>.
	Live bool
}

// Stamp is a time as the pages show it: exact and as an age.
type Stamp struct {
	ISO string
	Age string
}

func stamp(t, now time.Time) Stamp {
	if t.IsZero() {
		return Stamp{}
	}
	return Stamp{ISO: t.UTC().Format(time.RFC3339), Age: age(now.Sub(t))}
}

func age(d time.Duration) string {
	switch {
	case d < 0:
		return "in " + strings.TrimSuffix(age(-d), " ago")
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm ago", int(d/time.Hour), int(d%time.Hour/time.Minute))
	default:
		return fmt.Sprintf("%dd ago", int(d/(24*time.Hour)))
	}
}

// OverviewView is the model of /.
type OverviewView struct {
	Page
	Leader         LeaderView
	Replicas       []ReplicaView
	AdmissionOpen  bool
	DispatchPaused bool
	Counts         []CountView
	QuotaGlobal    QuotaRow
	QuotaScopes    []QuotaRow
}

// LeaderView is the elected leader, if one is known.
type LeaderView struct {
	Known            bool
	ID               string
	Since            Stamp
	ElectionRevision int64
}

// ReplicaView is one replica's read-model position.
type ReplicaView struct {
	ID     string
	Cursor int64
	Lag    int64
	Self   bool
	Leader bool
	// Unreachable: no cursor is known (Detail says why); never shown as 0.
	Unreachable bool
	Detail      string
}

// CountView is the number of jobs in one state.
type CountView struct {
	State string
	N     int
}

// QuotaRow is unresolved-job quota use for one scope or globally.
type QuotaRow struct {
	Scope string
	Used  int
	// Limit is 0 when not configured for the dashboard.
	Limit int
}

// FencesView is the model of /fences.
type FencesView struct {
	Page
	Fences []FenceRow
}

// FenceRow is one held fence and why it is held.
type FenceRow struct {
	Target       string
	Key          string
	JobID        string
	State        string
	RefreshState string
	Since        Stamp
	Reason       string
	// Release is set when the viewer may force-release the holding job.
	Release *ReleaseView
}

// ReleaseView is the force-release dialog (and its no-script page) for one job.
type ReleaseView struct {
	JobID    string
	Target   string
	State    string
	Releases []string
	// Domain says whether the worker domain was reaped or may still be alive.
	Domain      string
	DomainAlive bool
	Warning     string
	CSRF        string
}

// AgentsView is the model of /agents.
type AgentsView struct {
	Page
	Agents []AgentRow
	// Orphans are slots held on agents that have no record (a removed record
	// proves nothing, so they stay held and visible).
	Orphans []SlotRow
}

// AgentRow is one agent and its held slots.
type AgentRow struct {
	ID                string
	Address           string
	Epoch             string
	LastHeartbeat     Stamp
	Live              bool
	IsolationMode     string
	IsolationVerified bool
	IsolationDetail   string
	Capacity          int
	SlotsHeld         int
	Slots             []SlotRow
}

// SlotRow is one held slot.
type SlotRow struct {
	AgentID  string
	JobID    string
	State    string
	Since    Stamp
	Awaiting string
}

// JobsView is the model of /jobs.
type JobsView struct {
	Page
	State  string
	Scope  string
	Target string
	States []string
	Jobs   []JobRow
	// NextURL and FirstURL are empty when there is no such page.
	NextURL  string
	FirstURL string
}

// JobRow is one job in the list.
type JobRow struct {
	ID           string
	Target       string
	Operation    string
	State        string
	RefreshState string
	Resolved     bool
	Slot         string
	Created      Stamp
}

// JobView is the model of /jobs/{id}.
type JobView struct {
	Page
	ID           string
	Revision     int64
	Target       string
	TargetKey    string
	Operation    string
	State        string
	RefreshState string
	Resolved     bool
	Blocked      string
	CreatedBy    string
	Created      Stamp
	Updated      Stamp
	Spec         SpecView
	Dispatch     *DispatchView
	Result       *ResultView
	Force        *ForceView
	Resources    []ResourceRow
	History      []HistoryRow
	Release      *ReleaseView
}

// SpecView is the job's spec as shown: credentials only by profile name.
type SpecView struct {
	Command     []string
	Env         []KV
	Credentials string
	WorkingDir  string
	Memory      string
	Pids        string
	Deadline    string
	Committed   string
	NotCommit   string
	RefreshURL  string
	Labels      []KV
}

// KV is one sorted map entry.
type KV struct{ Key, Value string }

// DispatchView is the dispatch identity; the secret and its hash are never copied.
type DispatchView struct {
	AgentID          string
	AgentEpoch       string
	AgentAddress     string
	InvocationID     string
	DispatchRevision int64
	Deadline         Stamp
	SentAt           Stamp
}

// ResultView is the classified outcome and any late evidence.
type ResultView struct {
	Code       string
	Phase      string
	ExitCode   string
	Signal     string
	Detail     string
	ReportedAt Stamp
	Late       []LateRow
}

// LateRow is a report that arrived after the job converged.
type LateRow struct {
	Code       string
	Phase      string
	ExitCode   string
	Signal     string
	Detail     string
	Proof      string
	ReportedAt Stamp
}

// ForceView is a recorded force release.
type ForceView struct {
	Actor   string
	At      Stamp
	Note    string
	Warning string
}

// ResourceRow says whether a resource is held and what would release it.
type ResourceRow struct {
	Resource string
	Held     bool
	Status   string
}

// HistoryRow is one transition.
type HistoryRow struct {
	Revision int64
	At       Stamp
	Actor    string
	Event    string
	From     string
	To       string
	Detail   string
}

// LoginView is the model of /login.
type LoginView struct {
	Page
	Error string
	Next  string
}

// ErrorView is a plain error page.
type ErrorView struct {
	Page
	Status  int
	Message string
}

// ReleasePageView is the no-script force-release page.
type ReleasePageView struct {
	Page
	Release ReleaseView
	Error   string
}

// forceReleasable matches the store's rule: an UNKNOWN job, or a terminal job
// whose refresh FAILED, while it still holds its fence.
func forceReleasable(j *jobs.Job) bool {
	if j == nil || j.Resolved {
		return false
	}
	return j.State == jobs.Unknown || (j.State.Terminal() && j.RefreshState == jobs.RefreshFailed)
}

func lastRefreshError(j *jobs.Job) string {
	for i := len(j.History) - 1; i >= 0; i-- {
		if j.History[i].Event == jobs.EventRefreshFailed {
			return j.History[i].Detail
		}
	}
	return ""
}

// fenceReason says in words why a fence is held. j may be nil when the record
// left the read model between the two reads.
func fenceReason(f store.Fence, j *jobs.Job) string {
	switch f.State {
	case jobs.Pending:
		if j != nil && j.BlockedReason != "" {
			return "waiting for dispatch: " + j.BlockedReason
		}
		return "waiting for dispatch"
	case jobs.Running:
		return "waiting for the result"
	case jobs.Unknown:
		return "UNKNOWN: needs an operator"
	}
	switch f.RefreshState {
	case jobs.RefreshRequired:
		return "refresh owed: waiting for the leader to call the hook"
	case jobs.RefreshRunning:
		return "refresh running"
	case jobs.RefreshFailed:
		msg := ""
		if j != nil {
			msg = lastRefreshError(j)
		}
		if msg == "" {
			msg = "no error recorded"
		}
		return "refresh FAILED: " + msg
	}
	return "waiting for the read model to catch up"
}

// domainStatement says plainly whether the worker domain is known to be gone.
func domainStatement(j *jobs.Job) (string, bool) {
	if j.Slot.Held {
		agent := j.Slot.AgentID
		if agent == "" && j.Dispatch != nil {
			agent = j.Dispatch.AgentID
		}
		return fmt.Sprintf("The worker domain on agent %s may still be alive: no proof that it was reaped has been recorded.", agent), true
	}
	switch j.Slot.Proof {
	case jobs.ProofChildReaped:
		return "The worker domain was reaped: the agent recorded CHILD_REAPED, so the command is no longer running.", false
	case jobs.ProofAgentEpochReplaced:
		return "The agent process that received the dispatch is gone (AGENT_EPOCH_REPLACED); its successor removed every leftover domain.", false
	case jobs.ProofNotEnqueued:
		return "The agent never enqueued the dispatch (NOT_ENQUEUED): the command never ran.", false
	case jobs.ProofNeverLaunched:
		return "The command was never launched (NEVER_LAUNCHED).", false
	case jobs.ProofForceReleased:
		return "The slot was force-released earlier: nothing proves the worker domain is gone.", true
	}
	if j.Dispatch == nil {
		return "The job was never dispatched: no worker domain exists.", false
	}
	return "No proof about the worker domain has been recorded: it may still be alive.", true
}

func releaseView(j *jobs.Job, csrf string) *ReleaseView {
	rv := &ReleaseView{
		JobID:  j.ID,
		Target: targetDisplay(j.Target),
		State:  string(j.State),
		CSRF:   csrf,
	}
	if !j.Resolved {
		rv.Releases = append(rv.Releases,
			"the fence on target "+j.Target.Key(),
			fmt.Sprintf("one unresolved-job quota unit in scope %s and one globally", j.Target.Scope))
	}
	if j.Slot.Held {
		rv.Releases = append(rv.Releases, "the slot it holds on agent "+j.Slot.AgentID)
	}
	rv.Domain, rv.DomainAlive = domainStatement(j)
	if j.State == jobs.Unknown {
		rv.Warning = fmt.Sprintf("The outcome is UNKNOWN: the command may have committed. After the release a new job may run on %s; if this job's mutation did happen, that job runs against the changed target. A late report is kept as evidence, and the state stays UNKNOWN.", j.Target.Key())
	} else {
		rv.Warning = fmt.Sprintf("The job is %s but its refresh hook failed: the outside world may not have seen the change. The release drops the owed refresh; nobody will call the hook again.", j.State)
	}
	return rv
}

func targetDisplay(t jobs.Target) string {
	if t.Display != "" {
		return t.Display
	}
	return t.Key()
}

// resources says, for each resource the job takes, whether it is held and
// what would release it.
func resources(j *jobs.Job) []ResourceRow {
	fence := ResourceRow{Resource: "fence on " + j.Target.Key(), Held: !j.Resolved}
	quota := ResourceRow{Resource: "quota unit in scope " + j.Target.Scope + " and globally", Held: !j.Resolved}
	var by string
	switch {
	case j.Resolved && j.Force != nil:
		by = "released by " + j.Force.Actor + "'s force release"
	case j.Resolved:
		by = "released with the job's resolution"
	case j.State == jobs.Pending:
		by = "released by a cancel, or by the outcome after dispatch"
	case j.State == jobs.Running:
		by = "released by a trusted result (and any refresh it owes); if the deadline passes the job goes UNKNOWN and keeps it"
	case j.State == jobs.Unknown:
		by = "released only by an operator's force release"
	case j.RefreshState == jobs.RefreshFailed:
		by = "released when a retried refresh is DONE, or by an operator's force release"
	default:
		by = "released when the owed refresh is DONE"
	}
	fence.Status, quota.Status = by, by
	slot := ResourceRow{Resource: "agent slot", Held: j.Slot.Held}
	switch {
	case j.Slot.Held:
		slot.Resource = "slot on agent " + j.Slot.AgentID
		slot.Status = slotAwaiting(j)
	case j.Dispatch == nil:
		slot.Status = "never taken: the job was not dispatched"
	default:
		slot.Status = "released with proof " + string(j.Slot.Proof)
	}
	return []ResourceRow{fence, quota, slot}
}

func slotAwaiting(j *jobs.Job) string {
	return fmt.Sprintf("awaits CHILD_REAPED (or NOT_ENQUEUED / NEVER_LAUNCHED) from agent %s's report, AGENT_EPOCH_REPLACED when that agent announces a new epoch, or an operator's force release; a deadline or a missed heartbeat proves nothing", j.Slot.AgentID)
}

func sortedKV(m map[string]string) []KV {
	out := make([]KV, 0, len(m))
	for k, v := range m {
		out = append(out, KV{k, v})
	}
	slices.SortFunc(out, func(a, b KV) int { return strings.Compare(a.Key, b.Key) })
	return out
}

func intList(xs []int) string {
	if len(xs) == 0 {
		return "none"
	}
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ", ")
}

func optInt(p *int) string {
	if p == nil {
		return ""
	}
	return strconv.Itoa(*p)
}

func slotText(s jobs.Slot) string {
	switch {
	case s.Held:
		return "held on " + s.AgentID
	case s.Proof == "" || s.Proof == jobs.ProofNone:
		return "none"
	default:
		return "released: " + string(s.Proof)
	}
}

// jobView copies what a page may show of a job. The dispatch secret hash,
// quota token, idempotency key and body hash are deliberately not copied.
func jobView(j *jobs.Job, now time.Time) JobView {
	v := JobView{
		ID:           j.ID,
		Revision:     j.Revision,
		Target:       targetDisplay(j.Target),
		TargetKey:    j.Target.Key(),
		Operation:    j.Operation,
		State:        string(j.State),
		RefreshState: string(j.RefreshState),
		Resolved:     j.Resolved,
		Blocked:      j.BlockedReason,
		CreatedBy:    j.CreatedBy,
		Created:      stamp(j.CreatedAt, now),
		Updated:      stamp(j.UpdatedAt, now),
		Resources:    resources(j),
	}
	sp := j.Spec
	v.Spec = SpecView{
		Command:     slices.Clone(sp.Command),
		Env:         sortedKV(sp.Env),
		Credentials: sp.Credentials,
		WorkingDir:  sp.WorkingDir,
		Memory:      bytesText(sp.Limits.MemoryBytes),
		Pids:        strconv.FormatInt(sp.Limits.Pids, 10),
		Deadline:    (time.Duration(sp.Limits.DeadlineSeconds) * time.Second).String(),
		Committed:   intList(sp.Outcome.CommittedExitCodes),
		NotCommit:   intList(sp.Outcome.NotCommittedExitCodes),
		Labels:      sortedKV(sp.Labels),
	}
	if sp.Refresh != nil {
		v.Spec.RefreshURL = sp.Refresh.URL
	}
	if d := j.Dispatch; d != nil {
		v.Dispatch = &DispatchView{
			AgentID:          d.AgentID,
			AgentEpoch:       d.AgentEpoch,
			AgentAddress:     d.AgentAddress,
			InvocationID:     d.InvocationID,
			DispatchRevision: d.DispatchRevision,
			Deadline:         stamp(d.Deadline, now),
			SentAt:           stamp(d.SentAt, now),
		}
	}
	if r := j.Result; r != nil {
		rv := &ResultView{
			Code:       string(r.Code),
			Phase:      string(r.Phase),
			ExitCode:   optInt(r.ExitCode),
			Signal:     r.Signal,
			Detail:     r.Detail,
			ReportedAt: stamp(r.ReportedAt, now),
		}
		for _, l := range r.Late {
			rv.Late = append(rv.Late, LateRow{
				Code:       string(l.Code),
				Phase:      string(l.Phase),
				ExitCode:   optInt(l.ExitCode),
				Signal:     l.Signal,
				Detail:     l.Detail,
				Proof:      string(l.Proof),
				ReportedAt: stamp(l.ReportedAt, now),
			})
		}
		v.Result = rv
	}
	if f := j.Force; f != nil {
		v.Force = &ForceView{Actor: f.Actor, At: stamp(f.At, now), Note: f.Note, Warning: f.Warning}
	}
	for _, h := range j.History {
		v.History = append(v.History, HistoryRow{
			Revision: h.Revision,
			At:       stamp(h.At, now),
			Actor:    h.Actor,
			Event:    string(h.Event),
			From:     h.From,
			To:       h.To,
			Detail:   h.Detail,
		})
	}
	return v
}

func bytesText(n int64) string {
	switch {
	case n <= 0:
		return "default"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	default:
		return fmt.Sprintf("%d bytes", n)
	}
}

func jobRow(j *jobs.Job, now time.Time) JobRow {
	return JobRow{
		ID:           j.ID,
		Target:       targetDisplay(j.Target),
		Operation:    j.Operation,
		State:        string(j.State),
		RefreshState: string(j.RefreshState),
		Resolved:     j.Resolved,
		Slot:         slotText(j.Slot),
		Created:      stamp(j.CreatedAt, now),
	}
}

// jobsURL builds a /jobs link that keeps the filters.
func jobsURL(state, scope, target, token string) string {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if scope != "" {
		q.Set("scope", scope)
	}
	if target != "" {
		q.Set("target", target)
	}
	if token != "" {
		q.Set("page_token", token)
	}
	if len(q) == 0 {
		return "/jobs"
	}
	return "/jobs?" + q.Encode()
}
