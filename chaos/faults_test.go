package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/handlers"
	"jobfence/jobs"
)

// fault is one row of the matrix: how to break the cluster during the
// workload. inject returns once the fault has healed.
type fault struct {
	name   string
	quota  int64
	inject func(s *scenario)
}

// scenario is one run in progress.
type scenario struct {
	c     *cluster
	w     *workload
	rng   *mrand.Rand
	mu    sync.Mutex
	notes map[string]int
}

func (s *scenario) note(k string) {
	s.mu.Lock()
	s.notes[k]++
	s.mu.Unlock()
}

// wait is a pause between fault steps (part of the fault, not a
// synchronisation): a random duration in [lo, hi).
func (s *scenario) wait(lo, hi time.Duration) {
	d := lo
	if hi > lo {
		d += time.Duration(s.rng.Int64N(int64(hi - lo)))
	}
	time.Sleep(d)
}

var faults = []fault{
	{name: "F1 kill -9 leader", inject: killLeader},
	{name: "F2 kill -9 agent", inject: killAgent},
	{name: "F3 SIGSTOP leader > TTL", inject: pauseLeader},
	{name: "F4 lossy proxy / partition", inject: lossyProxy},
	{name: "F5 replayed and forged results", inject: replayResults},
	{name: "F6 restart server on its data dir", inject: restartOnDataDir},
	{name: "F8 etcd out of space", quota: 8 << 20, inject: noSpace},
}

func faultByName(prefix string) (fault, bool) {
	for _, f := range faults {
		if strings.HasPrefix(f.name, prefix+" ") {
			return f, true
		}
	}
	return fault{}, false
}

// F1: the leader dies at a random point (twice) and comes back.
func killLeader(s *scenario) {
	for range 2 {
		s.wait(500*time.Millisecond, 2500*time.Millisecond)
		l := s.c.waitLeader(20 * time.Second)
		l.kill9()
		s.note("leader_killed")
		s.wait(0, time.Second)
		s.c.restartServer(l)
	}
}

// F2: an agent dies during a run, right before a dispatch reaches it, and
// right after its result POST was applied but before it hears the answer.
func killAgent(s *scenario) {
	c := s.c
	// During a run: wait until some job is RUNNING on the agent.
	a := c.agents[s.rng.IntN(len(c.agents))]
	poll(10*time.Second, func() bool { return c.runningOn(a.id) > 0 })
	s.wait(0, 300*time.Millisecond)
	a.kill9()
	s.note("agent_killed_mid_run")
	c.startAgent(a)

	for _, point := range []string{"before_exec", "after_result"} {
		a := c.agents[s.rng.IntN(len(c.agents))]
		fired := make(chan struct{})
		var once sync.Once
		kill := func() {
			once.Do(func() {
				a.kill9()
				close(fired)
			})
		}
		if point == "before_exec" {
			a.down.setHook("/v1/dispatches", kill, nil)
		} else {
			a.up.setHook("/result", nil, kill)
		}
		select {
		case <-fired:
			s.note("agent_killed_" + point)
		case <-time.After(15 * time.Second):
			// The workload sent nothing there in time; heal and go on.
			a.down.setHook("", nil, nil)
			a.up.setHook("", nil, nil)
			s.note("agent_kill_" + point + "_not_triggered")
			continue
		}
		c.startAgent(a)
	}
}

// F3: the leader is stopped twice. First at a random instant, for longer
// than the election TTL: another replica leads, and the old one resumes
// believing it still leads. Then in the middle of its work (pauseInFlight).
func pauseLeader(s *scenario) {
	s.wait(500*time.Millisecond, 1500*time.Millisecond)
	l := s.c.waitLeader(20 * time.Second)
	l.signal(syscall.SIGSTOP)
	s.note("leader_paused")
	poll(electionTTL+10*time.Second, func() bool {
		n := s.c.leader()
		return n != nil && n != l
	})
	s.wait(300*time.Millisecond, 1200*time.Millisecond)
	l.signal(syscall.SIGCONT)
	s.wait(500*time.Millisecond, 1500*time.Millisecond)
	pauseInFlight(s)
}

