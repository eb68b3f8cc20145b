// Command jfbench measures jobfence side by side with the limits of the
// machine it runs on, in the same run: trivial job latency against fork/exec,
// leader failover against the election TTL, idle cost, memory per retained
// job and restart time against etcd alone. It runs real processes (the
// jobfence binary given by -bin, and itself as a standalone etcd member),
// repeats each figure, and prints medians as
//
//	BENCH <name> value=<v> reference=<r> ratio=<v/r> floor=<f> goal=<g>
//
// plus one table that also folds in the BENCH lines of the go test
// benchmarks found in -gotest-output.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"jobfence/internal/etcdembed"
	"jobfence/isolation"
	"jobfence/jobs"
)

const prefix = "/jobfence"

var tokens = map[string]string{
	"viewer":    "bench-viewer-token-0123456789abcdef",
	"submitter": "bench-submitter-token-0123456789abcd",
	"operator":  "bench-operator-token-0123456789abcde",
	"agent":     "bench-agent-token-0123456789abcdef01",
}

// figure is one BENCH line.
type figure struct {
	name                    string
	value, reference, ratio float64
	hasRef                  bool
	floor, goal             string
	unit                    string
	note                    string
}

type bench struct {
	bin      string
	work     string
	reps     int
	interval string // dispatch interval for the latency figures
	log      *slog.Logger
	figures  []figure
	selfExe  string
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "etcd" {
		if err := runEtcdHelper(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "jfbench etcd:", err)
			os.Exit(1)
		}
		return
	}
	fs := flag.NewFlagSet("jfbench", flag.ExitOnError)
	bin := fs.String("bin", "bin/jobfence", "the jobfence binary under test")
	gotest := fs.String("gotest-output", "", "output of the go test benchmarks whose BENCH lines join the table")
	reps := fs.Int("reps", 3, "repetitions of each figure (medians are printed)")
	only := fs.String("only", "", "comma-separated subset: exec,trivial,failover,idle,memory")
	jobsN := fs.Int("retained", 100000, "retained terminal jobs for idle, memory and restart")
	idleFor := fs.Duration("idle", 60*time.Second, "idle window with the retained jobs")
	failReps := fs.Int("failover-reps", 20, "leader kills (and resignations) measured")
	trivialN := fs.Int("trivial-jobs", 2000, "trivial jobs measured after 100 warm-up")
	interval := fs.String("dispatch-interval", "5ms", "dispatcher round interval for the latency figures")
	_ = fs.Parse(os.Args[1:])

	b := &bench{reps: *reps, interval: *interval,
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	var err error
	if b.bin, err = filepath.Abs(*bin); err != nil {
		fatal(err)
	}
	if b.selfExe, err = os.Executable(); err != nil {
		fatal(err)
	}
	if b.work, err = os.MkdirTemp("", "jfbench-"); err != nil {
		fatal(err)
	}
	defer os.RemoveAll(b.work)
	if err := b.writeFiles(); err != nil {
		fatal(err)
	}
	want := func(name string) bool {
		return *only == "" || slices.Contains(strings.Split(*only, ","), name)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	execP50, execP99 := b.execReference()
	if want("trivial") {
		b.step("trivial", func() error { return b.trivial(ctx, *trivialN, execP50, execP99) })
	}
	if want("failover") {
		b.step("failover", func() error { return b.failover(ctx, *failReps) })
	}
	if want("idle") || want("memory") {
		b.step("retained", func() error { return b.retained(ctx, *jobsN, *idleFor, want("idle"), want("memory")) })
	}
	if want("idle") {
		b.step("idle10k", func() error { return b.idleOnce(ctx, 10000, 30*time.Second) })
	}
	if *gotest != "" {
		b.foldGoTest(*gotest)
	}
	b.print()
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "jfbench:", err)
	os.Exit(1)
}

// step runs one group; a failing group is reported and the others still run.
func (b *bench) step(name string, fn func() error) {
	t0 := time.Now()
	if err := fn(); err != nil {
		b.log.Error("bench_group_failed", "group", name, "err", err.Error())
		fmt.Printf("BENCH_ERROR %s %s\n", name, strings.ReplaceAll(err.Error(), "\n", " "))
		return
	}
	b.log.Info("bench_group_done", "group", name, "seconds", time.Since(t0).Seconds())
}

func (b *bench) add(f figure) {
	if f.hasRef && f.reference != 0 {
		f.ratio = f.value / f.reference
	}
	b.figures = append(b.figures, f)
	fmt.Println(f.line())
}

func (f figure) line() string {
	ref, ratio := "-", "-"
	if f.hasRef {
		ref, ratio = num(f.reference), fmt.Sprintf("%.3f", f.ratio)
	}
	return fmt.Sprintf("BENCH %s value=%s reference=%s ratio=%s floor=%s goal=%s", f.name, num(f.value), ref, ratio, f.floor, f.goal)
}

