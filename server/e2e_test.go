package server

// End-to-end tests of issue 4's must-shows: the real `jobfence server` and
// `jobfence agent` processes (one binary, built with the jobfence_testhooks
// tag so one test can make a leader die on cue), real cgroups and a real
// etcd. Agent → server traffic passes a proxy the test controls, so a
// partition can be simulated without touching either side.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/internal/apitest"
	"jobfence/internal/etcdtest"
	"jobfence/isolation"
	"jobfence/jobs"
)

// e2eServerSpec is how a test starts one replica.
type e2eServerSpec struct {
	ReplicaID       string
	CredentialsFile string
	RefreshRetry    time.Duration
	// ExitAfterMarkRunning makes the process die between a committed
	// markRunning and the send (must-show 7).
	ExitAfterMarkRunning bool
}

// e2eServerArgs is the command line of one replica on the shared etcd.
func e2eServerArgs(spec e2eServerSpec, prefix, tokens, dispatchToken string) []string {
	args := []string{"server", "--listen", "127.0.0.1:0", "--etcd-endpoints", etcdtest.Endpoint(),
		"--prefix", prefix, "--tokens-file", tokens, "--replica-id", spec.ReplicaID, "--election-ttl", "2s",
		"--dispatch-interval", "200ms", "--dispatch-token-file", dispatchToken,
		"--log-format", "json", "--log-level", "debug"}
	if spec.CredentialsFile != "" {
		args = append(args, "--credentials-file", spec.CredentialsFile)
	}
	if spec.RefreshRetry > 0 {
		args = append(args, "--refresh-retry", spec.RefreshRetry.String())
	}
	return args
}

// e2eServerReady finds the bound address in the server's JSON log.
func e2eServerReady(line []byte) string {
	var l struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
	}
	if json.Unmarshal(line, &l) == nil && l.Msg == "server_started" {
		return "http://" + l.Addr
	}
	return ""
}

var e2eTokens = map[handlers.Role]string{
	handlers.RoleViewer:    "e2e-viewer-token-0123456789ab",
	handlers.RoleSubmitter: "e2e-submitter-token-012345678",
	handlers.RoleOperator:  "e2e-operator-token-0123456789",
	handlers.RoleAgent:     "e2e-agent-token-0123456789abc",
}

const e2eDispatchToken = "e2e-dispatch-token-0123456789"

// e2e is one isolated cluster: its own key prefix, tokens, cgroup root and
// processes, all stopped at cleanup.
type e2e struct {
	t        *testing.T
	dir      string
	bin      string
	prefix   string
	tokens   string
	dispatch string
	cgroup   string
	client   *http.Client
	proxy    *e2eProxy
	mu       sync.Mutex
	procs    []*e2eProc
}

type e2eProc struct {
	name string
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
	base string // http base URL once known
}

func newE2E(t *testing.T, bin string) *e2e {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agent needs root to create cgroups")
	}
	etcdtest.New(t)
	e := &e2e{t: t, dir: t.TempDir(), bin: bin, prefix: etcdtest.Prefix(t)}
	var entries []handlers.TokenEntry
	for r, tok := range e2eTokens {
		entries = append(entries, handlers.TokenEntry{Subject: "e2e-" + string(r), Role: r, Token: tok})
	}
	raw, _ := json.Marshal(entries)
	e.tokens = e.write("tokens.json", string(raw))
	e.dispatch = e.write("dispatch-token", e2eDispatchToken+"\n")
	e.write("agent-token", e2eTokens[handlers.RoleAgent]+"\n")
	var b [6]byte
	_, _ = rand.Read(b[:])
	def, err := isolation.DefaultRoot()
	if err != nil {
		t.Skipf("no cgroup2 mount for the agent: %v", err)
	}
	// A root of its own, so this agent's startup sweep never touches the
	// domains of agents other tests run at the same time.
	e.cgroup = filepath.Join(filepath.Dir(def), "jobfence-e2e-"+hex.EncodeToString(b[:]))
	tr := &http.Transport{MaxIdleConnsPerHost: 16}
	e.client = &http.Client{Transport: apitest.Transport(t, tr), Timeout: 30 * time.Second}
	e.proxy = startE2EProxy(t)
	t.Cleanup(func() {
		e.stopAll()
		tr.CloseIdleConnections()
		removeCgroupRoot(e.cgroup)
		if t.Failed() {
			e.dumpLogs()
		}
	})
	return e
}

