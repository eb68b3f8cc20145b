//go:build linux

package isolation

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain turns the test binary into the shim or a helper child when it is
// re-executed as one.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ShimCommand {
		os.Exit(ShimMain(os.Args[2:]))
	}
	if len(os.Args) > 2 && os.Args[1] == "helper" {
		os.Exit(helper(os.Args[2], os.Args[3:]))
	}
	code := m.Run()
	if code == 0 {
		// The spawner goroutine lives for the process by design: PDEATHSIG is
		// tied to its thread.
		if err := goleak.Find(goleak.IgnoreTopFunction("jobfence/isolation.spawnLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goroutine leak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// helper behaviours, run inside domains.
func helper(name string, args []string) int {
	switch name {
	case "alloc": // alloc MiB: allocate and touch
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
	case "exit":
		n, _ := strconv.Atoi(args[0])
		return n
	case "mini-agent": // mini-agent ROOT PIDFILE: run one sleeping domain, never return
		self, _ := os.Executable()
		h, err := Open(Config{Root: args[0], ShimPath: self})
		if err != nil || !h.Report().Verified {
			return 3
		}
		h.Run(context.Background(), Spec{Name: "w", Argv: []string{self, "helper", "sleep"}, MemoryBytes: 64 << 20, Pids: 16,
			Started: func(pid int) { os.WriteFile(args[1], []byte(strconv.Itoa(pid)+"\n"), 0o600) }})
		return 4
	case "sleep":
		for {
			time.Sleep(time.Hour)
		}
	case "log-term": // log-term FILE: note every SIGTERM and keep running
		ch := make(chan os.Signal, 4)
		signal.Notify(ch, syscall.SIGTERM)
		writePid(args[0])
		for range ch {
			f, _ := os.OpenFile(args[0]+".term", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
			f.WriteString("term\n")
			f.Close()
		}
	case "ignore-term": // ignore-term PIDFILE
		signal.Ignore(syscall.SIGTERM)
		writePid(args[0])
		for {
			time.Sleep(time.Hour)
		}
	case "daemon": // daemon PIDFILE: double fork a TERM-ignoring session leader, exit 0
		self, _ := os.Executable()
		p, err := os.StartProcess(self, []string{self, "helper", "daemon-mid", args[0]},
			&os.ProcAttr{Files: []*os.File{nil, nil, nil}, Sys: &syscall.SysProcAttr{Setsid: true}})
		if err != nil {
			return 3
		}
		p.Wait()
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(args[0]); len(b) > 0 && bytes.HasSuffix(b, []byte("\n")) {
				return 0
			}
		}
		return 4
	case "daemon-mid":
		self, _ := os.Executable()
		_, err := os.StartProcess(self, []string{self, "helper", "ignore-term", args[0]},
			&os.ProcAttr{Files: []*os.File{nil, nil, nil}, Sys: &syscall.SysProcAttr{Setsid: true}})
		if err != nil {
			return 3
		}
		return 0
	case "hold": // hold PIDFILE RELEASEFILE
		writePid(args[0])
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if _, err := os.Stat(args[1]); err == nil {
				return 0
			}
		}
		return 5
	}
	return 99
}

func writePid(path string) {
	os.WriteFile(path+".tmp", []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)
	os.Rename(path+".tmp", path)
}

// waitPidFile polls for a pid written by a helper.
func waitPidFile(t testing.TB, path string) int {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(path)
		if err == nil && len(b) > 0 {
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil {
				return n
			}
		}
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

// markerHolders lists live processes whose environment holds marker.
func markerHolders(marker string) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		if alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

// testHost opens a host on a private root under the autodetected cgroup2
// mount and removes the root afterwards.
func testHost(t testing.TB) *Host {
	t.Helper()
	root := testRoot(t)
	h, err := Open(Config{Root: root, ShimPath: testExe(t)})
	if err != nil {
		t.Fatalf("open host: %v", err)
	}
	t.Cleanup(func() { h.Close() })
	if !h.Report().Verified {
		t.Fatalf("isolation not verified on this root host: %s", h.Report().Detail)
	}
	return h
}

func testExe(t testing.TB) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

func testRoot(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create cgroups")
	}
	def, err := DefaultRoot()
	if err != nil {
		t.Skipf("no cgroup2 mount to test on: %v", err)
	}
	root := filepath.Join(filepath.Dir(def), "jobfence-test-"+randHex(6))
	t.Cleanup(func() {
		l, err := detect(root)
		if err != nil {
			return
		}
		for _, d := range []string{l.mem, l.pids, l.v2} {
			if d != "" {
				if err := rmTree(d); err != nil {
					t.Errorf("test root left behind: %v", err)
				}
			}
		}
	})
	return root
}

func countLines(path string, want string) int {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if sc.Text() == want {
			n++
		}
	}
	return n
}