func num(v float64) string {
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e12:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

func (b *bench) print() {
	fmt.Println()
	fmt.Printf("| %-30s | %12s | %12s | %8s | %-18s | %-18s | %s\n", "figure", "value", "reference", "ratio", "floor", "goal", "unit / note")
	fmt.Printf("|%s|%s|%s|%s|%s|%s|%s\n", strings.Repeat("-", 32), strings.Repeat("-", 14), strings.Repeat("-", 14), strings.Repeat("-", 10), strings.Repeat("-", 20), strings.Repeat("-", 20), "---")
	for _, f := range b.figures {
		ref, ratio := "-", "-"
		if f.hasRef {
			ref, ratio = num(f.reference), fmt.Sprintf("%.3f", f.ratio)
		}
		fmt.Printf("| %-30s | %12s | %12s | %8s | %-18s | %-18s | %s %s\n", f.name, num(f.value), ref, ratio, f.floor, f.goal, f.unit, f.note)
	}
}

// foldGoTest takes the medians of the BENCH lines the go test benchmarks
// printed (one per -count repetition) into the table.
func (b *bench) foldGoTest(path string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		b.log.Warn("gotest_output_unreadable", "err", err.Error())
		return
	}
	type acc struct {
		fields map[string][]float64
		floor  string
		goal   string
		order  int
	}
	seen := map[string]*acc{}
	for _, line := range strings.Split(string(raw), "\n") {
		// go test prints a benchmark's output after its name on one line.
		i := strings.Index(line, "BENCH ")
		if i < 0 {
			continue
		}
		rest := line[i+len("BENCH "):]
		parts := strings.Fields(rest)
		if len(parts) == 0 {
			continue
		}
		a := seen[parts[0]]
		if a == nil {
			a = &acc{fields: map[string][]float64{}, order: len(seen)}
			seen[parts[0]] = a
		}
		for _, kv := range parts[1:] {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "floor":
				a.floor = v
			case "goal":
				a.goal = v
			default:
				if f, err := strconv.ParseFloat(v, 64); err == nil {
					a.fields[k] = append(a.fields[k], f)
				}
			}
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return seen[names[i]].order < seen[names[j]].order })
	for _, n := range names {
		a := seen[n]
		f := figure{name: n, floor: orDash(a.floor), goal: orDash(a.goal), unit: fmt.Sprintf("(go test, median of %d)", len(a.fields["value"]))}
		f.value = median(a.fields["value"])
		if r, ok := a.fields["reference"]; ok {
			f.hasRef, f.reference = true, median(r)
			// The ratio is the median of the per-run ratios when the runs
			// printed one: a run's value and reference were measured together.
			if rr, ok := a.fields["ratio"]; ok {
				b.figures = append(b.figures, figure{name: f.name, value: f.value, reference: f.reference, hasRef: true,
					ratio: median(rr), floor: f.floor, goal: f.goal, unit: f.unit})
				fmt.Println(b.figures[len(b.figures)-1].line())
				continue
			}
		}
		b.add(f)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// pct is the p-th percentile (0..100) by nearest rank below, as the anchors
// measured it: index floor(p/100*(n-1)) of the sorted values.
func pct(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(p/100*float64(len(s)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ---------------------------------------------------------------- files

func (b *bench) writeFiles() error {
	type entry struct {
		Subject string `json:"subject"`
		Role    string `json:"role"`
		Token   string `json:"token"`
	}
	var entries []entry
	for role, tok := range tokens {
		entries = append(entries, entry{Subject: "bench-" + role, Role: role, Token: tok})
	}
	raw, _ := json.Marshal(entries)
	files := map[string]string{
		"tokens.json":    string(raw),
		"dispatch-token": "bench-dispatch-token-0123456789abcdef\n",
		"agent-token":    tokens["agent"] + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(b.work, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// ---------------------------------------------------------------- processes

type proc struct {
	name  string
	cmd   *exec.Cmd
	done  chan struct{}
	base  string
	start time.Time
	mu    sync.Mutex
	tail  []string
}

// startProc runs bin with args; ready extracts a value from an output line
// (the listen address, or the etcd helper's READY line) and is awaited.
func (b *bench) startProc(name, bin string, args []string, ready func(string) string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	p.start = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > 40 {
				p.tail = p.tail[len(p.tail)-40:]
			}
			p.mu.Unlock()
			if !sent && ready != nil {
				if v := ready(line); v != "" {
					found <- v
					sent = true
				}
			}
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	if ready == nil {
		return p, nil
	}
	select {
	case p.base = <-found:
		return p, nil
	case <-p.done:
		return nil, fmt.Errorf("%s exited before it was ready: %s", name, p.lastLines())
	case <-time.After(90 * time.Second):
		p.kill()
		return nil, fmt.Errorf("%s not ready within 90s: %s", name, p.lastLines())
	}
}

func (p *proc) lastLines() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop asks politely and kills after a bound.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		p.kill()
	}
}

func serverReady(line string) string {
	var l struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "server_started" {
		return "http://" + l.Addr
	}
	return ""
}

type serverOpts struct {
	id        string
	endpoint  string // external etcd; "" = embedded in dataDir
	dataDir   string
	clientURL string // embedded member's client URL
	interval  string // "" = default
}

func (b *bench) server(o serverOpts) (*proc, error) {
	args := []string{"server", "--listen", "127.0.0.1:0", "--tokens-file", filepath.Join(b.work, "tokens.json"),
		"--replica-id", o.id, "--dispatch-token-file", filepath.Join(b.work, "dispatch-token"),
		"--retention", "87600h", "--quota-global", "100000", "--quota-per-scope", "50000",
		"--log-format", "json", "--log-level", "info"}
	if o.endpoint != "" {
		args = append(args, "--etcd-endpoints", o.endpoint)
	} else {
		args = append(args, "--data-dir", o.dataDir)
		if o.clientURL != "" {
			args = append(args, "--etcd-client-url", o.clientURL)
		}
	}
	if o.interval != "" {
		args = append(args, "--dispatch-interval", o.interval)
	}
	p, err := b.startProc("server "+o.id, b.bin, args, serverReady)
	if err != nil {
		return nil, err
	}
	if err := waitFor(60*time.Second, func() bool { st, _ := call("GET", p.base+"/readyz", "", nil); return st == 200 }); err != nil {
		p.kill()
		return nil, fmt.Errorf("server %s not ready: %w", o.id, err)
	}
	return p, nil
}

func (b *bench) agent(id, serverURL, cgroupRoot string) (*proc, error) {
	return b.startProc("agent "+id, b.bin, []string{"agent", "--id", id, "--listen", "127.0.0.1:0", "--server", serverURL,
		"--token-file", filepath.Join(b.work, "agent-token"), "--dispatch-token-file", filepath.Join(b.work, "dispatch-token"),
		"--capacity", "1", "--cgroup-root", cgroupRoot,
		"--clock-skew", "100ms", "--term-grace", "1s", "--reap-bound", "2s", "--min-run-window", "1s",
		"--log-format", "json", "--log-level", "warn"}, nil)
}

func (b *bench) waitAgent(base, id string) error {
	return waitFor(60*time.Second, func() bool {
		var out struct {
			Agents []struct {
				ID        string `json:"id"`
				Live      bool   `json:"live"`
				Isolation struct {
					Verified bool `json:"verified"`
				} `json:"isolation"`
			} `json:"agents"`
		}
		st, body := call("GET", base+"/v1/agents", tokens["viewer"], nil)
		if st != 200 || json.Unmarshal(body, &out) != nil {
			return false
		}
		for _, a := range out.Agents {
			if a.ID == id && a.Live && a.Isolation.Verified {
				return true
			}
		}
		return false
	})
}

// etcdHelper starts this program as a standalone etcd member on dir.
func (b *bench) etcdHelper(dir string) (*proc, time.Duration, error) {
	t0 := time.Now()
	p, err := b.startProc("etcd", b.selfExe, []string{"etcd", "-dir", dir}, func(line string) string {
		if ep, ok := strings.CutPrefix(line, "READY "); ok {
			return ep
		}
		return ""
	})
	if err != nil {
		return nil, 0, err
	}
	return p, time.Since(t0), nil
}

// runEtcdHelper is the reference: etcd alone, in a process of its own, so
// its RSS and reopen time compare with a server's.
func runEtcdHelper(args []string) error {
	fs := flag.NewFlagSet("etcd", flag.ExitOnError)
	dir := fs.String("dir", "", "data dir")
	_ = fs.Parse(args)
	e, err := etcdembed.Start(etcdembed.Config{DataDir: *dir, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	// Listen before announcing: the parent signals as soon as it reads READY.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	fmt.Printf("READY %s\n", e.Endpoint)
	for s := range sig {
		if s == syscall.SIGUSR1 {
			runtime.GC()
			debug.FreeOSMemory()
			fmt.Printf("GC_DONE\n")
			continue
		}
		break
	}
	return e.Close()
}

func rssKiB(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS")
}

// cpuTicks is utime+stime of pid in clock ticks (USER_HZ, 100 on Linux).
func cpuTicks(pid int) (int64, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(raw)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:])
	// Fields after the command: state is f[0]; utime and stime are the
	// 14th and 15th fields of the whole line, f[11] and f[12] here.
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("unreadable stat")
	}
	return u + st, nil
}

// ---------------------------------------------------------------- HTTP

var httpClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

func call(method, url, token string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, nil
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func submit(base, target string) (string, error) {
	st, body := call("POST", base+"/v1/jobs", tokens["submitter"], map[string]any{"target": target, "command": []string{"/bin/true"}})
	if st != http.StatusCreated {
		return "", fmt.Errorf("admission answered %d: %s", st, body)
	}
	var j struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &j); err != nil {
		return "", err
	}
	return j.ID, nil
}

// describe is a job's outcome in one line (code, proof, detail and its
// history's events), for an error that must say why a figure stopped.
func describe(base, id string) string {
	var j struct {
		Result *struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		} `json:"result"`
		Slot struct {
			Proof string `json:"proof"`
		} `json:"slot"`
		History []struct {
			Actor  string `json:"actor"`
			Event  string `json:"event"`
			Detail string `json:"detail"`
		} `json:"history"`
	}
	var st int
	// The replica's view may trail the watch that saw the state: give it
	// a moment to show the terminal record.
	_ = waitFor(3*time.Second, func() bool {
		var body []byte
		st, body = call("GET", base+"/v1/jobs/"+id, tokens["viewer"], nil)
		return st == http.StatusOK && json.Unmarshal(body, &j) == nil && j.Result != nil
	})
	if st != http.StatusOK {
		return fmt.Sprintf("(record not readable: %d)", st)
	}
	out := "proof " + j.Slot.Proof
	if j.Result != nil {
		out += ", result " + j.Result.Code + " " + j.Result.Detail
	}
	for _, h := range j.History {
		out += fmt.Sprintf("; %s by %s %s", h.Event, h.Actor, h.Detail)
	}
	return out
}

func leaderID(base string) string {
	var s struct {
		Leader struct {
			ID string `json:"id"`
		} `json:"leader"`
	}
	if st, body := call("GET", base+"/v1/status", tokens["viewer"], nil); st == 200 {
		_ = json.Unmarshal(body, &s)
	}
	return s.Leader.ID
}

// waitFor polls cond every 10 ms until it holds or the bound passes.
func waitFor(bound time.Duration, cond func() bool) error {
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		if cond() {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return fmt.Errorf("condition not met within %s", bound)
}

// proxy forwards the agent's calls to whichever replica is alive.
type proxy struct {
	target atomic.Pointer[url.URL]
	srv    *http.Server
	url    string
}

func startProxy() (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{url: "http://" + ln.Addr().String()}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(p.target.Load())
	}, ErrorLog: nil}
	p.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *proxy) set(base string) {
	u, _ := url.Parse(base)
	p.target.Store(u)
}

// ---------------------------------------------------------------- job watch

// tracker records when each job was first seen in each state, from an etcd
// watch on the job records: the time a transition committed, not when a
// poll happened to look.
type tracker struct {
	mu     sync.Mutex
	seen   map[string]map[string]time.Time
	notify chan struct{}
	cancel context.CancelFunc
}

func newTracker(cli *clientv3.Client) *tracker {
	ctx, cancel := context.WithCancel(context.Background())
	t := &tracker{seen: map[string]map[string]time.Time{}, notify: make(chan struct{}), cancel: cancel}
	wch := cli.Watch(ctx, prefix+"/jobs/", clientv3.WithPrefix())
	go func() {
		for resp := range wch {
			now := time.Now()
			t.mu.Lock()
			for _, ev := range resp.Events {
				if ev.Kv == nil || len(ev.Kv.Value) == 0 {
					continue
				}
				var j struct {
					ID    string `json:"id"`
					State string `json:"state"`
				}
				if json.Unmarshal(ev.Kv.Value, &j) != nil {
					continue
				}
				m := t.seen[j.ID]
				if m == nil {
					m = map[string]time.Time{}
					t.seen[j.ID] = m
				}
				if _, ok := m[j.State]; !ok {
					m[j.State] = now
				}
			}
			close(t.notify)
			t.notify = make(chan struct{})
			t.mu.Unlock()
		}
	}()
	return t
}

func (t *tracker) await(id string, states []string, bound time.Duration) (time.Time, string, error) {
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		t.mu.Lock()
		for _, s := range states {
			if at, ok := t.seen[id][s]; ok {
				t.mu.Unlock()
				return at, s, nil
			}
		}
		ch := t.notify
		t.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return time.Time{}, "", fmt.Errorf("job %s not in %v within %s", id, states, bound)
		}
	}
}

