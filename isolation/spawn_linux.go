package isolation

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The kernel sends PDEATHSIG when the thread that forked the child exits,
// not the process, and only that thread may release a tracee it parked.
// Every worker is therefore forked from one goroutine that locks its thread
// and never returns, so the signal fires only when the agent itself dies.
// The same thread carries no-new-privileges, which every child inherits; no
// other goroutine ever runs on it, so the agent itself is unaffected.
var (
	spawnOnce sync.Once
	spawnCh   chan func()
	spawnErr  error
)

func onSpawner(fn func()) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan func())
		ready := make(chan struct{})
		go spawnLoop(spawnCh, ready)
		<-ready
	})
	if spawnErr != nil {
		return spawnErr
	}
	done := make(chan struct{})
	spawnCh <- func() { fn(); close(done) }
	<-done
	return nil
}

func spawnLoop(ch chan func(), ready chan struct{}) {
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		spawnErr = fmt.Errorf("no_new_privs on the spawner thread: %w", err)
	}
	close(ready)
	for fn := range ch {
		fn()
	}
}

// registry holds the pids of live workers so the orphan reaper never reaps a
// worker whose status belongs to its own Run. The lock is held across the
// fork for the same reason.
var registry = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// worker is a started command.
type worker struct {
	proc  *os.Process
	pid   int
	pidfd int
}

var devNull = sync.OnceValues(func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) })

// startWorker forks the command into the domain's v2 cgroup at birth, with
// PTRACE_TRACEME, so the kernel stops it right after its execve, before the
// first instruction of the command. While it is parked there the agent
// attaches it to the v1 limit cgroups (hybrid), sets RLIMIT_CORE to 0,
// checks its membership from /proc and reads every limit back once more;
// only then is it released. This replaces a shim process (a second Go
// program started per job, whose runtime and package initialisation cost
// tens of milliseconds) without giving up any of its checks.
//
// A non-empty rejection means the command never ran an instruction: the fork
// or exec failed (the child, if any, was already reaped by os.StartProcess),
// or a check failed and the parked child was killed; w is then nil or an
// already killed worker the caller still reaps.
func startWorker(d *domain, argv, env []string, dir string, stdout, stderr *os.File) (w *worker, rejection string, err error) {
	null, err := devNull()
	if err != nil {
		return nil, "", err
	}
	if stdout == nil {
		stdout = null
	}
	if stderr == nil {
		stderr = null
	}
	if env == nil {
		// A nil Env would make os.StartProcess pass the agent's own.
		env = []string{}
	}
	if dir == "" {
		dir = "/"
	}
	pidfd := -1
	attr := &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []*os.File{null, stdout, stderr},
		Sys: &syscall.SysProcAttr{
			UseCgroupFD: true,
			CgroupFD:    d.dirFD,
			PidFD:       &pidfd,
			Pdeathsig:   syscall.SIGKILL,
			Setsid:      true,
			Ptrace:      true,
		},
	}
	var proc *os.Process
	var parkErr error
	registry.Lock()
	defer registry.Unlock()
	serr := onSpawner(func() {
		// Descriptors someone opened without close-on-exec would otherwise
		// reach the command; Go's own are close-on-exec already.
		_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
		proc, err = os.StartProcess(argv[0], argv, attr)
		if err != nil {
			return
		}
		registry.pids[proc.Pid] = true
		parkErr = park(d, proc.Pid, pidfd)
		if parkErr != nil {
			// Still stopped before its first instruction: kill it there.
			_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		}
	})
	if serr != nil {
		return nil, "", serr
	}
	if err != nil {
		return nil, fmt.Sprintf("exec: %v", err), nil
	}
	w = &worker{proc: proc, pid: proc.Pid, pidfd: pidfd}
	if parkErr != nil {
		return w, parkErr.Error(), nil
	}
	return w, "", nil
}

// park waits for the traced child's stop after execve, makes it a full
// member of the domain, checks that it is one, and releases it. It runs on
// the spawner thread, the tracer.
func park(d *domain, pid, pidfd int) error {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WSTOPPED|unix.WEXITED|unix.WNOWAIT, nil)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for the exec stop: %w", err)
		}
	}
	const cldTrapped = 4
	if info.Code != cldTrapped {
		return fmt.Errorf("exec stop: the child ended (code %d) before it stopped", info.Code)
	}
	if err := d.attachV1(pid); err != nil {
		return fmt.Errorf("attach: %w", err)
	}
	if err := unix.Prlimit(pid, unix.RLIMIT_CORE, &unix.Rlimit{}, nil); err != nil {
		return fmt.Errorf("rlimit_core: %w", err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return fmt.Errorf("membership: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, m := range d.memberships() {
		if !hasMembership(lines, m) {
			if m.Controller == "" {
				return fmt.Errorf("membership: not in cgroup2 %s", m.Path)
			}
			return fmt.Errorf("membership: not in %s cgroup %s", m.Controller, m.Path)
		}
	}
	for _, c := range d.checks {
		got, err := os.ReadFile(c.Path)
		if err != nil || strings.TrimSpace(string(got)) != c.Want {
			return fmt.Errorf("limits: %s does not read %s", filepath.Base(c.Path), c.Want)
		}
	}
	// Detaching with signal 0 drops the exec's SIGTRAP: the command starts
	// as if never traced.
	if err := unix.PtraceDetach(pid); err != nil {
		return fmt.Errorf("release: %w", err)
	}
	return nil
}

// waitExit polls the pidfd until the worker exits (true), or until `until`
// passes or one of wakes becomes readable (false). A zero until means no
// time limit.
func waitExit(pidfd int, wakes []int, until time.Time) bool {
	for {
		ms := -1
		if !until.IsZero() {
			left := time.Until(until)
			if left <= 0 {
				return pidfdExited(pidfd)
			}
			ms = int((left + time.Millisecond - 1) / time.Millisecond)
		}
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		for _, w := range wakes {
			fds = append(fds, unix.PollFd{Fd: int32(w), Events: unix.POLLIN})
		}
		_, err := unix.Poll(fds, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if fds[0].Revents != 0 {
			return true
		}
		for _, f := range fds[1:] {
			if f.Revents != 0 {
				return false
			}
		}
	}
}

// pidfdExited reports whether fd (a pidfd or an eventfd) is readable now.
func pidfdExited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, 0)
	return n > 0 && fds[0].Revents != 0
}

// reap waits the worker (it has exited) and forgets it.
func (w *worker) reap() (*os.ProcessState, error) {
	st, err := w.proc.Wait()
	registry.Lock()
	delete(registry.pids, w.pid)
	registry.Unlock()
	unix.Close(w.pidfd)
	return st, err
}

// BecomeSubreaper makes orphaned descendants of workers (daemons) children of
// this process instead of PID 1, so ReapOrphans can reap them promptly. Only
// a process that starts no children of its own besides workers should call
// it: ReapOrphans reaps every child that is not a live worker.
func BecomeSubreaper() error {
	return unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
}

// ReapOrphans reaps exited children that are not workers (orphans adopted as
// a subreaper) and returns how many it reaped.
func ReapOrphans() int {
	registry.Lock()
	defer registry.Unlock()
	n := 0
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			pid, err := strconv.Atoi(f)
			if err != nil || registry.pids[pid] {
				continue
			}
			var info unix.Siginfo
			if unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil) == nil && info.Signo != 0 {
				n++
			}
		}
	}
	return n
}
