package chaos

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"jobfence/handlers"
	"jobfence/isolation"
	"jobfence/jobs"
)

// Timing of the cluster under test: short, so a run with a failover and a
// few deadlines fits in seconds.
const (
	electionTTL      = 2 * time.Second
	dispatchInterval = 200 * time.Millisecond
	prefix           = "/chaos"
)

var tokens = map[handlers.Role]string{
	handlers.RoleViewer:    "chaos-viewer-token-0123456789ab",
	handlers.RoleSubmitter: "chaos-submitter-token-01234567",
	handlers.RoleOperator:  "chaos-operator-token-0123456789",
	handlers.RoleAgent:     "chaos-agent-token-0123456789abc",
}

const dispatchToken = "chaos-dispatch-token-0123456789"

// buildBinary builds jobfence once per tag set and test process.
var (
	buildMu  sync.Mutex
	binaries = map[string]string{}
	buildDir string
)

func buildBinary(t testing.TB, tags string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if b, ok := binaries[tags]; ok {
		return b
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "jobfence-chaos-bin-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(buildDir, "jobfence"+strings.ReplaceAll(tags, ",", "-"))
	args := []string{"build", "-o", bin}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	out, err := exec.Command(goBin, append(args, "jobfence/cmd/jobfence")...).CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	binaries[tags] = bin
	return bin
}

type clusterOptions struct {
	servers   int
	mutation  string // JOBFENCE_MUTATION of every process; "" builds without the tag
	quotaByte int64  // every embedded member's backend quota (--etcd-quota-backend-bytes); 0 keeps etcd's
}

// cluster is one isolated run: three servers whose embedded etcd members
// form one etcd cluster (so killing or stopping a server kills or stops a
// database member too, the raft leader among them), two agents, their
// proxies, cgroup roots, the journal and the records. Everything stops at
// cleanup.
type cluster struct {
	t          *testing.T
	dir        string
	bin        string
	opts       clusterOptions
	clientURLs []string // every member's client URL
	cli        *clientv3.Client
	client     *http.Client
	journal    string
	mu         sync.Mutex
	servers    []*proc
	agents     []*agentProc
	hist       *history
	rec        *recorder
	live       *clientv3.Client // see liveClient
	liveKey    string
}

// proc is one restartable process.
type proc struct {
	name string
	args []string
	env  []string
	base string // http base URL (servers: fixed across restarts)
	etcd string // servers: the client URL of the embedded member

	mu       sync.Mutex
	cmd      *exec.Cmd
	logs     *tailBuffer
	done     chan struct{}
	stopped  bool // SIGSTOPped
	restarts int
}

type agentProc struct {
	*proc
	id     string
	cgroup string
	up     *proxy // agent → servers
	down   *proxy // servers → agent
	epoch  string
}

func newCluster(t *testing.T, opts clusterOptions) *cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("the agents need root to create cgroups")
	}
	def, err := isolation.DefaultRoot()
	if err != nil {
		t.Skipf("no cgroup2 mount for the agents: %v", err)
	}
	if opts.servers == 0 {
		opts.servers = 3
	}
	tags := ""
	if opts.mutation != "" {
		tags = "jobfence_mutation"
	}
	c := &cluster{t: t, dir: t.TempDir(), bin: buildBinary(t, tags), opts: opts}
	c.journal = filepath.Join(c.dir, "exec-journal")
	var entries []handlers.TokenEntry
	for r, tok := range tokens {
		entries = append(entries, handlers.TokenEntry{Subject: "chaos-" + string(r), Role: r, Token: tok})
	}
	raw, _ := json.Marshal(entries)
	c.write("tokens.json", string(raw))
	c.write("dispatch-token", dispatchToken+"\n")
	c.write("agent-token", tokens[handlers.RoleAgent]+"\n")
	tr := &http.Transport{MaxIdleConnsPerHost: 32}
	c.client = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	c.rec = &recorder{}
	t.Cleanup(func() {
		c.stopAll()
		c.closeLiveClient()
		tr.CloseIdleConnections()
		for _, a := range c.agents {
			removeCgroupRoot(a.cgroup)
		}
		if c.cli != nil {
			_ = c.cli.Close()
		}
	})

	// Each server keeps its member's data in its --data-dir, so a restart of
	// a server is a restart of a database member on its own data.
	var members, peers []string
	for i := 1; i <= opts.servers; i++ {
		peer := "http://" + freeAddr(t)
		peers = append(peers, peer)
		c.clientURLs = append(c.clientURLs, "http://"+freeAddr(t))
		members = append(members, fmt.Sprintf("s%d=%s", i, peer))
	}
	for i := 1; i <= opts.servers; i++ {
		name := fmt.Sprintf("s%d", i)
		args := []string{"--data-dir", filepath.Join(c.dir, name+"-data"), "--etcd-name", name,
			"--etcd-client-url", c.clientURLs[i-1], "--etcd-peer-url", peers[i-1],
			"--etcd-initial-cluster", strings.Join(members, ","), "--etcd-initial-cluster-state", "new"}
		if opts.quotaByte > 0 {
			args = append(args, "--etcd-quota-backend-bytes", fmt.Sprint(opts.quotaByte))
		}
		c.addServer(name, args...)
		c.servers[len(c.servers)-1].etcd = c.clientURLs[i-1]
	}
	for _, s := range c.servers {
		c.startProc(s)
	}
	c.waitFor("servers ready", 60*time.Second, func() bool {
		for _, s := range c.servers {
			if st, _ := c.callAt(s.base, "GET", "/readyz", "", nil); st != http.StatusOK {
				return false
			}
		}
		return true
	})
	c.cli, err = clientv3.New(clientv3.Config{Endpoints: c.clientURLs, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	c.hist = watchHistory(t, c.cli)
	var b [4]byte
	_, _ = rand.Read(b[:])
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("a%d", i)
		a := &agentProc{id: id, cgroup: filepath.Join(filepath.Dir(def), "jobfence-chaos-"+hex.EncodeToString(b[:])+"-"+id)}
		a.up = startProxy(t, c.liveServer)
		listen := freeAddr(t)
		a.down = startProxy(t, func() string { return "http://" + listen })
		a.proc = &proc{name: "agent " + id, args: []string{"agent", "--id", id, "--listen", listen,
			"--advertise", a.down.url, "--server", a.up.url,
			"--token-file", filepath.Join(c.dir, "agent-token"), "--dispatch-token-file", filepath.Join(c.dir, "dispatch-token"),
			"--capacity", "2", "--cgroup-root", a.cgroup,
			"--clock-skew", "100ms", "--term-grace", "1s", "--reap-bound", "2s", "--min-run-window", "1s",
			"--log-format", "json", "--log-level", "info"}, env: c.procEnv()}
		c.agents = append(c.agents, a)
		c.startAgent(a)
	}
	return c
}

