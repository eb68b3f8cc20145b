package agent

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"jobfence/internal/apitest"
	"jobfence/jobs"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binOut  []byte
)

// jobfenceBinary builds ./cmd/jobfence once per test run. JOBFENCE_TEST_BIN
// points at a prebuilt binary instead.
func jobfenceBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("JOBFENCE_TEST_BIN"); p != "" {
		return p
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "jobfence-bin-")
		if err != nil {
			binErr = err
			return
		}
		binPath = filepath.Join(dir, "jobfence")
		binOut, binErr = exec.Command("go", "build", "-o", binPath, "jobfence/cmd/jobfence").CombinedOutput()
	})
	if binErr != nil {
		t.Fatalf("build jobfence: %v\n%s", binErr, binOut)
	}
	t.Cleanup(func() {})
	return binPath
}

// Issue 8, must show 3: the doctor answers 0 on a verified root and non-zero
// with the reason on an unusable one.
func TestDoctor(t *testing.T) {
	bin := jobfenceBinary(t)
	root := testRoot(t)
	out, err := exec.Command(bin, "doctor", "--cgroup-root", root).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("isolation:    verified")) {
		t.Fatalf("doctor on %s: %v\n%s", root, err, out)
	}
	bad := filepath.Join(t.TempDir(), "not-a-cgroup")
	out, err = exec.Command(bin, "doctor", "--cgroup-root", bad).CombinedOutput()
	var ee *exec.ExitError
	if !errorsAs(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("doctor on an unusable root: %v\n%s", err, out)
	}
	for _, want := range []string{"UNVERIFIED", "reason:", "not on cgroup2", RefusalIsolationUnverified} {
		if !bytes.Contains(out, []byte(want)) {
			t.Fatalf("doctor output lacks %q:\n%s", want, out)
		}
	}
}

func errorsAs(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok
}

type agentProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
}

func startAgentProcess(t *testing.T, bin, serverURL, root, dir string) *agentProc {
	t.Helper()
	tok, dtok := filepath.Join(dir, "token"), filepath.Join(dir, "dispatch-token")
	os.WriteFile(tok, []byte(agentToken+"\n"), 0o600)
	os.WriteFile(dtok, []byte(dispatchToken+"\n"), 0o600)
	cmd := exec.Command(bin, "agent", "--id", "agent-9", "--listen", "127.0.0.1:0", "--server", serverURL,
		"--token-file", tok, "--dispatch-token-file", dtok, "--capacity", "1", "--cgroup-root", root,
		"--clock-skew", "100ms", "--term-grace", "200ms", "--reap-bound", "3s", "--min-run-window", "200ms",
		"--log-format", "text")
	p := &agentProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// Must show 5: kill -9 the agent while a job runs. The worker dies with it
// (PDEATHSIG); a grandchild left in the domain is killed, and the domain
// removed, by the restarted agent before it registers its new epoch.
func TestAgentKilledLeftoversSweptBeforeNewEpoch(t *testing.T) {
	bin := jobfenceBinary(t)
	root := testRoot(t)
	fs := newFakeServer(t)
	dir := t.TempDir()
	wpid, gpid := filepath.Join(dir, "w.pid"), filepath.Join(dir, "gc.pid")

	var domain string
	var gc int
	var probeMu sync.Mutex
	fs.onReg = func(jobs.AgentRegistration) any {
		probeMu.Lock()
		defer probeMu.Unlock()
		if domain == "" {
			return nil
		}
		_, err := os.Stat(domain)
		return [2]bool{err == nil, alive(gc)}
	}

	first := startAgentProcess(t, bin, fs.URL, root, dir)
	reg1 := fs.firstRegistration(t)
	req := DispatchRequest{
		JobID: "job-1", DispatchRevision: 3, InvocationID: "inv-1", Secret: "secret-1",
		AgentEpoch: reg1.Epoch, Deadline: time.Now().Add(60 * time.Second),
		Spec: jobs.Spec{Command: []string{"/bin/sh", "-c",
			"sleep 1000 & echo $! > " + gpid + "; echo $$ > " + wpid + ".tmp; mv " + wpid + ".tmp " + wpid + "; wait"}},
	}
	c := &Client{HTTP: &http.Client{Timeout: 10 * time.Second, Transport: apitest.TransportFor(t, OpenAPI, nil)}, Token: dispatchToken}
	if slug, err := c.Dispatch(context.Background(), reg1.Address, req); slug != "" || err != nil {
		t.Fatalf("dispatch: %q %v", slug, err)
	}
	w := waitPidFile(t, wpid)
	probeMu.Lock()
	gc = waitPidFile(t, gpid)
	domain = filepath.Join(root, "d."+reg1.Epoch+"."+req.InvocationID)
	probeMu.Unlock()

	first.cmd.Process.Signal(syscall.SIGKILL)
	<-first.done
	for end := time.Now().Add(20 * time.Second); alive(w); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("worker %d outlived the killed agent", w)
		}
	}
	if !alive(gc) {
		t.Fatal("the grandchild died with the agent; the sweep would be untested")
	}
	if _, err := os.Stat(domain); err != nil {
		t.Fatalf("the leftover domain is already gone: %v", err)
	}

	second := startAgentProcess(t, bin, fs.URL, root, dir)
	var probe any
	var reg2 jobs.AgentRegistration
	fs.waitFor(t, "the new epoch's registration", func() bool {
		for i, r := range fs.regs {
			if r.Epoch != reg1.Epoch {
				reg2, probe = r, fs.regProbe[i]
				return true
			}
		}
		return false
	})
	seen, ok := probe.([2]bool)
	if !ok || seen[0] || seen[1] {
		t.Fatalf("at the new epoch's first registration: domain present %v, grandchild alive %v", seen[0], seen[1])
	}
	if !reg2.Isolation.Verified {
		t.Fatalf("restarted agent unverified: %+v", reg2.Isolation)
	}
	var logs string
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if logs = second.stderr.String(); strings.Contains(logs, "epoch announced") {
			break
		}
	}
	swept, announced := strings.Index(logs, "leftover domain removed"), strings.Index(logs, "epoch announced")
	if swept < 0 || announced < 0 || swept > announced {
		t.Fatalf("want the sweep logged before the announcement:\n%s", logs)
	}
	if strings.Contains(logs, req.Secret) {
		t.Fatal("the dispatch secret is in the agent's log")
	}
}
