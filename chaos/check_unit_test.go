package chaos

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"jobfence/jobs"
)

// These tests feed the checkers hand-made histories, so each rule is seen
// to fire on exactly the history it forbids and stay quiet on a clean one.
// They need no cluster and run in -short mode.

type histBuilder struct {
	rev    int64
	events []event
}

func (b *histBuilder) txn(evs ...event) int64 {
	b.rev++
	for _, e := range evs {
		e.Rev = b.rev
		if e.CreateRev == 0 {
			e.CreateRev = b.rev
		}
		b.events = append(b.events, e)
	}
	return b.rev
}

func put(key, value string) event { return event{Key: prefix + "/" + key, Value: []byte(value)} }
func del(key string) event        { return event{Key: prefix + "/" + key, Delete: true} }

func jobPut(j jobs.Job) event {
	raw, err := json.Marshal(j)
	if err != nil {
		panic(err)
	}
	return event{Key: prefix + "/jobs/" + j.ID, Value: raw}
}

func agentPut(id, epoch string) event {
	raw, _ := json.Marshal(jobs.Agent{ID: id, Epoch: epoch})
	return put("agents/"+id, string(raw))
}

var t0 = time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)

// lifecycle builds a clean history of one job: admitted, dispatched by the
// leader s1, reported committed by agent a1, fence and slot released.
func lifecycle(b *histBuilder, id, tok string, leader string) {
	target := jobs.Target{Scope: "chaos.t", Name: "t0"}
	j := jobs.Job{ID: id, Target: target, State: jobs.Pending, RefreshState: jobs.RefreshNotRequired,
		Slot: jobs.Slot{Proof: jobs.ProofNone}, Spec: jobs.Spec{Env: map[string]string{"TOK": tok}},
		History: []jobs.HistoryEntry{{Event: jobs.EventAdmit, Actor: "chaos-submitter"}}}
	b.txn(jobPut(j), put("fences/chaos.t%2Ft0", id), put("quota/global/0", id))
	j.History[0].Revision = b.rev
	j.State = jobs.Running
	j.Slot = jobs.Slot{Held: true, AgentID: "a1", Proof: jobs.ProofNone}
	j.Dispatch = &jobs.Dispatch{AgentID: "a1", AgentEpoch: "e1", InvocationID: "inv-" + id, Deadline: t0.Add(5 * time.Second)}
	j.History = append(j.History, jobs.HistoryEntry{Event: jobs.EventMarkRunning, Actor: "dispatcher@" + leader})
	b.txn(jobPut(j), put("slots/a1/"+id, id))
	j.History[1].Revision = b.rev
	j.State, j.Resolved = jobs.Committed, true
	j.Slot = jobs.Slot{AgentID: "a1", Proof: jobs.ProofChildReaped}
	j.UpdatedAt = t0.Add(time.Second)
	j.History = append(j.History, jobs.HistoryEntry{Event: jobs.EventResult, Actor: "agent:a1"})
	b.txn(jobPut(j), del("slots/a1/"+id), del("fences/chaos.t%2Ft0"), del("quota/global/0"))
}

func base() *histBuilder {
	b := &histBuilder{}
	b.txn(put("election/1", "s1"))
	b.txn(agentPut("a1", "e1"))
	return b
}

func ranOnce(tok string, exit int) map[string]*run {
	return map[string]*run{tok: {starts: 1, start: t0.UnixNano(), end: t0.Add(time.Second).UnixNano(), exit: exit, target: "chaos.t/t0"}}
}

func noPlans(string) (plan, bool) { return plan{}, false }

func invs(vs []violation) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Inv+": "+v.Detail)
	}
	return strings.Join(out, "\n")
}

func TestCheckCleanHistory(t *testing.T) {
	b := base()
	lifecycle(b, "j1", "k1", "s1")
	ops := []op{{Kind: "submit", Token: "k1", JobID: "j1", Outcome: outcomeOK, Status: 201}}
	vs := check(checkInput{events: b.events, journal: ranOnce("k1", 0), ops: ops, plans: noPlans, healAt: t0, drained: true})
	if len(vs) != 0 {
		t.Fatalf("clean history reported:\n%s", invs(vs))
	}
}