var terminal = []string{"COMMITTED", "NOT_COMMITTED", "UNKNOWN"}

// ---------------------------------------------------------------- exec reference

// execReference is fork/exec of /bin/true from this process, 2,000 times
// after 100 warm-up, as the agent does it for a trivial job.
func (b *bench) execReference() (p50, p99 time.Duration) {
	var p50s, p99s []float64
	for range b.reps {
		var d []time.Duration
		for i := range 2100 {
			t0 := time.Now()
			if err := exec.Command("/bin/true").Run(); err != nil {
				fatal(err)
			}
			if i >= 100 {
				d = append(d, time.Since(t0))
			}
		}
		p50s, p99s = append(p50s, ms(pct(d, 50))), append(p99s, ms(pct(d, 99)))
	}
	p50 = time.Duration(median(p50s) * float64(time.Millisecond))
	p99 = time.Duration(median(p99s) * float64(time.Millisecond))
	b.add(figure{name: "exec_true_p50_ms", value: ms(p50), floor: "-", goal: "-", unit: "ms (reference)"})
	b.add(figure{name: "exec_true_p99_ms", value: ms(p99), floor: "-", goal: "-", unit: "ms (reference)"})
	return p50, p99
}

// ---------------------------------------------------------------- trivial job

func cgroupRoot(tag string) (string, error) {
	def, err := isolation.DefaultRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(def), "jobfence-bench-"+tag), nil
}

