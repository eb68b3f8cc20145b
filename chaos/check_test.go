package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"jobfence/jobs"
)

// Invariants, as issue 6 numbers them.
const (
	I1 = "I1 at-most-once"
	I2 = "I2 fence"
	I3 = "I3 release-proof"
	I4 = "I4 durability"
	I5 = "I5 liveness"
	I6 = "I6 true-outcome"
	I7 = "I7 deposed-leader"
)

var invariants = []string{I1, I2, I3, I4, I5, I6, I7}

type violation struct {
	Inv    string
	Detail string // the offending part of the history
}

// run is one journal run of a job's command.
type run struct {
	starts int
	start  int64 // unix ns
	end    int64 // 0: no end record (killed, or still running)
	exit   int
	target string
}

func readJournal(path string) (map[string]*run, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return map[string]*run{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]*run{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 4 {
			return nil, fmt.Errorf("journal line %q", sc.Text())
		}
		r := out[fs[1]]
		if r == nil {
			r = &run{}
			out[fs[1]] = r
		}
		ns, err := strconv.ParseInt(fs[3], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("journal line %q", sc.Text())
		}
		switch fs[0] {
		case "S":
			r.starts++
			r.start, r.target = ns, fs[2]
		case "E":
			r.end = ns
			r.exit, _ = strconv.Atoi(fs[2])
		}
	}
	return out, sc.Err()
}

// jobTrace is what the etcd history says about one job.
type jobTrace struct {
	id          string
	token       string
	target      string
	last        *jobs.Job // the last record written (nil if never decoded)
	deleted     bool
	invocations map[string]bool
	terminalAt  time.Time
	deadline    time.Time
	slotFreedAt time.Time
	versions    []string // compact history of the record, for reports
}

type checkInput struct {
	events  []event
	journal map[string]*run
	ops     []op
	plans   func(token string) (plan, bool)
	healAt  time.Time
	drained bool
}