func (c *cluster) procEnv() []string {
	env := os.Environ()
	if c.opts.mutation != "" {
		env = append(env, "JOBFENCE_MUTATION="+c.opts.mutation)
	}
	return env
}

func (c *cluster) addServer(name string, extra ...string) {
	addr := freeAddr(c.t)
	args := append([]string{"server", "--listen", addr, "--prefix", prefix,
		"--tokens-file", filepath.Join(c.dir, "tokens.json"), "--replica-id", name,
		"--election-ttl", electionTTL.String(), "--dispatch-interval", dispatchInterval.String(),
		"--dispatch-token-file", filepath.Join(c.dir, "dispatch-token"),
		"--log-format", "json", "--log-level", "info"}, extra...)
	c.servers = append(c.servers, &proc{name: name, args: args, env: c.procEnv(), base: "http://" + addr})
}

func (c *cluster) write(name, content string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, name), []byte(content), 0o600); err != nil {
		c.t.Fatal(err)
	}
}

// freeAddr picks a free 127.0.0.1 port. Servers keep their address across
// restarts, so the workload and the proxies need no rediscovery.
func freeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (c *cluster) startProc(p *proc) {
	c.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	cmd := exec.Command(c.bin, p.args...)
	cmd.Env = p.env
	if p.logs == nil {
		p.logs = &tailBuffer{max: 64 << 10}
	}
	cmd.Stdout = p.logs
	stderr, err := cmd.StderrPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			_, _ = p.logs.Write(append(sc.Bytes(), '\n'))
		}
		_ = cmd.Wait()
		close(done)
	}()
	p.cmd, p.done, p.stopped = cmd, done, false
}

func (p *proc) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return !p.stopped
	}
}

// kill9 is SIGKILL and the wait for the process to be gone.
func (p *proc) kill9() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

func (p *proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.cmd.Process.Signal(sig)
	p.stopped = sig == syscall.SIGSTOP
}

func (c *cluster) restartServer(s *proc) {
	c.t.Helper()
	s.restarts++
	c.startProc(s)
	c.waitFor("server "+s.name+" ready again", 60*time.Second, func() bool {
		st, _ := c.callAt(s.base, "GET", "/readyz", "", nil)
		return st == http.StatusOK
	})
}

// startAgent starts (or restarts) an agent and waits until the servers see
// its new epoch live with verified isolation.
func (c *cluster) startAgent(a *agentProc) {
	c.t.Helper()
	old := a.epoch
	c.startProc(a.proc)
	c.waitFor("agent "+a.id+" registered", 60*time.Second, func() bool {
		for _, v := range c.agentViews() {
			if v.ID == a.id && v.Live && v.Isolation.Verified && v.Epoch != "" && v.Epoch != old {
				a.epoch = v.Epoch
				return true
			}
		}
		return false
	})
}