// removeCgroupRoot removes the empty directories an agent leaves of its root.
func removeCgroupRoot(root string) {
	dirs := []string{root}
	if rel, hybrid := strings.CutPrefix(root, "/sys/fs/cgroup/unified/"); hybrid {
		dirs = append(dirs, "/sys/fs/cgroup/memory/"+rel, "/sys/fs/cgroup/pids/"+rel)
	}
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, en := range entries {
			if en.IsDir() {
				_ = os.Remove(filepath.Join(d, en.Name()))
			}
		}
		_ = os.Remove(d)
	}
}

// cluster is a standalone etcd member, replicas on it, one agent behind a
// proxy, and a watch on the job records.
type cluster struct {
	b       *bench
	etcd    *proc
	cli     *clientv3.Client
	servers map[string]*proc
	agent   *proc
	proxy   *proxy
	track   *tracker
	cgroup  string
}

func (b *bench) newCluster(tag string, replicas ...string) (*cluster, error) {
	c := &cluster{b: b, servers: map[string]*proc{}}
	var err error
	dir := filepath.Join(b.work, "etcd-"+tag)
	if c.etcd, _, err = b.etcdHelper(dir); err != nil {
		return nil, err
	}
	if c.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{c.etcd.base}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}); err != nil {
		c.close()
		return nil, err
	}
	c.track = newTracker(c.cli)
	for _, id := range replicas {
		if err := c.startServer(id); err != nil {
			c.close()
			return nil, err
		}
	}
	if c.proxy, err = startProxy(); err != nil {
		c.close()
		return nil, err
	}
	first := c.servers[replicas[0]]
	c.proxy.set(first.base)
	if c.cgroup, err = cgroupRoot(tag); err != nil {
		c.close()
		return nil, err
	}
	if c.agent, err = b.agent("bench-"+tag, c.proxy.url, c.cgroup); err != nil {
		c.close()
		return nil, err
	}
	if err := b.waitAgent(first.base, "bench-"+tag); err != nil {
		c.close()
		return nil, fmt.Errorf("agent not registered: %w: %s", err, c.agent.lastLines())
	}
	return c, nil
}

