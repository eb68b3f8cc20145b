package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"jobfence/internal/apitest"
	"jobfence/isolation"
	"jobfence/jobs"
)

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == isolation.ShimCommand {
		os.Exit(isolation.ShimMain(os.Args[2:]))
	}
	if len(os.Args) > 2 && os.Args[1] == "helper" {
		os.Exit(helper(os.Args[2], os.Args[3:]))
	}
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	if code == 0 {
		// The spawner goroutine lives for the process by design: PDEATHSIG is
		// tied to its thread.
		if err := goleak.Find(goleak.IgnoreTopFunction("jobfence/isolation.spawnLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func helper(name string, args []string) int {
	switch name {
	case "exit":
		n, _ := strconv.Atoi(args[0])
		return n
	case "alloc":
		n, _ := strconv.Atoi(args[0])
		var keep [][]byte
		for i := 0; i < n; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			keep = append(keep, b)
		}
		return len(keep) & 0
	case "count": // count FILE: one line per execution
		f, err := os.OpenFile(args[0], os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
		if err != nil {
			return 3
		}
		f.WriteString("run\n")
		f.Close()
		return 0
	case "hold": // hold PIDFILE RELEASEFILE
		writePid(args[0])
		for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(args[1]); err == nil {
				return 0
			}
		}
		return 5
	case "log-term": // log-term PIDFILE: note SIGTERM, keep running
		ch := make(chan os.Signal, 4)
		signal.Notify(ch, syscall.SIGTERM)
		writePid(args[0])
		for range ch {
			f, _ := os.OpenFile(args[0]+".term", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			f.WriteString("term\n")
			f.Close()
		}
	case "ignore-term":
		signal.Ignore(syscall.SIGTERM)
		writePid(args[0])
		for {
			time.Sleep(time.Hour)
		}
	case "daemon": // daemon PIDFILE: setsid double fork, TERM-ignoring grandchild, exit 0
		self, _ := os.Executable()
		p, err := os.StartProcess(self, []string{self, "helper", "daemon-mid", args[0]},
			&os.ProcAttr{Files: []*os.File{nil, nil, nil}, Sys: &syscall.SysProcAttr{Setsid: true}})
		if err != nil {
			return 3
		}
		p.Wait()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(args[0]); len(b) > 0 {
				return 0
			}
		}
		return 4
	case "daemon-mid":
		self, _ := os.Executable()
		if _, err := os.StartProcess(self, []string{self, "helper", "ignore-term", args[0]},
			&os.ProcAttr{Files: []*os.File{nil, nil, nil}, Sys: &syscall.SysProcAttr{Setsid: true}}); err != nil {
			return 3
		}
		return 0
	}
	return 99
}

func writePid(path string) {
	os.WriteFile(path+".tmp", []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	os.Rename(path+".tmp", path)
}

func waitPidFile(t testing.TB, path string) int {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				return n
			}
		}
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func exe(t testing.TB) string {
	p, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// syncBuffer collects log output from several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// report is one result envelope the fake server received.
type report struct {
	JobID string
	Env   jobs.ResultEnvelope
	Raw   []byte
	At    time.Time
	// Probe holds what onResult observed at arrival.
	Probe any
}

// fakeServer plays the jobfence server at the process boundary: it records
// registrations and result envelopes and answers like the real API.
type fakeServer struct {
	*httptest.Server
	mu       sync.Mutex
	regs     []jobs.AgentRegistration
	reports  []report
	changed  chan struct{}
	onResult func(jobID string) any
	onReg    func(jobs.AgentRegistration) any
	regProbe []any
	// failFirst answers this many result POSTs with 503 before accepting.
	failFirst int
	attempts  int
}

const (
	agentToken    = "agent-token-for-tests"
	dispatchToken = "dispatch-token-for-tests"
)

func newFakeServer(t testing.TB) *fakeServer {
	fs := &fakeServer{changed: make(chan struct{}, 1)}
	mux := http.NewServeMux()
	auth := func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+agentToken }
	mux.HandleFunc("PUT /v1/agents/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !auth(r) {
			w.WriteHeader(401)
			return
		}
		var reg jobs.AgentRegistration
		if err := json.NewDecoder(r.Body).Decode(&reg); err != nil {
			w.WriteHeader(400)
			return
		}
		var probe any
		if fs.onReg != nil {
			probe = fs.onReg(reg)
		}
		fs.mu.Lock()
		fs.regs = append(fs.regs, reg)
		fs.regProbe = append(fs.regProbe, probe)
		fs.mu.Unlock()
		fs.notify()
		w.WriteHeader(200)
	})
	mux.HandleFunc("POST /v1/jobs/{id}/result", func(w http.ResponseWriter, r *http.Request) {
		if !auth(r) {
			w.WriteHeader(401)
			return
		}
		raw, _ := io.ReadAll(r.Body)
		var env jobs.ResultEnvelope
		if err := json.Unmarshal(raw, &env); err != nil {
			w.WriteHeader(400)
			return
		}
		fs.mu.Lock()
		fs.attempts++
		fail := fs.attempts <= fs.failFirst
		fs.mu.Unlock()
		if fail {
			w.WriteHeader(503)
			return
		}
		rep := report{JobID: r.PathValue("id"), Env: env, Raw: raw, At: time.Now()}
		if fs.onResult != nil {
			rep.Probe = fs.onResult(rep.JobID)
		}
		fs.mu.Lock()
		fs.reports = append(fs.reports, rep)
		fs.mu.Unlock()
		fs.notify()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"applied":true}`))
	})
	fs.Server = httptest.NewServer(mux)
	t.Cleanup(fs.Close)
	return fs
}

func (fs *fakeServer) notify() {
	select {
	case fs.changed <- struct{}{}:
	default:
	}
}

// waitFor polls the recorded state until cond holds.
func (fs *fakeServer) waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	end := time.After(60 * time.Second)
	for {
		fs.mu.Lock()
		ok := cond()
		fs.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-fs.changed:
		case <-time.After(50 * time.Millisecond):
		case <-end:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func (fs *fakeServer) reportFor(t testing.TB, jobID string) report {
	t.Helper()
	var r report
	fs.waitFor(t, "report of "+jobID, func() bool {
		for _, rep := range fs.reports {
			if rep.JobID == jobID {
				r = rep
				return true
			}
		}
		return false
	})
	return r
}

func (fs *fakeServer) reportCount(jobID string) int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	n := 0
	for _, rep := range fs.reports {
		if rep.JobID == jobID {
			n++
		}
	}
	return n
}

func (fs *fakeServer) firstRegistration(t testing.TB) jobs.AgentRegistration {
	t.Helper()
	fs.waitFor(t, "a registration", func() bool { return len(fs.regs) > 0 })
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.regs[0]
}

// testRoot is a private cgroup root, removed afterwards.
func testRoot(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	def, err := isolation.DefaultRoot()
	if err != nil {
		t.Skipf("no cgroup2 mount: %v", err)
	}
	name := "jobfence-agenttest-" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")
	root := filepath.Join(filepath.Dir(def), name)
	t.Cleanup(func() {
		for _, d := range []string{root, "/sys/fs/cgroup/memory/" + name, "/sys/fs/cgroup/pids/" + name} {
			es, _ := os.ReadDir(d)
			for _, e := range es {
				if e.IsDir() {
					t.Errorf("domain %s left behind in %s", e.Name(), d)
					os.Remove(filepath.Join(d, e.Name()))
				}
			}
			os.Remove(d)
		}
	})
	return root
}

type testAgent struct {
	*Agent
	stop   func()
	fs     *fakeServer
	addr   string
	logs   *syncBuffer
	client *Client
	// http is for raw requests; like client's, its every answer is checked
	// against agent/openapi.yaml.
	http *http.Client
}

// startAgent runs an in-process agent against a fake server with short
// graces, and stops it at cleanup.
func startAgent(t *testing.T, mod func(*Config)) *testAgent {
	t.Helper()
	fs := newFakeServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg := Config{
		ID: "agent-1", Listener: ln, ServerURL: fs.URL, Token: agentToken, DispatchToken: dispatchToken,
		Capacity: 2, CgroupRoot: "", ShimPath: exe(t),
		ClockSkew: 100 * time.Millisecond, TermGrace: 200 * time.Millisecond, ReapBound: 3 * time.Second,
		MinRunWindow: 200 * time.Millisecond, Heartbeat: 200 * time.Millisecond,
		DefaultMemory: 64 << 20, DefaultPids: 64,
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.CgroupRoot == "" {
		cfg.CgroupRoot = testRoot(t)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	}
	fs.firstRegistration(t)
	validated := &http.Client{Transport: apitest.TransportFor(t, OpenAPI, nil), Timeout: 30 * time.Second}
	return &testAgent{Agent: a, stop: stop, fs: fs, addr: "http://" + ln.Addr().String(), logs: logs,
		client: &Client{HTTP: validated, Token: dispatchToken}, http: validated}
}

// dispatch builds a request for this agent's epoch with a fundable deadline.
func (ta *testAgent) dispatch(argv ...string) DispatchRequest {
	return DispatchRequest{
		JobID:            uuid.NewString(),
		DispatchRevision: 7,
		InvocationID:     uuid.NewString(),
		Secret:           "s3cret-" + uuid.NewString(),
		AgentEpoch:       ta.Epoch(),
		Deadline:         time.Now().Add(30 * time.Second),
		Spec:             jobs.Spec{Command: argv, Outcome: jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{3}}},
	}
}

func (ta *testAgent) send(t *testing.T, req DispatchRequest) {
	t.Helper()
	slug, err := ta.client.Dispatch(context.Background(), ta.addr, req)
	if err != nil || slug != "" {
		t.Fatalf("dispatch: refusal %q, err %v", slug, err)
	}
}

func (ta *testAgent) status(t *testing.T, id string) string {
	t.Helper()
	st, err := ta.client.Status(context.Background(), ta.addr, id)
	if err != nil {
		t.Fatal(err)
	}
	return st
}
