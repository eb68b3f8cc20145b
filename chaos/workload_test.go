package chaos

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"jobfence/handlers"
	"jobfence/jobs"
)

// Outcomes of a client operation, as etcd's robustness tests record them: a
// timeout or a reset is unknown, never a failure.
const (
	outcomeOK      = "ok"
	outcomeFail    = "fail"
	outcomeUnknown = "unknown"
)

// op is one client operation against the API.
type op struct {
	Kind     string // submit, force_release, forge
	Token    string // the job's journal token (submit)
	JobID    string
	Status   int
	Outcome  string
	Invoke   time.Time
	Complete time.Time
}

type recorder struct {
	mu  sync.Mutex
	ops []op
}

func (r *recorder) add(o op) {
	r.mu.Lock()
	r.ops = append(r.ops, o)
	r.mu.Unlock()
}

func (r *recorder) all() []op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]op(nil), r.ops...)
}

// plan is what one job will do; the harness knows it by the job's token.
type plan struct {
	Token    string
	Target   string
	SleepMS  int
	Exit     int // 0 committed, 3 declared not committed
	Overrun  bool
	Deadline int
}

const notCommittedExit = 3

// jobBody is the POST body of a job following p. Its command appends an
// fsynced start record to the exec journal, sleeps, appends an end record
// with its exit code and exits with it.
func jobBody(p plan, journal string) map[string]any {
	appendLine := `| dd of=` + journal + ` oflag=append conv=notrunc,fsync status=none`
	script := `printf 'S %s %s %s\n' "$TOK" "$TGT" "$(date +%s%N)" ` + appendLine +
		`; sleep "$SLP"; printf 'E %s %s %s\n' "$TOK" "$EXT" "$(date +%s%N)" ` + appendLine + `; exit "$EXT"`
	return map[string]any{
		"target":  p.Target,
		"command": []string{"/bin/sh", "-c", script},
		"env": map[string]string{"TOK": p.Token, "TGT": p.Target, "EXT": fmt.Sprint(p.Exit),
			"SLP": fmt.Sprintf("%.3f", float64(p.SleepMS)/1000), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
		"limits":  map[string]any{"memory_bytes": 32 << 20, "pids": 16, "deadline_seconds": p.Deadline},
		"outcome": map[string]any{"committed_exit_codes": []int{0}, "not_committed_exit_codes": []int{notCommittedExit}},
	}
}

// workload submits jobs on a few targets, two submitters per target (so
// admissions race for the fence), and acts as the operator: an UNKNOWN job
// is force-released once its slot was released with a proof, which is the
// evidence an operator needs that nothing runs any more.
type workload struct {
	c       *cluster
	targets []string
	mu      sync.Mutex
	rng     *rand.Rand
	plans   map[string]plan // by token
	seq     int
	stop    chan struct{}
	halted  sync.Once
	wg      sync.WaitGroup
}

func newWorkload(c *cluster, seed uint64, targets int) *workload {
	w := &workload{c: c, rng: rand.New(rand.NewPCG(seed, 7)), plans: map[string]plan{}, stop: make(chan struct{})}
	for i := range targets {
		w.targets = append(w.targets, fmt.Sprintf("chaos.t/t%d", i))
	}
	return w
}

func (w *workload) newPlan(target string) plan {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	p := plan{Token: fmt.Sprintf("k%05d", w.seq), Target: target, SleepMS: 50 + w.rng.IntN(500), Deadline: 5}
	switch x := w.rng.Float64(); {
	case x < 0.2:
		p.Exit = notCommittedExit
		p.SleepMS += 700 // long enough for a forged report to find it RUNNING
	case x < 0.3:
		p.Overrun, p.SleepMS = true, 30000
	}
	w.plans[p.Token] = p
	return p
}

func (w *workload) plan(token string) (plan, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.plans[token]
	return p, ok
}

func (w *workload) start() {
	for _, tg := range w.targets {
		for range 2 {
			w.wg.Add(1)
			go func() {
				defer w.wg.Done()
				w.submitter(tg)
			}()
		}
	}
}

// halt stops new submissions and waits for the submitters; a failed run's
// cleanup calls it again.
func (w *workload) halt() {
	w.halted.Do(func() { close(w.stop) })
	w.wg.Wait()
}

func (w *workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

func (w *workload) pause(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-w.stop:
	case <-t.C:
	}
}

func (w *workload) submitter(target string) {
	for !w.stopped() {
		p := w.newPlan(target)
		o := op{Kind: "submit", Token: p.Token, Invoke: time.Now()}
		st, raw := w.c.callAt(w.c.liveServer(), "POST", "/v1/jobs", tokens[handlers.RoleSubmitter], jobBody(p, w.c.journal))
		o.Complete, o.Status = time.Now(), st
		var j struct {
			ID       string `json:"id"`
			HolderID string `json:"holder_job_id"`
		}
		_ = json.Unmarshal(raw, &j)
		switch {
		case st == http.StatusCreated:
			o.Outcome, o.JobID = outcomeOK, j.ID
		case st == 0 || st >= 500:
			o.Outcome = outcomeUnknown
		default:
			o.Outcome = outcomeFail
		}
		w.c.rec.add(o)
		switch {
		case st == http.StatusCreated:
			w.settle(j.ID)
		case st == http.StatusConflict && j.HolderID != "":
			w.settle(j.HolderID)
		default:
			w.pause(100 * time.Millisecond)
		}
	}
}

// settle waits (while the workload runs) for a job to be resolved, doing
// the operator's part for UNKNOWN jobs whose slot carries a proof.
func (w *workload) settle(id string) {
	for !w.stopped() {
		if w.c.settleOnce(id) {
			return
		}
		w.pause(100 * time.Millisecond)
	}
}

// settleOnce reports whether the job is resolved, force-releasing it when
// it is UNKNOWN and its slot was released with a proof.
func (c *cluster) settleOnce(id string) bool {
	st, raw := c.callAt(c.liveServer(), "GET", "/v1/jobs/"+id, tokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return false
	}
	var j jobs.Job
	if json.Unmarshal(raw, &j) != nil {
		return false
	}
	if j.Resolved {
		return true
	}
	if j.State == jobs.Unknown && !j.Slot.Held && j.Force == nil {
		o := op{Kind: "force_release", JobID: id, Invoke: time.Now()}
		st, _ := c.callAt(c.liveServer(), "POST", "/v1/jobs/"+id+"/force-release", tokens[handlers.RoleOperator],
			map[string]string{"note": "chaos operator: UNKNOWN, slot released with proof " + string(j.Slot.Proof)})
		o.Complete, o.Status = time.Now(), st
		switch {
		case st == http.StatusOK:
			o.Outcome = outcomeOK
		case st == 0 || st >= 500:
			o.Outcome = outcomeUnknown
		default:
			o.Outcome = outcomeFail
		}
		c.rec.add(o)
	}
	return false
}

// unresolved lists the ids of jobs the servers show unresolved.
func (c *cluster) unresolved() ([]string, bool) {
	st, raw := c.callAt(c.liveServer(), "GET", "/v1/jobs?resolved=false&limit=500", tokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return nil, false
	}
	var out struct {
		Jobs []jobs.Job `json:"jobs"`
	}
	if json.Unmarshal(raw, &out) != nil {
		return nil, false
	}
	var ids []string
	for _, j := range out.Jobs {
		ids = append(ids, j.ID)
	}
	return ids, true
}

// drain waits until no job is unresolved, settling each.
func (c *cluster) drain(within time.Duration) bool {
	return poll(within, func() bool {
		ids, ok := c.unresolved()
		if !ok {
			return false
		}
		for _, id := range ids {
			c.settleOnce(id)
		}
		return len(ids) == 0
	})
}