func (e *e2e) write(name, content string) string {
	e.t.Helper()
	p := filepath.Join(e.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *e2e) dumpLogs() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.procs {
		logs := p.logs.String()
		if len(logs) > 6000 {
			logs = "…" + logs[len(logs)-6000:]
		}
		e.t.Logf("--- %s logs ---\n%s", p.name, logs)
	}
}

// removeCgroupRoot removes what an agent left of its root (the domains
// themselves are removed by the agent; the root directories are not).
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

func (e *e2e) start(name string, cmd *exec.Cmd, ready func(line []byte) string) *e2eProc {
	e.t.Helper()
	p := &e2eProc{name: name, cmd: cmd, logs: &syncBuffer{}, done: make(chan struct{})}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout = p.logs
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = p.logs.Write(append(append([]byte(nil), line...), '\n'))
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
		return p
	}
	select {
	case p.base = <-found:
	case <-p.done:
		e.t.Fatalf("%s exited before it was ready:\n%s", name, p.logs.String())
	case <-time.After(60 * time.Second):
		e.t.Fatalf("%s not ready within 60s:\n%s", name, p.logs.String())
	}
	return p
}

func (p *e2eProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (e *e2e) stopAll() {
	e.mu.Lock()
	procs := append([]*e2eProc(nil), e.procs...)
	e.mu.Unlock()
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			p.kill()
		}
	}
}

type serverOpt func(*e2eServerSpec)

// server starts one replica on the shared etcd and the cluster's prefix.
func (e *e2e) server(name string, opts ...serverOpt) *e2eProc {
	e.t.Helper()
	spec := e2eServerSpec{ReplicaID: name}
	for _, o := range opts {
		o(&spec)
	}
	cmd := exec.Command(e.bin, e2eServerArgs(spec, e.prefix, e.tokens, e.dispatch)...)
	cmd.Env = os.Environ()
	if spec.ExitAfterMarkRunning {
		cmd.Env = append(cmd.Env, "JOBFENCE_TEST_EXIT_AFTER_MARK_RUNNING=1")
	}
	p := e.start(name, cmd, e2eServerReady)
	e.waitFor("server "+name+" ready", 30*time.Second, func() bool {
		st, _ := e.callAt(p.base, "GET", "/readyz", "", nil)
		return st == http.StatusOK
	})
	return p
}

// agent starts the real agent binary; its traffic to the server goes
// through the proxy, which forwards to target.
func (e *e2e) agent(id string, target *e2eProc, capacity int) *e2eProc {
	e.t.Helper()
	e.proxy.setTarget(target.base)
	cmd := exec.Command(e.bin, "agent", "--id", id, "--listen", "127.0.0.1:0", "--server", e.proxy.url,
		"--token-file", filepath.Join(e.dir, "agent-token"), "--dispatch-token-file", e.dispatch,
		"--capacity", fmt.Sprint(capacity), "--cgroup-root", e.cgroup,
		"--clock-skew", "100ms", "--term-grace", "1s", "--reap-bound", "2s", "--min-run-window", "1s",
		"--log-format", "json", "--log-level", "debug")
	p := e.start("agent "+id, cmd, nil)
	e.waitFor("agent "+id+" registered and verified", 60*time.Second, func() bool {
		for _, a := range e.agents() {
			if a.ID == id && a.Live && a.Isolation.Verified && strings.Contains(p.logs.String(), a.Epoch) {
				return true
			}
		}
		return false
	})
	return p
}

type e2eAgentView struct {
	ID        string         `json:"id"`
	Epoch     string         `json:"epoch"`
	Live      bool           `json:"live"`
	SlotsHeld int            `json:"slots_held"`
	Isolation jobs.Isolation `json:"isolation"`
}