// pauseInFlight stops the leader X at the instant its dispatch request
// reaches the agent's proxy: it has decided and committed the dispatch and
// waits for the answer. While X is stopped its session lease ends (the
// harness revokes it: that is what etcd does once keep-alives stop for the
// TTL, and doing it at once keeps X's own keep-alive deadline ahead, so X
// resumes not knowing), the next replica N takes over and is stopped in
// turn. X resumes first, with quorum (the etcd raft leader was moved to the
// third member beforehand), finishes the in-flight dispatch and goes on
// with its rounds until its next keep-alive tells it the session is gone.
// Every write it tries in that window must fail the election-key compare.
// N resumes 1–1.5 s later.
func pauseInFlight(s *scenario) {
	c := s.c
	var order []campaigner
	if !poll(20*time.Second, func() bool {
		order = c.electionOrder()
		return len(order) == len(c.servers) && order[0].srv.alive()
	}) {
		s.note("in_flight_pause_no_campaigners")
		return
	}
	x, n, third := order[0], order[1], order[2]
	if err := c.moveRaftLeader(third.srv); err != nil {
		c.t.Logf("move raft leader to %s: %v", third.srv.name, err)
	}
	fired := make(chan struct{})
	var once sync.Once
	stopAtDispatch := func() {
		once.Do(func() {
			defer close(fired)
			if c.leader() != x.srv {
				s.note("in_flight_pause_leader_moved")
				return
			}
			x.srv.signal(syscall.SIGSTOP)
			s.note("leader_paused_in_flight")
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := c.liveClient().Revoke(ctx, x.lease)
			cancel()
			if err != nil {
				c.t.Logf("revoke the stopped leader's lease: %v", err)
			}
			if poll(10*time.Second, func() bool { return c.leader() == n.srv }) {
				n.srv.signal(syscall.SIGSTOP)
				s.note("successor_paused")
			}
			x.srv.signal(syscall.SIGCONT)
		})
	}
	for _, a := range c.agents {
		a.down.setHook("/v1/dispatches", stopAtDispatch, nil)
	}
	select {
	case <-fired:
	case <-time.After(15 * time.Second):
	}
	for _, a := range c.agents {
		a.down.setHook("", nil, nil)
	}
	// A hook already taken by a request runs to its end first; otherwise
	// this one marks the fault as not triggered.
	once.Do(func() {
		s.note("in_flight_pause_not_triggered")
		close(fired)
	})
	s.wait(time.Second, 1500*time.Millisecond)
	n.srv.signal(syscall.SIGCONT)
}

// F4: agent ↔ server traffic is dropped, delayed, duplicated and
// reordered for a short while (shorter than the servers' 15 s agent
// liveness window), then one agent's is cut entirely for longer than that
// window and than a job's deadline.
func lossyProxy(s *scenario) {
	c := s.c
	for _, a := range c.agents {
		a.up.lossy(0.2, 0.2, 0.2, 300*time.Millisecond)
		a.down.lossy(0.1, 0.3, 0.2, 300*time.Millisecond)
	}
	s.wait(3*time.Second, 4*time.Second)
	for _, a := range c.agents {
		a.up.heal()
		a.down.heal()
	}
	s.note("short_loss")
	s.wait(500*time.Millisecond, 1500*time.Millisecond)
	a := c.agents[s.rng.IntN(len(c.agents))]
	a.up.lossy(1, 0, 0, 0)
	s.note("long_partition")
	s.wait(16*time.Second, 17*time.Second)
	a.up.heal()
}

// F5: old result POSTs are replayed (exact copies, with their secrets) and
// forged reports without the secret are sent for RUNNING jobs.
func replayResults(s *scenario) {
	c := s.c
	end := time.Now().Add(6 * time.Second)
	for time.Now().Before(end) {
		s.wait(150*time.Millisecond, 300*time.Millisecond)
		for _, a := range c.agents {
			paths, bodies := a.up.recorded()
			if len(paths) == 0 {
				continue
			}
			i := s.rng.IntN(len(paths))
			st := c.postRaw(paths[i], bodies[i])
			s.note(fmt.Sprintf("replay_%d", st))
		}
		c.forge(s)
	}
}