func (c *cluster) startServer(id string) error {
	p, err := c.b.server(serverOpts{id: id, endpoint: c.etcd.base, interval: c.b.interval})
	if err != nil {
		return err
	}
	c.servers[id] = p
	return nil
}

func (c *cluster) close() {
	if c.agent != nil {
		c.agent.stop()
	}
	for _, s := range c.servers {
		s.stop()
	}
	if c.proxy != nil {
		_ = c.proxy.srv.Close()
	}
	if c.track != nil {
		c.track.cancel()
	}
	if c.cli != nil {
		_ = c.cli.Close()
	}
	if c.etcd != nil {
		c.etcd.stop()
	}
	if c.cgroup != "" {
		removeCgroupRoot(c.cgroup)
	}
}

// trivial: admission (start of the POST) to the terminal record, one job at
// a time, against fork/exec p50/p99 of this run.
func (b *bench) trivial(ctx context.Context, n int, execP50, execP99 time.Duration) error {
	var p50s, p99s []float64
	for rep := range b.reps {
		c, err := b.newCluster(fmt.Sprintf("trivial%d", rep), "t1")
		if err != nil {
			return err
		}
		base := c.servers["t1"].base
		var d, toRun, toEnd []time.Duration
		for i := range n + 100 {
			if ctx.Err() != nil {
				c.close()
				return ctx.Err()
			}
			t0 := time.Now()
			id, err := submit(base, fmt.Sprintf("trivial/r%d-%d", rep, i))
			if err != nil {
				c.close()
				return err
			}
			at, state, err := c.track.await(id, terminal, 30*time.Second)
			if err != nil || state != "COMMITTED" {
				c.close()
				return fmt.Errorf("trivial job %s: state %q: %v", id, state, err)
			}
			if i >= 100 {
				d = append(d, at.Sub(t0))
				if ra, _, err := c.track.await(id, []string{"RUNNING"}, 0); err == nil {
					toRun, toEnd = append(toRun, ra.Sub(t0)), append(toEnd, at.Sub(ra))
				}
			}
		}
		c.close()
		b.log.Info("trivial_breakdown", "to_running_p50_ms", ms(pct(toRun, 50)), "running_to_terminal_p50_ms", ms(pct(toEnd, 50)),
			"to_running_p99_ms", ms(pct(toRun, 99)), "running_to_terminal_p99_ms", ms(pct(toEnd, 99)))
		p50s, p99s = append(p50s, ms(pct(d, 50))), append(p99s, ms(pct(d, 99)))
		b.log.Info("trivial_rep", "rep", rep, "p50_ms", ms(pct(d, 50)), "p99_ms", ms(pct(d, 99)))
	}
	b.add(figure{name: "trivial_job_p50", value: median(p50s), reference: ms(execP50), hasRef: true, floor: "15", goal: "6",
		unit: "ms", note: "dispatch interval " + b.interval})
	b.add(figure{name: "trivial_job_p99", value: median(p99s), reference: ms(execP99), hasRef: true, floor: "30", goal: "15",
		unit: "ms", note: "dispatch interval " + b.interval})
	return nil
}

