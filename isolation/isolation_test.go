//go:build linux

package isolation

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func spec(t *testing.T, name string, argv ...string) Spec {
	return Spec{
		Name:        name,
		Argv:        argv,
		Env:         []string{"JOBFENCE_TEST_MARKER=" + name},
		MemoryBytes: 64 << 20,
		Pids:        64,
		Grace:       300 * time.Millisecond,
		ReapBound:   10 * time.Second,
	}
}

func TestExitCodeAndReapProof(t *testing.T) {
	h := testHost(t)
	exe := testExe(t)
	res, err := h.Run(context.Background(), spec(t, "exit3", exe, "helper", "exit", "3"))
	if err != nil {
		t.Fatal(err)
	}
	if !res.Launched || res.ExitCode != 3 || res.Signal != 0 || !res.ReapProof() || !res.Removed || res.Leftovers || res.Killed {
		t.Fatalf("unexpected result %+v", res)
	}
	if _, err := os.Stat(filepath.Join(h.l.v2, "d."+h.Epoch()+".exit3")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("domain directory still there: %v", err)
	}
}

// Must show 1 (isolation level): past the memory limit the kernel kills the
// worker, the domain is reaped and the result says OOM.
func TestMemoryLimitOOMKills(t *testing.T) {
	h := testHost(t)
	s := spec(t, "oom", testExe(t), "helper", "alloc", "256")
	s.MemoryBytes = 32 << 20
	res, err := h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Launched || !res.OOMKilled || res.Signal != syscall.SIGKILL || !res.ReapProof() {
		t.Fatalf("want an OOM kill with a reap proof, got %+v", res)
	}
}