func (e *e2e) agents() []e2eAgentView {
	var out struct {
		Agents []e2eAgentView `json:"agents"`
	}
	if st, body := e.call("GET", "/v1/agents", e2eTokens[handlers.RoleViewer], nil); st == http.StatusOK {
		_ = json.Unmarshal(body, &out)
	}
	return out.Agents
}

// liveBase is a server that still answers (replicas die in some tests).
func (e *e2e) liveBase() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.procs {
		if p.base == "" {
			continue
		}
		select {
		case <-p.done:
		default:
			return p.base
		}
	}
	return ""
}

func (e *e2e) call(method, path, token string, body any) (int, []byte) {
	return e.callAt(e.liveBase(), method, path, token, body)
}

func (e *e2e) callAt(base, method, path, token string, body any) (int, []byte) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func (e *e2e) submit(body map[string]any) string {
	e.t.Helper()
	st, raw := e.call("POST", "/v1/jobs", e2eTokens[handlers.RoleSubmitter], body)
	if st != http.StatusCreated {
		e.t.Fatalf("submit: %d %s", st, raw)
	}
	var j jobs.Job
	_ = json.Unmarshal(raw, &j)
	return j.ID
}

func (e *e2e) job(id string) *jobs.Job {
	e.t.Helper()
	st, raw := e.call("GET", "/v1/jobs/"+id, e2eTokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return nil
	}
	var j jobs.Job
	if err := json.Unmarshal(raw, &j); err != nil {
		e.t.Fatalf("job json: %v", err)
	}
	return &j
}

func (e *e2e) fences() int {
	var out struct {
		Fences []json.RawMessage `json:"fences"`
	}
	_, raw := e.call("GET", "/v1/fences", e2eTokens[handlers.RoleViewer], nil)
	_ = json.Unmarshal(raw, &out)
	return len(out.Fences)
}

// waitJob polls until cond holds for the job and returns it.
func (e *e2e) waitJob(id, what string, within time.Duration, cond func(*jobs.Job) bool) *jobs.Job {
	e.t.Helper()
	var last *jobs.Job
	e.waitFor(what, within, func() bool {
		last = e.job(id)
		return last != nil && cond(last)
	})
	return last
}

func (e *e2e) waitFor(what string, within time.Duration, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// e2eProxy forwards the agent's requests to a server; results can be held
// back, as a partition between agent and server would.
type e2eProxy struct {
	url    string
	mu     sync.Mutex
	target *url.URL
	hold   chan struct{} // non-nil: result reports wait until it is closed
}

func startE2EProxy(t *testing.T) *e2eProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &e2eProxy{url: "http://" + ln.Addr().String()}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		r.SetURL(target)
	}, ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
		w.WriteHeader(http.StatusBadGateway)
	}}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/result") {
			p.mu.Lock()
			hold := p.hold
			p.mu.Unlock()
			if hold != nil {
				select {
				case <-hold:
				case <-r.Context().Done():
					return
				}
			}
		}
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		p.release()
		_ = srv.Close()
	})
	return p
}

func (p *e2eProxy) setTarget(base string) {
	u, _ := url.Parse(base)
	p.mu.Lock()
	p.target = u
	p.mu.Unlock()
}

func (p *e2eProxy) holdResults() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == nil {
		p.hold = make(chan struct{})
	}
}

func (p *e2eProxy) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold != nil {
		close(p.hold)
		p.hold = nil
	}
}

func e2eBuild(t testing.TB) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "jobfence")
	out, err := exec.Command(goBin, "build", "-tags", "jobfence_testhooks", "-o", bin, "jobfence/cmd/jobfence").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func shJob(target, script string, deadline int, extra map[string]any) map[string]any {
	b := map[string]any{
		"target":  target,
		"command": []string{"/bin/sh", "-c", script},
		"limits":  map[string]any{"memory_bytes": 64 << 20, "pids": 32, "deadline_seconds": deadline},
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}