// forge sends a report with a wrong secret, claiming a commit, for a
// RUNNING job whose command will declare no commit.
func (c *cluster) forge(s *scenario) {
	st, raw := c.callAt(c.liveServer(), "GET", "/v1/jobs?state=RUNNING&limit=50", tokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return
	}
	var out struct {
		Jobs []jobs.Job `json:"jobs"`
	}
	_ = json.Unmarshal(raw, &out)
	for _, j := range out.Jobs {
		p, ok := s.w.plan(j.Spec.Env["TOK"])
		if !ok || p.Exit == 0 || p.Overrun || j.Dispatch == nil {
			continue
		}
		var b [16]byte
		_, _ = rand.Read(b[:])
		zero := 0
		env := jobs.ResultEnvelope{DispatchRevision: j.Dispatch.DispatchRevision, InvocationID: j.Dispatch.InvocationID,
			AgentEpoch: j.Dispatch.AgentEpoch, Secret: hex.EncodeToString(b[:]), Code: jobs.CodeExitCommitted,
			Phase: jobs.PhaseNativeReturn, ExitCode: &zero, Proof: jobs.ProofChildReaped}
		o := op{Kind: "forge", JobID: j.ID, Invoke: time.Now()}
		st, _ := c.callAt(c.liveServer(), "POST", "/v1/jobs/"+j.ID+"/result", tokens[handlers.RoleAgent], env)
		o.Complete, o.Status, o.Outcome = time.Now(), st, outcomeFail
		if st == http.StatusOK {
			o.Outcome = outcomeOK
		}
		c.rec.add(o)
		s.note(fmt.Sprintf("forged_%d", st))
		return
	}
}

func (c *cluster) postRaw(path string, body []byte) int {
	req, err := http.NewRequest("POST", c.liveServer()+path, strings.NewReader(string(body)))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tokens[handlers.RoleAgent])
	resp, err := c.client.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// F6: a server, with its embedded etcd member, is killed and restarted on
// its data dir: first the leader, then another one.
func restartOnDataDir(s *scenario) {
	for i := range 2 {
		s.wait(time.Second, 3*time.Second)
		srv := s.c.waitLeader(20 * time.Second)
		if i == 1 {
			for _, o := range s.c.servers {
				if o != srv {
					srv = o
					break
				}
			}
		}
		srv.kill9()
		s.note("server_killed")
		s.c.restartServer(srv)
	}
}

// F8: the etcd backend fills up (NOSPACE alarm) and every write fails for
// a while; then space is reclaimed and the alarm disarmed.
func noSpace(s *scenario) {
	c := s.c
	s.wait(time.Second, 2*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	junk := strings.Repeat("x", 256<<10)
	full := false
	for i := 0; i < 400 && !full; i++ {
		_, err := c.cli.Put(ctx, fmt.Sprintf("/junk/%04d", i), junk)
		full = err != nil && strings.Contains(err.Error(), "database space exceeded")
	}
	if !full {
		c.t.Fatalf("etcd did not run out of space")
	}
	s.note("nospace_alarm")
	s.wait(2*time.Second, 3*time.Second)
	if _, err := c.cli.Delete(ctx, "/junk/", clientv3.WithPrefix()); err != nil {
		c.t.Fatalf("delete junk: %v", err)
	}
	// Compaction must not cut the history watch short: it compacts only
	// what the watch has already seen.
	if !c.hist.catchUp(c.cli, 30*time.Second) {
		c.t.Fatal("history watch did not catch up before compaction")
	}
	resp, err := c.cli.Get(ctx, "/junk/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		c.t.Fatalf("compact: %v", err)
	}
	// Every member keeps its own backend file: each one is defragmented, or
	// the member that raised the alarm would raise it again at once.
	for _, ep := range c.clientURLs {
		if _, err := c.cli.Defragment(ctx, ep); err != nil {
			c.t.Fatalf("defragment %s: %v", ep, err)
		}
	}
	alarms, err := c.cli.AlarmList(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, a := range alarms.Alarms {
		if _, err := c.cli.AlarmDisarm(ctx, (*clientv3.AlarmMember)(a)); err != nil {
			c.t.Fatalf("disarm: %v", err)
		}
	}
}

// runningOn counts RUNNING jobs dispatched to an agent.
func (c *cluster) runningOn(agent string) int {
	st, raw := c.callAt(c.liveServer(), "GET", "/v1/jobs?state=RUNNING&agent_id="+agent, tokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return 0
	}
	var out struct {
		Jobs []json.RawMessage `json:"jobs"`
	}
	_ = json.Unmarshal(raw, &out)
	return len(out.Jobs)
}