func TestCheckCatches(t *testing.T) {
	cases := []struct {
		name    string
		want    string
		build   func(b *histBuilder)
		journal map[string]*run
		ops     []op
	}{
		{name: "ran twice", want: I1, build: func(b *histBuilder) { lifecycle(b, "j1", "k1", "s1") },
			journal: map[string]*run{"k1": {starts: 2, start: 1, end: 2, target: "chaos.t/t0"}}},
		{name: "ran without a dispatch", want: I1, build: func(b *histBuilder) {
			b.txn(jobPut(jobs.Job{ID: "j1", Target: jobs.Target{Scope: "chaos.t", Name: "t0"}, State: jobs.Pending,
				Spec: jobs.Spec{Env: map[string]string{"TOK": "k1"}}}))
		}, journal: ranOnce("k1", 0)},
		{name: "two unresolved on a target", want: I2, build: func(b *histBuilder) {
			for _, id := range []string{"j1", "j2"} {
				b.txn(jobPut(jobs.Job{ID: id, Target: jobs.Target{Scope: "chaos.t", Name: "t0"}, State: jobs.Pending,
					Spec: jobs.Spec{Env: map[string]string{"TOK": "k" + id}}}))
			}
		}},
		{name: "slot released at the deadline", want: I3, build: func(b *histBuilder) {
			j := jobs.Job{ID: "j1", Target: jobs.Target{Scope: "chaos.t", Name: "t0"}, State: jobs.Running,
				Slot:     jobs.Slot{Held: true, AgentID: "a1", Proof: jobs.ProofNone},
				Dispatch: &jobs.Dispatch{AgentID: "a1", AgentEpoch: "e1", InvocationID: "i1"},
				Spec:     jobs.Spec{Env: map[string]string{"TOK": "k1"}}}
			b.txn(jobPut(j), put("slots/a1/j1", "j1"))
			j.State, j.Slot = jobs.Unknown, jobs.Slot{AgentID: "a1", Proof: jobs.ProofAgentEpochReplaced}
			j.History = []jobs.HistoryEntry{{Event: jobs.EventTerminationProof, Actor: "dispatcher@s1"}}
			b.txn(jobPut(j), del("slots/a1/j1"))
		}},
		{name: "UNKNOWN fence released without an operator", want: I3, build: func(b *histBuilder) {
			j := jobs.Job{ID: "j1", Target: jobs.Target{Scope: "chaos.t", Name: "t0"}, State: jobs.Unknown,
				Spec: jobs.Spec{Env: map[string]string{"TOK": "k1"}}}
			b.txn(jobPut(j), put("fences/chaos.t%2Ft0", "j1"))
			j.Resolved = true
			b.txn(jobPut(j), del("fences/chaos.t%2Ft0"))
		}},
		{name: "201 lost", want: I4, build: func(b *histBuilder) {},
			ops: []op{{Kind: "submit", Token: "k9", JobID: "j9", Outcome: outcomeOK, Status: 201}}},
		{name: "still RUNNING after the heal", want: I5, build: func(b *histBuilder) {
			b.txn(jobPut(jobs.Job{ID: "j1", Target: jobs.Target{Scope: "chaos.t", Name: "t0"}, State: jobs.Running,
				Dispatch: &jobs.Dispatch{AgentID: "a1", AgentEpoch: "e1", InvocationID: "i1", Deadline: t0},
				Spec:     jobs.Spec{Env: map[string]string{"TOK": "k1"}}}))
		}},
		{name: "committed but declared no commit", want: I6, build: func(b *histBuilder) { lifecycle(b, "j1", "k1", "s1") },
			journal: ranOnce("k1", notCommittedExit)},
		{name: "write by a deposed leader", want: I7, build: func(b *histBuilder) { lifecycle(b, "j1", "k1", "s2") },
			journal: ranOnce("k1", 0)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := base()
			tc.build(b)
			j := tc.journal
			if j == nil {
				j = map[string]*run{}
			}
			vs := check(checkInput{events: b.events, journal: j, ops: tc.ops, plans: noPlans, healAt: t0, drained: true})
			if !caught(outcome{violations: vs}, tc.want) {
				t.Fatalf("want a %s violation, got:\n%s", tc.want, invs(vs))
			}
		})
	}
}

func TestReadJournal(t *testing.T) {
	p := t.TempDir() + "/j"
	lines := "S k1 chaos.t/t0 100\nE k1 3 200\nS k2 chaos.t/t1 150\n"
	if err := writeFile(p, lines); err != nil {
		t.Fatal(err)
	}
	got, err := readJournal(p)
	if err != nil {
		t.Fatal(err)
	}
	if r := got["k1"]; r == nil || r.starts != 1 || r.exit != 3 || r.end != 200 || r.target != "chaos.t/t0" {
		t.Fatalf("k1: %+v", got["k1"])
	}
	if r := got["k2"]; r == nil || r.end != 0 {
		t.Fatalf("k2: %+v", got["k2"])
	}
	if err := writeFile(p, "S k1\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := readJournal(p); err == nil {
		t.Fatal("a torn line was accepted")
	}
}

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o600) }