// ---------------------------------------------------------------- failover

// failover kills (then, separately, terminates) the leader of two replicas
// with a job submitted right after, and measures to the commit of that job's
// dispatch (RUNNING in etcd) on the new leader.
func (b *bench) failover(ctx context.Context, reps int) error {
	c, err := b.newCluster("failover", "a", "b")
	if err != nil {
		return err
	}
	defer c.close()
	ttl := 5 * time.Second // the server's default election TTL
	run := func(kind string, sig syscall.Signal) ([]time.Duration, error) {
		var out []time.Duration
		for i := range reps {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			var leader string
			if err := waitFor(30*time.Second, func() bool {
				for _, p := range c.servers {
					if id := leaderID(p.base); id != "" {
						leader = id
						return true
					}
				}
				return false
			}); err != nil {
				return nil, errors.New("no leader")
			}
			var follower string
			for id := range c.servers {
				if id != leader {
					follower = id
				}
			}
			lp, fp := c.servers[leader], c.servers[follower]
			if lp == nil || fp == nil {
				return nil, fmt.Errorf("leader %q is not one of ours", leader)
			}
			c.proxy.set(fp.base)
			t0 := time.Now()
			_ = lp.cmd.Process.Signal(sig)
			id, err := submit(fp.base, fmt.Sprintf("failover/%s-%d", kind, i))
			if err != nil {
				return nil, err
			}
			at, _, err := c.track.await(id, append([]string{"RUNNING"}, terminal...), ttl+30*time.Second)
			if err != nil {
				return nil, err
			}
			out = append(out, at.Sub(t0))
			if _, state, err := c.track.await(id, terminal, 30*time.Second); err != nil || state != "COMMITTED" {
				return nil, fmt.Errorf("failover job %s (%s, rep %d) ended %q: %v: %s\n--- %s (stopped leader):\n%s\n--- %s:\n%s\n--- agent:\n%s",
					id, kind, i, state, err, describe(fp.base, id), leader, lp.lastLines(), follower, fp.lastLines(), c.agent.lastLines())
			}
			select {
			case <-lp.done:
			case <-time.After(30 * time.Second):
				lp.kill()
			}
			if err := c.startServer(leader); err != nil {
				return nil, err
			}
			b.log.Info("failover_rep", "kind", kind, "rep", i, "ms", ms(out[len(out)-1]))
		}
		return out, nil
	}
	crash, err := run("kill", syscall.SIGKILL)
	if err != nil {
		return err
	}
	graceful, err := run("term", syscall.SIGTERM)
	if err != nil {
		return err
	}
	ttlMs := ms(ttl)
	b.add(figure{name: "failover_p50", value: ms(pct(crash, 50)), reference: ttlMs, hasRef: true, floor: "-", goal: "<=TTL",
		unit: "ms", note: fmt.Sprintf("n=%d, dispatch interval %s", len(crash), b.interval)})
	b.add(figure{name: "failover_max", value: ms(slices.Max(crash)), reference: ttlMs, hasRef: true, floor: "<=TTL+1000ms", goal: "<=TTL+600ms",
		unit: "ms", note: fmt.Sprintf("n=%d", len(crash))})
	b.add(figure{name: "graceful_handover_p99", value: ms(pct(graceful, 99)), floor: "250ms", goal: "50ms",
		unit: "ms", note: fmt.Sprintf("n=%d, p50 %.1f ms", len(graceful), ms(pct(graceful, 50)))})
	return nil
}

