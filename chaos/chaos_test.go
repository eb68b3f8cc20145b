package chaos

import (
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	fullFlag  = flag.Bool("chaos.full", false, "run the whole matrix (chaos.runs seeded runs per fault) and the mutation runs")
	runsFlag  = flag.Int("chaos.runs", 20, "seeded runs per fault with -chaos.full")
	seedFlag  = flag.Uint64("chaos.seed", 0, "replay one seed: every fault (or -chaos.fault) runs once with it")
	faultFlag = flag.String("chaos.fault", "", "only the fault with this id (F1…F8)")
	docFlag   = flag.String("chaos.doc", "", "write the matrix to this markdown file (make chaos: docs/reliability.md)")
)

// outcome is one finished run.
type outcome struct {
	fault      string
	seed       uint64
	mutation   string
	violations []violation
	notes      map[string]int
	jobs       int
	runs       int
	dur        time.Duration
}

// runOnce runs one fault under one seed: cluster up, workload, fault,
// heal, drain, then every checker over the recorded history.
func runOnce(t *testing.T, f fault, seed uint64, mutation string) outcome {
	start := time.Now()
	c := newCluster(t, clusterOptions{quotaByte: f.quota, mutation: mutation, servers: 3})
	for i, a := range c.agents {
		a.up.seed(seed*31 + uint64(i))
		a.down.seed(seed*37 + uint64(i))
	}
	s := &scenario{c: c, rng: mrand.New(mrand.NewPCG(seed, 11)), notes: map[string]int{}}
	s.w = newWorkload(c, seed, 4)
	t.Cleanup(s.w.halt)
	c.waitLeader(20 * time.Second)
	s.w.start()
	s.w.pause(time.Second)
	f.inject(s)
	healAt := time.Now()
	// Some undisturbed work after the heal, then no new jobs.
	s.wait(1500*time.Millisecond, 2500*time.Millisecond)
	s.w.halt()
	drained := c.drain(90 * time.Second)
	if !c.hist.catchUp(c.cli, 30*time.Second) {
		t.Fatal("history watch did not catch up")
	}
	journal, err := readJournal(c.journal)
	if err != nil {
		t.Fatal(err)
	}
	vs := check(checkInput{events: c.hist.snapshot(), journal: journal, ops: c.rec.all(), plans: s.w.plan,
		healAt: healAt, drained: drained})
	o := outcome{fault: f.name, seed: seed, mutation: mutation, violations: vs, notes: s.notes, runs: len(journal), dur: time.Since(start)}
	for _, op := range c.rec.all() {
		if op.Kind == "submit" && op.Outcome == outcomeOK {
			o.jobs++
		}
	}
	if (len(vs) > 0 && mutation == "") || os.Getenv("CHAOS_LOGS") != "" {
		c.dumpLogs()
	}
	return o
}

func report(t *testing.T, o outcome) {
	t.Helper()
	t.Logf("%s seed=%d mutation=%q: %d jobs admitted, %d runs journaled, %s, faults %v, %d violations",
		o.fault, o.seed, o.mutation, o.jobs, o.runs, o.dur.Round(time.Second), o.notes, len(o.violations))
	for i, v := range o.violations {
		if i == 20 {
			t.Logf("… %d more", len(o.violations)-20)
			break
		}
		t.Logf("  %s: %s", v.Inv, v.Detail)
	}
}

func selected() []fault {
	if *faultFlag == "" {
		return faults
	}
	f, ok := faultByName(*faultFlag)
	if !ok {
		return nil
	}
	return []fault{f}
}

// TestChaos is the short subset (every fault once, one seed) unless
// -chaos.full asks for the matrix. A failure prints its seed; `make chaos
// SEED=n` replays it.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("the fault-injection suite starts real clusters")
	}
	var seeds []uint64
	switch {
	case *seedFlag != 0:
		seeds = []uint64{*seedFlag}
	case *fullFlag:
		for i := 1; i <= *runsFlag; i++ {
			seeds = append(seeds, uint64(i))
		}
	default:
		seeds = []uint64{1}
	}
	var (
		mu  sync.Mutex
		all []outcome
	)
	for _, f := range selected() {
		for _, seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", strings.Fields(f.name)[0], seed), func(t *testing.T) {
				o := runOnce(t, f, seed, "")
				report(t, o)
				mu.Lock()
				all = append(all, o)
				mu.Unlock()
				if len(o.violations) > 0 {
					t.Errorf("%d violations; replay with: make chaos SEED=%d", len(o.violations), seed)
				}
			})
		}
	}
	var muts []outcome
	if *fullFlag && *seedFlag == 0 && *faultFlag == "" {
		muts = runMutations(t)
	}
	table := renderTable(all, muts)
	t.Log("\n" + table)
	if *docFlag != "" {
		writeDoc(t, *docFlag, table)
	}
}

// mutationCase pairs a broken build with the fault that exercises it and
// the checker that must catch it.
type mutationCase struct {
	mutation string
	fault    string
	want     string
}

var mutationCases = []mutationCase{
	{mutation: "skip-fence-compare", fault: "F1", want: I2},
	{mutation: "release-slot-at-deadline", fault: "F4", want: I3},
	{mutation: "resend-after-transport-error", fault: "F4", want: I1},
	{mutation: "accept-any-secret", fault: "F5", want: I6},
	{mutation: "skip-leader-compare", fault: "F3", want: I7},
}