// Must show 2: a fork bomb stays at pids.max, then the domain is killed and
// nothing carrying its marker survives.
func TestForkBombHeldAtPidsLimit(t *testing.T) {
	h := testHost(t)
	s := spec(t, "forkbomb", "/bin/sh", "-c", "trap '' TERM; f(){ f | f & }; f; while :; do sleep 1; done")
	s.Pids = 16
	s.TermAt = time.Now().Add(1500 * time.Millisecond)
	s.Grace = 100 * time.Millisecond
	var maxSeen atomic.Int64
	pidsCurrent := filepath.Join(h.l.v2, "d."+h.Epoch()+".forkbomb", "pids.current")
	if h.l.mode == ModeHybrid {
		pidsCurrent = filepath.Join(h.l.pids, "d."+h.Epoch()+".forkbomb", "pids.current")
	}
	done := make(chan struct{})
	s.Started = func(int) {
		go func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				b, err := os.ReadFile(pidsCurrent)
				if err != nil {
					continue
				}
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				if n > maxSeen.Load() {
					maxSeen.Store(n)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	res, err := h.Run(context.Background(), s)
	close(done)
	if err != nil {
		t.Fatal(err)
	}
	if !res.PidsLimitHit || !res.TermDeadline || !res.Killed || !res.ReapProof() || !res.Removed {
		t.Fatalf("want the pids limit hit and a reaped domain, got %+v", res)
	}
	if m := maxSeen.Load(); m > 16 || m == 0 {
		t.Fatalf("pids.current peaked at %d with pids.max 16", m)
	}
	if left := markerHolders("JOBFENCE_TEST_MARKER=forkbomb"); len(left) > 0 {
		t.Fatalf("fork bomb processes survived: %v", left)
	}
}

// Must show 3: a daemonized, TERM-ignoring grandchild of a worker that exits
// 0 is killed before Run returns.
func TestDaemonizedGrandchildKilled(t *testing.T) {
	h := testHost(t)
	pidfile := filepath.Join(t.TempDir(), "daemon.pid")
	s := spec(t, "daemon", testExe(t), "helper", "daemon", pidfile)
	s.Grace = 100 * time.Millisecond
	res, err := h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Launched || res.ExitCode != 0 || !res.Leftovers || !res.Killed || !res.ReapProof() || !res.Removed {
		t.Fatalf("want exit 0 with leftovers killed and a reap proof, got %+v", res)
	}
	gc := waitPidFile(t, pidfile)
	if alive(gc) {
		t.Fatalf("grandchild %d is still alive after Run returned", gc)
	}
	if left := markerHolders("JOBFENCE_TEST_MARKER=daemon"); len(left) > 0 {
		t.Fatalf("domain processes survived: %v", left)
	}
}

// Must show 4 (isolation level): TERM first, the grace, then the kill.
func TestDeadlineLadderTermGraceKill(t *testing.T) {
	h := testHost(t)
	pidfile := filepath.Join(t.TempDir(), "w.pid")
	s := spec(t, "ladder", testExe(t), "helper", "log-term", pidfile)
	s.Grace = 200 * time.Millisecond
	s.Started = func(int) { waitPidFile(t, pidfile) }
	s.TermAt = time.Now().Add(300 * time.Millisecond)
	res, err := h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TermDeadline || !res.Killed || res.Signal != syscall.SIGKILL || !res.ReapProof() {
		t.Fatalf("want the ladder to end in a kill, got %+v", res)
	}
	if n := countLines(pidfile+".term", "term"); n < 1 {
		t.Fatalf("the worker never saw SIGTERM before the kill")
	}

	// A worker that honours TERM ends by it and is never cgroup-killed.
	s = spec(t, "ladder2", testExe(t), "helper", "sleep")
	s.TermAt = time.Now().Add(200 * time.Millisecond)
	s.Grace = 5 * time.Second
	res, err = h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.TermDeadline || res.Killed || res.Signal != syscall.SIGTERM || !res.ReapProof() {
		t.Fatalf("want an end by SIGTERM, got %+v", res)
	}
}

// Must show 7 (isolation level): a missing binary is rejected before launch.
func TestMissingBinaryNeverLaunched(t *testing.T) {
	h := testHost(t)
	res, err := h.Run(context.Background(), spec(t, "missing", "/nonexistent/jobfence-test-binary"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Launched || !strings.Contains(res.Rejection, "exec") || !res.ReapProof() || !res.Removed {
		t.Fatalf("want a pre-exec rejection, got %+v", res)
	}
}

func TestCancelRunsLadder(t *testing.T) {
	h := testHost(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := spec(t, "cancel", testExe(t), "helper", "sleep")
	s.Started = func(int) { cancel() }
	res, err := h.Run(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Cancelled || res.TermDeadline || !res.ReapProof() {
		t.Fatalf("want a cancelled, reaped domain, got %+v", res)
	}
}

// The command sees exactly its environment, fds 0-2, its domain, no core
// dumps and no-new-privileges; a credential in its environment is not in its
// argv.
func TestWorkerHygiene(t *testing.T) {
	h := testHost(t)
	out, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	leak, err := os.Open(os.DevNull) // an fd the worker must not inherit
	if err != nil {
		t.Fatal(err)
	}
	defer leak.Close()
	syscall.Syscall(syscall.SYS_FCNTL, leak.Fd(), syscall.F_SETFD, 0)
	script := `echo fds:; ls /proc/$$/fd; echo :fds; echo "core:$(ulimit -c)"; grep NoNewPrivs /proc/$$/status; cat /proc/$$/cgroup; env | sort; tr '\0' ' ' < /proc/$$/cmdline; echo`
	s := spec(t, "hygiene", "/bin/sh", "-c", script)
	s.Env = []string{"ONLY=1", "SECRET_TOKEN=s3cr3t-value-42"}
	s.Stdout = out
	res, err := h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Launched || res.ExitCode != 0 || !res.ReapProof() {
		t.Fatalf("hygiene script failed: %+v", res)
	}
	b, _ := os.ReadFile(out.Name())
	got := string(b)
	for _, want := range []string{"fds:\n0\n1\n2\n:fds\n", "core:0\n", "NoNewPrivs:\t1\n", "0::" + filepath.Join(h.l.v2Rel, "d."+h.Epoch()+".hygiene") + "\n", "ONLY=1\n", "SECRET_TOKEN=s3cr3t-value-42\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("worker output lacks %q:\n%s", want, got)
		}
	}
	if h.l.mode == ModeHybrid && !strings.Contains(got, ":memory:"+filepath.Join(h.l.memRel, "d."+h.Epoch()+".hygiene")) {
		t.Errorf("worker not in its v1 memory cgroup:\n%s", got)
	}
	var env []string
	for _, line := range strings.Split(got, "\n") {
		if k, _, ok := strings.Cut(line, "="); ok && !strings.ContainsAny(k, " :") {
			env = append(env, k)
		}
	}
	slices.Sort(env)
	if want := []string{"ONLY", "PWD", "SECRET_TOKEN"}; !slices.Equal(env, want) {
		t.Errorf("worker environment %v, want %v", env, want)
	}
	cmdline := got[strings.LastIndex(got, "/bin/sh"):]
	if strings.Contains(cmdline, "s3cr3t") {
		t.Errorf("credential in the worker's argv: %s", cmdline)
	}
}

// Must show 6 (isolation level): a root that cannot be verified refuses.
func TestUnverifiedRootRefuses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, root := range []string{t.TempDir(), "/sys/fs/cgroup/memory/jobfence-test-v1"} {
		h, err := Open(Config{Root: root, ShimPath: testExe(t)})
		if err != nil {
			t.Fatal(err)
		}
		r := h.Report()
		if r.Verified || r.Detail == "" || !strings.Contains(r.Detail, "not on cgroup2") {
			t.Fatalf("root %s: want unverified with a reason, got %+v", root, r)
		}
		if _, err := h.Run(context.Background(), spec(t, "x", "/bin/true")); !errors.Is(err, ErrUnverified) {
			t.Fatalf("Run on an unverified host: %v", err)
		}
		if rep := Preflight(Config{Root: root}); rep.Verified {
			t.Fatalf("preflight verified %s", root)
		}
		h.Close()
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/jobfence-test-v1"); err == nil {
		t.Fatal("a refused root was created")
	}
}

// Must show 5 (isolation level): a second host on the same root is refused
// while the first holds it; once released, the next host kills and removes
// the first one's live domain before it picks its epoch.
func TestSweepKillsLeftoversBeforeNewEpoch(t *testing.T) {
	root := testRoot(t)
	a, err := Open(Config{Root: root, ShimPath: testExe(t)})
	if err != nil || !a.Report().Verified {
		t.Fatalf("open: %v %+v", err, a.Report())
	}
	if _, err := Open(Config{Root: root, ShimPath: testExe(t)}); !errors.Is(err, ErrLocked) {
		t.Fatalf("second host on a held root: %v", err)
	}
	pidfile := filepath.Join(t.TempDir(), "left.pid")
	done := make(chan Result, 1)
	go func() {
		s := spec(t, "left", testExe(t), "helper", "ignore-term", pidfile)
		s.ReapBound = 30 * time.Second
		res, _ := a.Run(context.Background(), s)
		done <- res
	}()
	pid := waitPidFile(t, pidfile)
	a.Close() // as if the agent process were gone
	b, err := Open(Config{Root: root, ShimPath: testExe(t)})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer b.Close()
	if !slices.Contains(b.Swept(), "d."+a.Epoch()+".left") {
		t.Fatalf("sweep removed %v, not the live domain", b.Swept())
	}
	if alive(pid) {
		t.Fatalf("leftover worker %d alive after the sweep", pid)
	}
	if b.Epoch() == a.Epoch() || b.Epoch() == "" {
		t.Fatalf("epoch not renewed: %q", b.Epoch())
	}
	res := <-done
	if res.Signal != syscall.SIGKILL {
		t.Fatalf("the abandoned run ended with %+v", res)
	}
}

func TestPreflightVerifiesAndCleansUp(t *testing.T) {
	root := testRoot(t)
	r := Preflight(Config{Root: root, ShimPath: testExe(t)})
	if !r.Verified || (r.Mode != ModeHybrid && r.Mode != ModeV2) {
		t.Fatalf("preflight: %+v", r)
	}
	es, _ := os.ReadDir(root)
	for _, e := range es {
		if e.IsDir() {
			t.Fatalf("preflight left %s behind", e.Name())
		}
	}
}

// On v1 the OOM killer takes one process; a worker that survives the kill of
// its child must not keep running: the whole domain goes at once.
func TestChildOOMTearsDownDomain(t *testing.T) {
	h := testHost(t)
	s := spec(t, "childoom", "/bin/sh", "-c", testExe(t)+" helper alloc 256; "+testExe(t)+" helper sleep")
	s.MemoryBytes = 32 << 20
	s.TermAt = time.Now().Add(30 * time.Second)
	res, err := h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.OOMKilled || res.TermDeadline || res.Signal != syscall.SIGKILL || !res.ReapProof() {
		t.Fatalf("want the domain killed on OOM, got %+v", res)
	}
}

// A root worker that moves itself out of its domain breaks the proof: the
// domain empties while the worker lives. It is killed through its pidfd and
// the result carries no reap proof.
func TestEscapedWorkerIsABreach(t *testing.T) {
	h := testHost(t)
	s := spec(t, "escape", "/bin/sh", "-c", "echo $$ > "+filepath.Join(h.l.v2Mount, "cgroup.procs")+" && exec "+testExe(t)+" helper sleep")
	s.TermAt = time.Now().Add(500 * time.Millisecond)
	var pid int
	s.Started = func(p int) { pid = p }
	res, err := h.Run(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Breach || res.ReapProof() || !res.Reaped || res.Signal != syscall.SIGKILL {
		t.Fatalf("want a breach without proof, got %+v", res)
	}
	if alive(pid) {
		t.Fatalf("escaped worker %d still alive", pid)
	}
}

// PDEATHSIG must survive the shim's exec: the worker dies with the process
// that started it, every time. A shim that execs from another runtime thread
// loses it in a few percent of launches.
func TestWorkerDiesWithItsAgent(t *testing.T) {
	root := testRoot(t)
	exe := testExe(t)
	dir := t.TempDir()
	const n = 25
	for i := 0; i < n; i++ {
		pidfile := filepath.Join(dir, "w"+strconv.Itoa(i))
		cmd := exec.Command(exe, "helper", "mini-agent", root, pidfile)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var w int
		for end := time.Now().Add(20 * time.Second); w == 0; time.Sleep(5 * time.Millisecond) {
			select {
			case err := <-done:
				t.Fatalf("mini agent %d ended early: %v", i, err)
			default:
			}
			if b, err := os.ReadFile(pidfile); err == nil && strings.HasSuffix(string(b), "\n") {
				w, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			if time.Now().After(end) {
				t.Fatalf("mini agent %d started no worker", i)
			}
		}
		cmd.Process.Kill()
		<-done
		for end := time.Now().Add(10 * time.Second); alive(w); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("launch %d of %d: worker %d outlived its agent", i+1, n, w)
			}
		}
	}
	// The last agent's domain is a leftover for the next Open to sweep.
	h, err := Open(Config{Root: root, ShimPath: exe})
	if err != nil || len(h.Swept()) != 1 {
		t.Fatalf("final sweep: %v %v", err, h.Swept())
	}
	h.Close()
}