// check runs every checker and returns the violations found.
func check(in checkInput) []violation {
	var vs []violation
	add := func(inv, format string, args ...any) {
		vs = append(vs, violation{Inv: inv, Detail: fmt.Sprintf(format, args...)})
	}
	traces := map[string]*jobTrace{}
	cur := map[string]event{}
	unresolvedBy := map[string]map[string]bool{} // target -> unresolved job ids
	// The events of one revision are one transaction.
	for i := 0; i < len(in.events); {
		rev := in.events[i].Rev
		k := i
		for k < len(in.events) && in.events[k].Rev == rev {
			k++
		}
		group := in.events[i:k]
		i = k
		leader := leaderAt(cur)
		puts := map[string]*jobs.Job{}
		for _, ev := range group {
			id, ok := strings.CutPrefix(ev.Key, prefix+"/jobs/")
			if !ok || ev.Delete {
				continue
			}
			var j jobs.Job
			if err := json.Unmarshal(ev.Value, &j); err != nil {
				add(I4, "rev %d: job %s record undecodable: %v", rev, id, err)
				continue
			}
			j.ID, j.Revision = id, rev
			puts[id] = &j
		}
		// I3: every release of a fence, quota unit or slot comes with the
		// job's record in the same transaction, carrying its proof.
		for _, ev := range group {
			if !ev.Delete {
				continue
			}
			prev, had := cur[ev.Key]
			if !had {
				continue
			}
			kind := ""
			switch {
			case strings.HasPrefix(ev.Key, prefix+"/fences/"):
				kind = "fence"
			case strings.HasPrefix(ev.Key, prefix+"/quota/"):
				kind = "quota"
			case strings.HasPrefix(ev.Key, prefix+"/slots/"):
				kind = "slot"
			default:
				continue
			}
			jid := string(prev.Value)
			j := puts[jid]
			if j == nil {
				add(I3, "rev %d: %s %s of job %s released without a write of the job", rev, kind, ev.Key, jid)
				continue
			}
			if why := releaseUnproven(kind, j, cur, in.journal); why != "" {
				add(I3, "rev %d: %s of job %s released: %s; record: %s", rev, kind, jid, why, brief(j))
			}
		}
		// I7: a leader-only write is made by the leader of the revision
		// before it.
		for id, j := range puts {
			for _, h := range j.History {
				if h.Revision != 0 && h.Revision != rev {
					continue
				}
				if who, ok := strings.CutPrefix(h.Actor, "dispatcher@"); ok && who != leader {
					add(I7, "rev %d: job %s event %s written by %s while the leader was %q", rev, id, h.Event, who, leader)
				}
			}
		}
		for _, ev := range group {
			if ev.Delete {
				delete(cur, ev.Key)
			} else {
				cur[ev.Key] = ev
			}
		}
		for id, j := range puts {
			tr := traces[id]
			if tr == nil {
				tr = &jobTrace{id: id, invocations: map[string]bool{}, target: j.Target.Key(), token: j.Spec.Env["TOK"]}
				traces[id] = tr
			}
			tr.last = j
			ev := string(j.State)
			if len(j.History) > 0 {
				ev = string(j.History[len(j.History)-1].Event) + "→" + ev
			}
			tr.versions = append(tr.versions, fmt.Sprintf("r%d %s slot=%v/%s", rev, ev, j.Slot.Held, j.Slot.Proof))
			if j.Dispatch != nil {
				tr.invocations[j.Dispatch.InvocationID] = true
				tr.deadline = j.Dispatch.Deadline
			}
			if j.State.Terminal() && tr.terminalAt.IsZero() {
				tr.terminalAt = j.UpdatedAt
			}
			if !j.Slot.Held && j.Dispatch != nil && tr.slotFreedAt.IsZero() {
				tr.slotFreedAt = j.UpdatedAt
			}
			// I2 in etcd: never two unresolved jobs on a target.
			set := unresolvedBy[tr.target]
			if set == nil {
				set = map[string]bool{}
				unresolvedBy[tr.target] = set
			}
			if j.Resolved {
				delete(set, id)
			} else {
				set[id] = true
			}
			if len(set) > 1 {
				add(I2, "rev %d: target %s has %d unresolved jobs: %v", rev, tr.target, len(set), keys(set))
			}
		}
		for _, ev := range group {
			if id, ok := strings.CutPrefix(ev.Key, prefix+"/jobs/"); ok && ev.Delete {
				if tr := traces[id]; tr != nil {
					tr.deleted = true
				}
			}
		}
	}

	byToken := map[string][]*jobTrace{}
	for _, tr := range traces {
		byToken[tr.token] = append(byToken[tr.token], tr)
	}
	// I1: one invocation per job, at most one run, and only of a job etcd
	// recorded a dispatch for.
	for _, tr := range traces {
		if len(tr.invocations) > 1 {
			add(I1, "job %s has %d invocations: %s", tr.id, len(tr.invocations), strings.Join(tr.versions, "; "))
		}
	}
	for tok, r := range in.journal {
		trs := byToken[tok]
		switch {
		case r.starts > 1:
			add(I1, "token %s (jobs %v) ran %d times", tok, ids(trs), r.starts)
		case len(trs) == 0:
			add(I1, "token %s ran but no job record carries it", tok)
		case len(trs[0].invocations) == 0:
			add(I1, "job %s ran without a recorded invocation", trs[0].id)
		}
	}
	// I2 on the journal: runs on one target never overlap.
	spans := map[string][]*run{}
	for tok, r := range in.journal {
		end := r.end
		if end == 0 {
			end = int64(1<<63 - 1)
			if trs := byToken[tok]; len(trs) == 1 && !trs[0].slotFreedAt.IsZero() {
				end = trs[0].slotFreedAt.UnixNano()
			}
		}
		spans[r.target] = append(spans[r.target], &run{start: r.start, end: end, target: tok})
	}
	for target, rs := range spans {
		sort.Slice(rs, func(a, b int) bool { return rs[a].start < rs[b].start })
		for k := 1; k < len(rs); k++ {
			if rs[k].start < rs[k-1].end {
				add(I2, "target %s: runs of %s and %s overlap", target, rs[k-1].target, rs[k].target)
			}
		}
	}
	// I4: every 201 is present with its own token; an admission whose answer
	// was lost is present at most once.
	for _, o := range in.ops {
		if o.Kind != "submit" {
			continue
		}
		trs := byToken[o.Token]
		switch {
		case len(trs) > 1:
			add(I4, "token %s admitted %d times: %v", o.Token, len(trs), ids(trs))
		case o.Outcome == outcomeOK && (len(trs) == 0 || trs[0].id != o.JobID || trs[0].deleted):
			add(I4, "job %s (token %s) answered 201 but is not in etcd", o.JobID, o.Token)
		case o.Outcome == outcomeFail && len(trs) > 0:
			add(I4, "token %s answered %d but job %s exists", o.Token, o.Status, trs[0].id)
		}
	}
	// I5: once the faults healed, every job reaches a terminal state by its
	// deadline plus a failover and a round; and the drain ended.
	bound := electionTTL + 2*dispatchInterval + 5*time.Second
	if !in.drained {
		add(I5, "jobs still unresolved after the faults healed and the drain bound passed")
	}
	for _, tr := range traces {
		if tr.last == nil || tr.last.State == jobs.Pending {
			continue
		}
		if !tr.last.State.Terminal() {
			add(I5, "job %s still %s: %s", tr.id, tr.last.State, strings.Join(tr.versions, "; "))
			continue
		}
		due := tr.deadline
		if in.healAt.After(due) {
			due = in.healAt
		}
		if !tr.deadline.IsZero() && tr.terminalAt.After(due.Add(bound)) {
			add(I5, "job %s terminal at %s, %s after its due time %s", tr.id, tr.terminalAt.Format(time.RFC3339Nano),
				tr.terminalAt.Sub(due), due.Format(time.RFC3339Nano))
		}
	}
	// I6: COMMITTED means a run that exited with a committed code;
	// NOT_COMMITTED means no run, or a run that declared no commit.
	for _, tr := range traces {
		if tr.last == nil {
			continue
		}
		r := in.journal[tr.token]
		switch tr.last.State {
		case jobs.Committed:
			if r == nil || r.end == 0 || r.exit != 0 {
				add(I6, "job %s COMMITTED but its run is %s; %s", tr.id, describeRun(r), strings.Join(tr.versions, "; "))
			}
		case jobs.NotCommitted:
			if r != nil && (r.end == 0 || r.exit != notCommittedExit) {
				add(I6, "job %s NOT_COMMITTED but its run is %s; %s", tr.id, describeRun(r), strings.Join(tr.versions, "; "))
			}
		}
		if p, ok := in.plans(tr.token); ok && tr.last.State == jobs.Committed && p.Exit != 0 {
			add(I6, "job %s COMMITTED but its command exits %d", tr.id, p.Exit)
		}
	}
	return vs
}

