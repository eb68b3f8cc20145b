package isolation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// probeWait is the shim argument the preflight execs as its canary target:
// it blocks until the preflight kills the domain.
const probeWait = "probe-wait"

// Exit codes of a shim that never ran the command.
const (
	shimExitFrame  = 125 // no or unreadable frame: the agent gave up
	shimExitVerify = 126 // membership, limits or hardening failed
	shimExitExec   = 127 // execve failed
)

const maxFrame = 4 << 20

// frame is what the agent sends the shim on fd 3. It carries the credentials
// inside Env, which is why it never travels in argv or the shim's own
// environment.
type frame struct {
	Argv    []string     `json:"argv"`
	Env     []string     `json:"env"`
	Dir     string       `json:"dir"`
	PPID    int          `json:"ppid"`
	Members []membership `json:"members"`
	Limits  []limitCheck `json:"limits"`
}

func init() {
	// PDEATHSIG belongs to a thread; execve from another runtime thread would
	// drop it. Locking here, during init, keeps main on the thread the kernel
	// started, which is the one that was forked with Pdeathsig set.
	if len(os.Args) > 1 && os.Args[1] == ShimCommand {
		runtime.LockOSThread()
	}
}

// ShimMain is the whole "jobfence worker" command: args are what follows
// "worker". It returns only when it did not exec the command; the code says
// why, and the reason has been written to fd 4 for the agent.
func ShimMain(args []string) int {
	runtime.LockOSThread()
	if len(args) == 1 && args[0] == probeWait {
		for {
			time.Sleep(time.Hour)
		}
	}
	if len(args) != 0 {
		fmt.Fprintln(os.Stderr, "jobfence worker is started by the agent; it takes no arguments")
		return 2
	}
	status := os.NewFile(4, "status")
	fail := func(code int, stage string, err error) int {
		fmt.Fprintf(status, "%s: %v", stage, err)
		return code
	}
	b, err := io.ReadAll(io.LimitReader(os.NewFile(3, "frame"), maxFrame+1))
	if err != nil || len(b) == 0 || len(b) > maxFrame {
		return fail(shimExitFrame, "frame", errors.New("no frame from the agent"))
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		return fail(shimExitFrame, "frame", errors.New("undecodable frame"))
	}
	if len(f.Argv) == 0 || !filepath.IsAbs(f.Argv[0]) {
		return fail(shimExitVerify, "argv", errors.New("command is not an absolute path"))
	}
	if err := checkMembership(f.Members); err != nil {
		return fail(shimExitVerify, "membership", err)
	}
	for _, c := range f.Limits {
		got, err := os.ReadFile(c.Path)
		if err != nil || strings.TrimSpace(string(got)) != c.Want {
			return fail(shimExitVerify, "limits", fmt.Errorf("%s does not read %s", filepath.Base(c.Path), c.Want))
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fail(shimExitVerify, "no_new_privs", err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{}); err != nil {
		return fail(shimExitVerify, "rlimit_core", err)
	}
	dir := f.Dir
	if dir == "" {
		dir = "/"
	}
	if err := unix.Chdir(dir); err != nil {
		return fail(shimExitVerify, "working_dir", err)
	}
	// Everything from fd 3 up, the status pipe included, closes at exec: the
	// command sees only 0, 1 and 2, and the agent sees EOF on fd 4 exactly
	// when the exec succeeded.
	if err := unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return fail(shimExitVerify, "close_range", err)
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fail(shimExitVerify, "pdeathsig", err)
	}
	if f.PPID != 0 && os.Getppid() != f.PPID {
		// The agent died between fork and here; PDEATHSIG may have missed it.
		return fail(shimExitVerify, "parent", errors.New("the agent is gone"))
	}
	env := f.Env
	if env == nil {
		env = []string{}
	}
	err = syscall.Exec(f.Argv[0], f.Argv, env)
	return fail(shimExitExec, "exec", fmt.Errorf("%s: %w", f.Argv[0], err))
}

func checkMembership(want []membership) error {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, m := range want {
		if !hasMembership(lines, m) {
			if m.Controller == "" {
				return fmt.Errorf("not in cgroup2 %s", m.Path)
			}
			return fmt.Errorf("not in %s cgroup %s", m.Controller, m.Path)
		}
	}
	return nil
}

func hasMembership(lines []string, m membership) bool {
	for _, line := range lines {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 || parts[2] != m.Path {
			continue
		}
		if m.Controller == "" && parts[0] == "0" && parts[1] == "" {
			return true
		}
		if m.Controller != "" && slices.Contains(strings.Split(parts[1], ","), m.Controller) {
			return true
		}
	}
	return false
}
