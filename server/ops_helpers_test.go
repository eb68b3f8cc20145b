package server

// Helpers of the operating tests (issue 8): the real `jobfence` binary,
// built once per package run by TestOperations, started as server and agent
// processes on 127.0.0.1 with their JSON logs captured.

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/isolation"
	"jobfence/jobs"
)

// TestOperations builds the binary once and runs every process-level test
// of issue 8 on it: the metrics endpoints, redaction in the logs, TLS and
// the three-node cluster.
func TestOperations(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binary")
	}
	bin := buildJobfence(t, t.TempDir())
	t.Run("metrics", func(t *testing.T) { testMetricsEndToEnd(t, bin) })
	t.Run("redaction", func(t *testing.T) { testRedactionInProcessLogs(t, bin) })
	t.Run("tls", func(t *testing.T) { testTLSEndToEnd(t, bin) })
	t.Run("three_node", func(t *testing.T) { testThreeNodeCluster(t, bin) })
}

var opsTokens = map[handlers.Role]string{
	handlers.RoleViewer:    "ops-viewer-token-0123456789abcdef",
	handlers.RoleSubmitter: "ops-submitter-token-0123456789abc",
	handlers.RoleOperator:  "ops-operator-token-0123456789abcd",
	handlers.RoleAgent:     "ops-agent-token-0123456789abcdefg",
}

const opsDispatchToken = "ops-dispatch-token-0123456789abcdef"

// ops is one test's set of processes, files and HTTP client.
type ops struct {
	t        *testing.T
	bin      string
	dir      string
	tokens   string
	dispatch string
	agentTok string
	client   *http.Client

	mu    sync.Mutex
	procs []*opsProc
}

type opsProc struct {
	name  string
	cmd   *exec.Cmd
	logs  *opsBuffer
	done  chan struct{}
	found chan string
	base  string
}

type opsBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *opsBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *opsBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newOps(t *testing.T, bin string, tlsCfg *tls.Config) *ops {
	t.Helper()
	o := &ops{t: t, bin: bin, dir: t.TempDir()}
	var entries []handlers.TokenEntry
	for r, tok := range opsTokens {
		entries = append(entries, handlers.TokenEntry{Subject: "ops-" + string(r), Role: r, Token: tok})
	}
	raw, _ := json.Marshal(entries)
	o.tokens = o.write("tokens.json", string(raw))
	o.dispatch = o.write("dispatch-token", opsDispatchToken+"\n")
	o.agentTok = o.write("agent-token", opsTokens[handlers.RoleAgent]+"\n")
	tr := &http.Transport{TLSClientConfig: tlsCfg, MaxIdleConnsPerHost: 8}
	o.client = &http.Client{Transport: tr, Timeout: 20 * time.Second}
	t.Cleanup(func() {
		o.stopAll()
		tr.CloseIdleConnections()
		if t.Failed() {
			o.dumpLogs()
		}
	})
	return o
}

func (o *ops) write(name, content string) string {
	o.t.Helper()
	p := filepath.Join(o.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		o.t.Fatal(err)
	}
	return p
}

func (o *ops) dumpLogs() {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range o.procs {
		logs := p.logs.String()
		if len(logs) > 5000 {
			logs = "…" + logs[len(logs)-5000:]
		}
		o.t.Logf("--- %s ---\n%s", p.name, logs)
	}
}

// start runs cmd and, when ready is set, waits for the first log line it
// accepts (its answer becomes the process's base URL).
func (o *ops) start(name string, cmd *exec.Cmd, ready func(line []byte) string) *opsProc {
	o.t.Helper()
	p := o.launch(name, cmd, ready)
	if ready != nil {
		o.await(p)
	}
	return p
}