// ---------------------------------------------------------------- retained jobs

// populate writes n terminal (cancelled, never dispatched) job records in
// the exact stored format, one put per job from 64 writers, as admissions
// would have written them (no large raft entries).
func populate(ctx context.Context, cli *clientv3.Client, n int) error {
	now := time.Now().UTC()
	spec := jobs.Spec{Command: []string{"/usr/local/bin/reindex", "--table", "orders", "--index", "idx_customer"},
		Env: map[string]string{"LANG": "C"}, WorkingDir: "/",
		Limits:  jobs.Limits{MemoryBytes: 256 << 20, Pids: 256, DeadlineSeconds: 3600},
		Outcome: jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{}}}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				u, err := uuid.NewV7()
				if err != nil {
					errs <- err
					return
				}
				id := u.String()
				target := jobs.Target{Scope: "warehouse.orders", Name: fmt.Sprintf("idx_%08d", i), Display: fmt.Sprintf("warehouse.orders/IDX_%08d", i)}
				j, _ := jobs.Admit(jobs.AdmitParams{ID: id, Target: target, Operation: "reindex", Spec: spec, QuotaToken: "g0/s0"},
					jobs.Meta{Actor: "bench", At: now})
				j, _, err = jobs.Cancel(j, jobs.Meta{Actor: "bench", At: now})
				if err != nil {
					errs <- err
					return
				}
				j.BlockedReason = ""
				raw, err := json.Marshal(j)
				if err != nil {
					errs <- err
					return
				}
				if _, err := cli.Put(ctx, prefix+"/jobs/"+id, string(raw)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func freeURL() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return "http://" + ln.Addr().String(), nil
}

// retained: idle cost, memory per job and restart time with n retained
// terminal jobs, each against etcd alone with the same records.
func (b *bench) retained(ctx context.Context, n int, idle time.Duration, doIdle, doMem bool) error {
	full := filepath.Join(b.work, "full")
	empty := filepath.Join(b.work, "empty")
	// The server embeds its member under <data-dir>/etcd.
	for _, d := range []string{full, empty} {
		e, _, err := b.etcdHelper(filepath.Join(d, "etcd"))
		if err != nil {
			return err
		}
		if d == full {
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.base}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
			if err != nil {
				e.stop()
				return err
			}
			t0 := time.Now()
			err = populate(ctx, cli, n)
			_ = cli.Close()
			if err != nil {
				e.stop()
				return err
			}
			b.log.Info("populated", "jobs", n, "seconds", time.Since(t0).Seconds())
		}
		e.stop()
	}

	var refReady, refPerJob, srvReady, srvPerJob, writes, cpuPct, rssFull, rssEmpty []float64
	for rep := range b.reps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// etcd alone: reopen time, and RSS after a forced GC, full and empty.
		var rss [2]int64
		for k, d := range []string{full, empty} {
			e, ready, err := b.etcdHelper(filepath.Join(d, "etcd"))
			if err != nil {
				return err
			}
			if k == 0 {
				refReady = append(refReady, ms(ready))
			}
			rss[k], err = b.settledRSS(e, true)
			e.stop()
			if err != nil {
				return err
			}
		}
		refPerJob = append(refPerJob, float64(rss[0]-rss[1])*1024/float64(n))

		// jobfence server with its embedded member on the same records.
		var srss [2]int64
		for k, d := range []string{full, empty} {
			curl, err := freeURL()
			if err != nil {
				return err
			}
			t0 := time.Now()
			p, err := b.server(serverOpts{id: "r", dataDir: d, clientURL: curl})
			if err != nil {
				return err
			}
			if k == 0 {
				srvReady = append(srvReady, ms(time.Since(t0)))
			}
			if err := waitFor(30*time.Second, func() bool { return leaderID(p.base) != "" }); err != nil {
				p.stop()
				return errors.New("no leader with retained jobs")
			}
			srss[k], err = b.settledRSS(p, false)
			if err != nil {
				p.stop()
				return err
			}
			if k == 0 && doIdle && (rep == 0 || idle <= 30*time.Second) {
				w, c, err := b.idleWindow(p, curl, idle)
				if err != nil {
					p.stop()
					return err
				}
				writes, cpuPct = append(writes, float64(w)), append(cpuPct, c)
			}
			p.stop()
		}
		rssFull, rssEmpty = append(rssFull, float64(srss[0])), append(rssEmpty, float64(srss[1]))
		srvPerJob = append(srvPerJob, float64(srss[0]-srss[1])*1024/float64(n))
		b.log.Info("retained_rep", "rep", rep, "server_ready_ms", srvReady[len(srvReady)-1], "etcd_ready_ms", refReady[len(refReady)-1],
			"server_bytes_per_job", srvPerJob[len(srvPerJob)-1], "etcd_bytes_per_job", refPerJob[len(refPerJob)-1])
	}
	if doIdle && len(writes) > 0 {
		b.add(figure{name: "idle_writes", value: median(writes), floor: "0", goal: "0",
			unit: "revisions", note: fmt.Sprintf("%d retained, %s idle, default dispatch interval", n, idle)})
		b.add(figure{name: "idle_cpu_pct", value: median(cpuPct), floor: "2", goal: "0.5",
			unit: "% of one core", note: "whole server process incl. embedded etcd"})
	}
	if doMem {
		b.add(figure{name: "memory_per_job", value: median(srvPerJob), reference: median(refPerJob), hasRef: true, floor: "2", goal: "1.25",
			unit: "bytes/job", note: fmt.Sprintf("server RSS %.0f MiB full, %.0f MiB empty", median(rssFull)/1024, median(rssEmpty)/1024)})
		b.add(figure{name: "restart_ready", value: median(srvReady), reference: median(refReady), hasRef: true, floor: "2", goal: "1.25",
			unit: "ms", note: fmt.Sprintf("%d retained", n)})
	}
	return nil
}