// releaseUnproven says why a release is not backed by its proof ("" when it is).
func releaseUnproven(kind string, j *jobs.Job, cur map[string]event, journal map[string]*run) string {
	last := jobs.HistoryEntry{}
	if len(j.History) > 0 {
		last = j.History[len(j.History)-1]
	}
	forced := last.Event == jobs.EventForceRelease && j.Force != nil && strings.TrimSpace(j.Force.Note) != ""
	if kind != "slot" {
		switch {
		case !j.Resolved:
			return "the job is not resolved"
		case forced:
			return ""
		case j.State == jobs.Unknown:
			return "an UNKNOWN job released without an operator"
		case j.State == jobs.Pending || j.State == jobs.Running:
			return "the job is " + string(j.State)
		case j.RefreshState != jobs.RefreshNotRequired && j.RefreshState != jobs.RefreshDone:
			return "the refresh is " + string(j.RefreshState)
		}
		return ""
	}
	if j.Slot.Held || j.Slot.Proof == jobs.ProofNone || j.Slot.Proof == "" {
		return "the record shows no proof"
	}
	ran := false
	if r := journal[j.Spec.Env["TOK"]]; r != nil && r.starts > 0 {
		ran = true
	}
	switch j.Slot.Proof {
	case jobs.ProofForceReleased:
		if !forced {
			return "FORCE_RELEASED without an operator note"
		}
	case jobs.ProofChildReaped:
		if !strings.HasPrefix(last.Actor, "agent:") {
			return "CHILD_REAPED not reported by the agent (actor " + last.Actor + ")"
		}
	case jobs.ProofNeverLaunched, jobs.ProofNotEnqueued:
		if ran {
			return string(j.Slot.Proof) + " but the command ran"
		}
	case jobs.ProofAgentEpochReplaced:
		if j.Dispatch == nil {
			return "AGENT_EPOCH_REPLACED without a dispatch"
		}
		var a jobs.Agent
		ev, ok := cur[prefix+"/agents/"+j.Dispatch.AgentID]
		if !ok || json.Unmarshal(ev.Value, &a) != nil {
			return "AGENT_EPOCH_REPLACED but no agent record"
		}
		if a.Epoch == j.Dispatch.AgentEpoch {
			return "AGENT_EPOCH_REPLACED but agent " + j.Dispatch.AgentID + " still has the dispatch's epoch"
		}
	default:
		return "unknown proof " + string(j.Slot.Proof)
	}
	return ""
}

// leaderAt is the replica whose election key has the lowest create revision.
func leaderAt(cur map[string]event) string {
	best, who := int64(0), ""
	for k, ev := range cur {
		if strings.HasPrefix(k, prefix+"/election/") && (best == 0 || ev.CreateRev < best) {
			best, who = ev.CreateRev, string(ev.Value)
		}
	}
	return who
}

func brief(j *jobs.Job) string {
	var hs []string
	for _, h := range j.History {
		hs = append(hs, fmt.Sprintf("%s(%s)", h.Event, h.Actor))
	}
	return fmt.Sprintf("state=%s resolved=%v slot=%v/%s history=%s", j.State, j.Resolved, j.Slot.Held, j.Slot.Proof, strings.Join(hs, ","))
}

func describeRun(r *run) string {
	switch {
	case r == nil:
		return "absent"
	case r.end == 0:
		return "started, no end"
	}
	return fmt.Sprintf("ended with exit %d", r.exit)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func ids(trs []*jobTrace) []string {
	var out []string
	for _, tr := range trs {
		out = append(out, tr.id)
	}
	return out
}