// TestChaosMutations runs only the mutation cases (make chaos runs them
// as part of the matrix).
func TestChaosMutations(t *testing.T) {
	if !*fullFlag && os.Getenv("CHAOS_MUTATIONS") == "" {
		t.Skip("mutation runs belong to -chaos.full (or CHAOS_MUTATIONS=1)")
	}
	if *fullFlag && *seedFlag == 0 && *faultFlag == "" {
		t.Skip("TestChaos runs the mutations with -chaos.full")
	}
	runMutations(t)
}

// runMutations runs each case up to three seeds until its checker fires;
// with -chaos.seed, each case once under that seed, and with -chaos.fault,
// only the cases of that fault.
func runMutations(t *testing.T) []outcome {
	seeds := []uint64{1, 2, 3}
	if *seedFlag != 0 {
		seeds = []uint64{*seedFlag}
	}
	var out []outcome
	for _, mc := range mutationCases {
		if *faultFlag != "" && mc.fault != *faultFlag {
			continue
		}
		f, _ := faultByName(mc.fault)
		t.Run("mutation/"+mc.mutation, func(t *testing.T) {
			var last outcome
			for _, seed := range seeds {
				last = runOnce(t, f, seed, mc.mutation)
				report(t, last)
				if caught(last, mc.want) {
					break
				}
			}
			out = append(out, last)
			if !caught(last, mc.want) {
				t.Errorf("mutation %s under %s was not caught by %s", mc.mutation, mc.fault, mc.want)
			}
		})
	}
	return out
}

func caught(o outcome, inv string) bool {
	for _, v := range o.violations {
		if v.Inv == inv {
			return true
		}
	}
	return false
}

// renderTable is the faults × invariants matrix: per cell, violations over
// runs; failing seeds listed per fault; then the mutation runs.
func renderTable(all []outcome, muts []outcome) string {
	var b strings.Builder
	b.WriteString("| fault | runs | jobs admitted | " + strings.Join(invariants, " | ") + " | seeds | failing seeds |\n")
	b.WriteString("|---|---|---|" + strings.Repeat("---|", len(invariants)) + "---|---|\n")
	type row struct {
		runs, jobs int
		per        map[string]int
		seeds      []uint64
		failing    []uint64
	}
	rows := map[string]*row{}
	var order []string
	for _, o := range all {
		r := rows[o.fault]
		if r == nil {
			r = &row{per: map[string]int{}}
			rows[o.fault] = r
			order = append(order, o.fault)
		}
		r.runs++
		r.jobs += o.jobs
		r.seeds = append(r.seeds, o.seed)
		for _, v := range o.violations {
			r.per[v.Inv]++
		}
		if len(o.violations) > 0 {
			r.failing = append(r.failing, o.seed)
		}
	}
	sort.Strings(order)
	for _, name := range order {
		r := rows[name]
		fmt.Fprintf(&b, "| %s | %d | %d |", name, r.runs, r.jobs)
		for _, inv := range invariants {
			fmt.Fprintf(&b, " %d |", r.per[inv])
		}
		fmt.Fprintf(&b, " %s | %s |\n", seedList(r.seeds), seedList(r.failing))
	}
	if len(muts) > 0 {
		b.WriteString("\n| mutation | fault | expected checker | caught | violations by checker | seed |\n|---|---|---|---|---|---|\n")
		for _, o := range muts {
			var mc mutationCase
			for _, m := range mutationCases {
				if m.mutation == o.mutation {
					mc = m
				}
			}
			per := map[string]int{}
			for _, v := range o.violations {
				per[v.Inv]++
			}
			var parts []string
			for _, inv := range invariants {
				if per[inv] > 0 {
					parts = append(parts, fmt.Sprintf("%s: %d", inv, per[inv]))
				}
			}
			yes := "no"
			if caught(o, mc.want) {
				yes = "yes"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d |\n", o.mutation, o.fault, mc.want, yes, strings.Join(parts, ", "), o.seed)
		}
	}
	return b.String()
}

func seedList(s []uint64) string {
	if len(s) == 0 {
		return "–"
	}
	if len(s) > 3 && s[len(s)-1]-s[0] == uint64(len(s)-1) {
		return fmt.Sprintf("%d–%d", s[0], s[len(s)-1])
	}
	var parts []string
	for _, x := range s {
		parts = append(parts, fmt.Sprint(x))
	}
	return strings.Join(parts, ", ")
}

// writeDoc replaces the generated part of docs/reliability.md (between the
// markers) with the new table, the date and the machine.
func writeDoc(t *testing.T, path, table string) {
	const begin, end = "<!-- chaos:begin -->", "<!-- chaos:end -->"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("doc: %v", err)
	}
	doc := string(raw)
	i, k := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || k < i {
		t.Fatalf("doc %s lacks the %s … %s markers", path, begin, end)
	}
	host, _ := os.Hostname()
	kernel, _ := exec.Command("uname", "-sr").Output()
	gen := fmt.Sprintf("%s\nLast run: %s on %s (%s, %d cores, %s), `%s`.\n\n%s%s",
		begin, time.Now().UTC().Format("2006-01-02 15:04 MST"), host, strings.TrimSpace(string(kernel)), runtime.NumCPU(),
		runtime.Version(), strings.Join(append([]string{"go test ./chaos"}, chaosArgs()...), " "), table, end)
	doc = doc[:i] + gen + doc[k+len(end):]
	if err := os.WriteFile(filepath.Clean(path), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
}

func chaosArgs() []string {
	var out []string
	flag.Visit(func(f *flag.Flag) {
		if strings.HasPrefix(f.Name, "chaos.") && f.Name != "chaos.doc" {
			out = append(out, "-"+f.Name+"="+f.Value.String())
		}
	})
	return out
}