// launch starts cmd and returns at once; await waits for its ready line.
func (o *ops) launch(name string, cmd *exec.Cmd, ready func(line []byte) string) *opsProc {
	o.t.Helper()
	p := &opsProc{name: name, cmd: cmd, logs: &opsBuffer{}, done: make(chan struct{}), found: make(chan string, 1)}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		o.t.Fatal(err)
	}
	cmd.Stdout = p.logs
	if err := cmd.Start(); err != nil {
		o.t.Fatal(err)
	}
	o.mu.Lock()
	o.procs = append(o.procs, p)
	o.mu.Unlock()
	found := p.found
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
	return p
}

func (o *ops) await(p *opsProc) {
	o.t.Helper()
	select {
	case p.base = <-p.found:
	case <-p.done:
		o.t.Fatalf("%s exited before it was ready:\n%s", p.name, p.logs.String())
	case <-time.After(120 * time.Second):
		o.t.Fatalf("%s not ready within 120s:\n%s", p.name, p.logs.String())
	}
}

func (p *opsProc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (o *ops) stopAll() {
	o.mu.Lock()
	procs := append([]*opsProc(nil), o.procs...)
	o.mu.Unlock()
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

// serverReady finds the bound address in the server's JSON log; the scheme
// follows its "tls" attribute.
func serverReady(line []byte) string {
	var l struct {
		Msg  string `json:"msg"`
		Addr string `json:"addr"`
		TLS  bool   `json:"tls"`
	}
	if json.Unmarshal(line, &l) != nil || l.Msg != "server_started" {
		return ""
	}
	if l.TLS {
		return "https://" + l.Addr
	}
	return "http://" + l.Addr
}

// startServer runs `jobfence server` with dispatch enabled and waits until
// it is ready; extra flags are appended (a later flag wins).
func (o *ops) startServer(name string, env []string, extra ...string) *opsProc {
	o.t.Helper()
	p := o.launchServer(name, env, extra...)
	o.awaitServer(p)
	return p
}

func (o *ops) launchServer(name string, env []string, extra ...string) *opsProc {
	o.t.Helper()
	args := []string{"server", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(o.dir, name),
		"--tokens-file", o.tokens, "--dispatch-token-file", o.dispatch, "--replica-id", name,
		"--election-ttl", "2s", "--dispatch-interval", "200ms", "--log-format", "json", "--log-level", "debug"}
	cmd := exec.Command(o.bin, append(args, extra...)...)
	cmd.Env = append(os.Environ(), env...)
	return o.launch("server "+name, cmd, serverReady)
}

func (o *ops) awaitServer(p *opsProc) {
	o.t.Helper()
	o.await(p)
	o.waitFor(p.name+" ready", 60*time.Second, func() bool {
		st, _ := o.callAt(p.base, "GET", "/readyz", "", nil)
		return st == http.StatusOK
	})
}

// cgroupRoot is a cgroup root of the test's own, so the agent's startup
// sweep never touches domains of agents other tests run at the same time.
func (o *ops) cgroupRoot() string {
	o.t.Helper()
	if os.Geteuid() != 0 {
		o.t.Skip("the agent needs root to create cgroups")
	}
	def, err := isolation.DefaultRoot()
	if err != nil {
		o.t.Skipf("no cgroup2 mount for the agent: %v", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	root := filepath.Join(filepath.Dir(def), "jobfence-ops-"+hex.EncodeToString(b[:]))
	o.t.Cleanup(func() { opsRemoveCgroupRoot(root) })
	return root
}

// opsRemoveCgroupRoot removes the root directories the agent leaves (it
// removes its domains itself).
func opsRemoveCgroupRoot(root string) {
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

// startAgent runs `jobfence agent` against serverBase on listen (host:port)
// and waits until the server shows it live with verified isolation.
func (o *ops) startAgent(id, serverBase, listen, viewBase string, extra ...string) *opsProc {
	o.t.Helper()
	root := o.cgroupRoot()
	args := []string{"agent", "--id", id, "--listen", listen, "--server", serverBase,
		"--token-file", o.agentTok, "--dispatch-token-file", o.dispatch, "--capacity", "2",
		"--cgroup-root", root, "--clock-skew", "100ms", "--term-grace", "1s", "--reap-bound", "2s",
		"--min-run-window", "1s", "--log-format", "json", "--log-level", "debug"}
	p := o.start("agent "+id, exec.Command(o.bin, append(args, extra...)...), nil)
	o.waitFor("agent "+id+" registered and verified", 60*time.Second, func() bool {
		for _, a := range o.agents(viewBase) {
			if a.ID == id && a.Live && a.Isolation.Verified {
				p.base = a.Address
				return true
			}
		}
		return false
	})
	return p
}

type opsAgentView struct {
	ID        string         `json:"id"`
	Address   string         `json:"address"`
	Live      bool           `json:"live"`
	Isolation jobs.Isolation `json:"isolation"`
}

func (o *ops) agents(base string) []opsAgentView {
	var out struct {
		Agents []opsAgentView `json:"agents"`
	}
	if st, body := o.callAt(base, "GET", "/v1/agents", opsTokens[handlers.RoleViewer], nil); st == http.StatusOK {
		_ = json.Unmarshal(body, &out)
	}
	return out.Agents
}

// callAt answers status 0 on a transport error.
func (o *ops) callAt(base, method, path, token string, body any, header ...string) (int, []byte) {
	o.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			o.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		o.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := o.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// submit admits body at base and returns the job id; it fails the test on
// anything but 201.
func (o *ops) submit(base string, body map[string]any) string {
	o.t.Helper()
	st, raw := o.callAt(base, "POST", "/v1/jobs", opsTokens[handlers.RoleSubmitter], body)
	if st != http.StatusCreated {
		o.t.Fatalf("admission at %s: %d %s", base, st, raw)
	}
	var j struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(raw, &j)
	return j.ID
}

func (o *ops) job(base, id string) *jobs.Job {
	st, raw := o.callAt(base, "GET", "/v1/jobs/"+id, opsTokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return nil
	}
	var j jobs.Job
	if json.Unmarshal(raw, &j) != nil {
		return nil
	}
	return &j
}

func (o *ops) waitState(base, id string, want jobs.State) *jobs.Job {
	o.t.Helper()
	var last *jobs.Job
	o.waitFor(fmt.Sprintf("job %s %s", id, want), 60*time.Second, func() bool {
		last = o.job(base, id)
		return last != nil && last.State == want
	})
	return last
}

// waitFor polls cond until it holds or within passes.
func (o *ops) waitFor(what string, within time.Duration, cond func() bool) {
	o.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			o.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// opsJob is a short shell job with small limits.
func opsJob(target, script string) map[string]any {
	return map[string]any{
		"target":  target,
		"command": []string{"/bin/sh", "-c", script},
		"limits":  map[string]any{"memory_bytes": 64 << 20, "pids": 32, "deadline_seconds": 60},
	}
}

// freeAddr is a 127.0.0.1 port free right now.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape reads a Prometheus text exposition into series → value, where a
// series is the name with its label set as printed ("name{a=\"b\"}").
func (o *ops) scrape(url string) map[string]float64 {
	o.t.Helper()
	resp, err := o.client.Get(url)
	if err != nil {
		o.t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		o.t.Fatalf("scrape %s: %d", url, resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out
}

// hasName reports whether any series of the metric name is present.
func hasName(series map[string]float64, name string) bool {
	for s := range series {
		if s == name || strings.HasPrefix(s, name+"{") {
			return true
		}
	}
	return false
}

// sumOf adds every series of a name whose labels contain each of labels.
func sumOf(series map[string]float64, name string, labels ...string) float64 {
	var n float64
	for s, v := range series {
		if s != name && !strings.HasPrefix(s, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(s, l)
		}
		if ok {
			n += v
		}
	}
	return n
}