// idleOnce is issue 4's must-show 10 folded into idle_writes: one server
// over n retained terminal jobs, one idle window.
func (b *bench) idleOnce(ctx context.Context, n int, window time.Duration) error {
	dir := filepath.Join(b.work, fmt.Sprintf("idle%d", n))
	e, _, err := b.etcdHelper(filepath.Join(dir, "etcd"))
	if err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.base}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		err = populate(ctx, cli, n)
		_ = cli.Close()
	}
	e.stop()
	if err != nil {
		return err
	}
	curl, err := freeURL()
	if err != nil {
		return err
	}
	p, err := b.server(serverOpts{id: "r", dataDir: dir, clientURL: curl})
	if err != nil {
		return err
	}
	defer p.stop()
	if err := waitFor(30*time.Second, func() bool { return leaderID(p.base) != "" }); err != nil {
		return errors.New("no leader with retained jobs")
	}
	w, c, err := b.idleWindow(p, curl, window)
	if err != nil {
		return err
	}
	note := fmt.Sprintf("%d retained, %s idle", n, window)
	b.add(figure{name: fmt.Sprintf("idle_writes_%dk", n/1000), value: float64(w), floor: "0", goal: "0", unit: "revisions", note: note})
	b.add(figure{name: fmt.Sprintf("idle_cpu_%dk_pct", n/1000), value: c, floor: "2", goal: "0.5", unit: "% of one core", note: note})
	return nil
}

// settledRSS reads a process's RSS once it has settled: after a forced GC
// for the etcd helper (which offers one), else after the RSS stopped
// falling for 2 s (the Go scavenger returns freed pages gradually).
func (b *bench) settledRSS(p *proc, helper bool) (int64, error) {
	pid := p.cmd.Process.Pid
	if helper {
		_ = p.cmd.Process.Signal(syscall.SIGUSR1)
		if err := waitFor(30*time.Second, func() bool { return strings.Contains(p.lastLines(), "GC_DONE") }); err != nil {
			return 0, err
		}
		time.Sleep(500 * time.Millisecond)
		return rssKiB(pid)
	}
	low, err := rssKiB(pid)
	if err != nil {
		return 0, err
	}
	stable := 0
	for range 30 {
		time.Sleep(time.Second)
		r, err := rssKiB(pid)
		if err != nil {
			return 0, err
		}
		if r < low-low/100 {
			low, stable = r, 0
			continue
		}
		if stable++; stable >= 2 {
			break
		}
	}
	return low, nil
}

// idleWindow: etcd revision delta and the server's CPU over the window.
func (b *bench) idleWindow(p *proc, endpoint string, window time.Duration) (int64, float64, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return 0, 0, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), window+time.Minute)
	defer cancel()
	rev := func() (int64, error) {
		r, err := cli.Get(ctx, prefix+"/settings/admission", clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		return r.Header.Revision, nil
	}
	pid := p.cmd.Process.Pid
	r0, err := rev()
	if err != nil {
		return 0, 0, err
	}
	c0, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	t0 := time.Now()
	time.Sleep(window)
	c1, err := cpuTicks(pid)
	if err != nil {
		return 0, 0, err
	}
	elapsed := time.Since(t0)
	r1, err := rev()
	if err != nil {
		return 0, 0, err
	}
	cpu := float64(c1-c0) / 100 / elapsed.Seconds() * 100
	b.log.Info("idle_window", "seconds", elapsed.Seconds(), "revision_delta", r1-r0, "cpu_pct", cpu)
	return r1 - r0, cpu, nil
}