// stopAll ends a run whose history is already checked: the agents stop
// gracefully (they end what they run and clean their cgroups), then the
// servers are killed. A graceful stop of all three servers at once would
// lose the etcd quorum halfway and wait out every shutdown step's timeout.
func (c *cluster) stopAll() {
	var agents []*proc
	for _, a := range c.agents {
		agents = append(agents, a.proc)
	}
	for _, p := range agents {
		p.mu.Lock()
		if p.cmd != nil && p.cmd.Process != nil {
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
		p.mu.Unlock()
	}
	for _, p := range agents {
		if p.done == nil {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			p.kill9()
		}
	}
	for _, p := range c.servers {
		if p.done != nil {
			p.kill9()
		}
	}
}

func (c *cluster) dumpLogs() {
	var all []*proc
	all = append(all, c.servers...)
	for _, a := range c.agents {
		all = append(all, a.proc)
	}
	for _, p := range all {
		if p.logs != nil {
			c.t.Logf("--- %s (last lines) ---\n%s", p.name, p.logs.tail(4000))
		}
	}
}

// liveServer is the base URL of a server that is running and not stopped.
func (c *cluster) liveServer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.servers)
	start := int(time.Now().UnixNano()/1000) % n
	for i := range n {
		s := c.servers[(start+i)%n]
		if s.alive() {
			return s.base
		}
	}
	return c.servers[0].base
}

// liveClient is an etcd client of the members whose servers run (neither
// killed nor stopped), for the harness's reads and acts during a fault: a
// request balanced onto a stopped member would hang until it resumes. It is
// rebuilt when the set of running servers changes.
func (c *cluster) liveClient() *clientv3.Client {
	var eps []string
	for _, s := range c.servers {
		if s.alive() {
			eps = append(eps, s.etcd)
		}
	}
	if len(eps) == 0 {
		eps = c.clientURLs
	}
	key := strings.Join(eps, ",")
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live != nil && c.liveKey == key {
		return c.live
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return c.cli
	}
	if c.live != nil {
		_ = c.live.Close()
	}
	c.live, c.liveKey = cli, key
	return cli
}

func (c *cluster) closeLiveClient() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live != nil {
		_ = c.live.Close()
		c.live = nil
	}
}

// campaigner is one replica's election key: the leader's is the oldest.
type campaigner struct {
	srv   *proc
	lease clientv3.LeaseID
}

// electionOrder lists the election keys by create revision: the leader
// first, then the replica that leads when the leader's key goes.
func (c *cluster) electionOrder() []campaigner {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.liveClient().Get(ctx, prefix+"/election/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil
	}
	var out []campaigner
	for _, kv := range resp.Kvs {
		for _, s := range c.servers {
			if s.name == string(kv.Value) {
				out = append(out, campaigner{srv: s, lease: clientv3.LeaseID(kv.Lease)})
			}
		}
	}
	return out
}

// leader is the server process holding the election now (by the election
// key with the lowest create revision, read from etcd).
func (c *cluster) leader() *proc {
	if o := c.electionOrder(); len(o) > 0 {
		return o[0].srv
	}
	return nil
}

// moveRaftLeader makes to's embedded member the etcd raft leader, so that
// stopping the other servers stops no raft leader and needs no raft
// election.
func (c *cluster) moveRaftLeader(to *proc) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	one := func(ep string) (*clientv3.Client, error) {
		return clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	}
	cli, err := one(to.etcd)
	if err != nil {
		return err
	}
	defer cli.Close()
	st, err := cli.Status(ctx, to.etcd)
	if err != nil {
		return err
	}
	if st.Leader == st.Header.MemberId {
		return nil
	}
	members, err := cli.MemberList(ctx)
	if err != nil {
		return err
	}
	for _, m := range members.Members {
		if m.ID != st.Leader || len(m.ClientURLs) == 0 {
			continue
		}
		// MoveLeader is served only by the current raft leader.
		lc, err := one(m.ClientURLs[0])
		if err != nil {
			return err
		}
		defer lc.Close()
		_, err = lc.MoveLeader(ctx, st.Header.MemberId)
		return err
	}
	return fmt.Errorf("raft leader %x not among the members", st.Leader)
}

func (c *cluster) waitLeader(within time.Duration) *proc {
	c.t.Helper()
	var l *proc
	c.waitFor("a live leader", within, func() bool {
		l = c.leader()
		return l != nil && l.alive()
	})
	return l
}

type agentView struct {
	ID        string         `json:"id"`
	Epoch     string         `json:"epoch"`
	Live      bool           `json:"live"`
	Isolation jobs.Isolation `json:"isolation"`
}

func (c *cluster) agentViews() []agentView {
	var out struct {
		Agents []agentView `json:"agents"`
	}
	if st, body := c.callAt(c.liveServer(), "GET", "/v1/agents", tokens[handlers.RoleViewer], nil); st == http.StatusOK {
		_ = json.Unmarshal(body, &out)
	}
	return out.Agents
}

// callAt is one HTTP call; status 0 means no answer (transport error).
func (c *cluster) callAt(base, method, path, token string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			panic(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		return 0, nil
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

func (c *cluster) waitFor(what string, within time.Duration, cond func() bool) {
	c.t.Helper()
	if !poll(within, cond) {
		c.dumpLogs()
		c.t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

// poll checks cond every 50ms until it holds or within has passed.
func poll(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

// removeCgroupRoot removes what an agent left of its root (the agent removes
// its domains, not the root directories).
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

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) tail(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.buf) > n {
		return "…" + string(b.buf[len(b.buf)-n:])
	}
	return string(b.buf)
}
