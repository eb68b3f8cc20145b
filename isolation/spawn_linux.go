package isolation

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
// not the process. Every worker is therefore forked from one goroutine that
// locks its thread and never returns, so the signal fires only when the
// agent itself dies.
var (
	spawnOnce sync.Once
	spawnCh   chan func()
)

func onSpawner(fn func()) {
	spawnOnce.Do(func() {
		spawnCh = make(chan func())
		go spawnLoop(spawnCh)
	})
	done := make(chan struct{})
	spawnCh <- func() { fn(); close(done) }
	<-done
}

func spawnLoop(ch chan func()) {
	runtime.LockOSThread()
	for fn := range ch {
		fn()
	}
}

// registry holds the pids of live shims so the orphan reaper never reaps a
// worker whose status belongs to its own Run. The lock is held across the
// fork for the same reason.
var registry = struct {
	sync.Mutex
	pids map[int]bool
}{pids: map[int]bool{}}

// worker is a started shim.
type worker struct {
	proc    *os.Process
	pid     int
	pidfd   int
	frameW  *os.File
	statusR *os.File
}

var devNull = sync.OnceValues(func() (*os.File, error) { return os.OpenFile(os.DevNull, os.O_RDWR, 0) })

// startShim forks the shim into the domain's v2 cgroup at birth.
func startShim(d *domain, shimPath string, shimArgs []string, stdout, stderr *os.File) (*worker, error) {
	null, err := devNull()
	if err != nil {
		return nil, err
	}
	if stdout == nil {
		stdout = null
	}
	if stderr == nil {
		stderr = null
	}
	frameR, frameW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		frameR.Close()
		frameW.Close()
		return nil, err
	}
	defer frameR.Close()
	defer statusW.Close()
	pidfd := -1
	attr := &os.ProcAttr{
		Dir: "/",
		// The shim's own runtime needs one thread and no collector, and must
		// not spend its start looking up CPU quotas; none of this reaches the
		// command, which gets exactly the frame's environment.
		Env:   []string{"GOMAXPROCS=1", "GOGC=off", "GODEBUG=updatemaxprocs=0"},
		Files: []*os.File{null, stdout, stderr, frameR, statusW},
		Sys: &syscall.SysProcAttr{
			UseCgroupFD: true,
			CgroupFD:    d.dirFD,
			PidFD:       &pidfd,
			Pdeathsig:   syscall.SIGKILL,
			Setsid:      true,
		},
	}
	argv := append([]string{shimPath}, shimArgs...)
	var proc *os.Process
	registry.Lock()
	onSpawner(func() { proc, err = os.StartProcess(shimPath, argv, attr) })
	if err == nil {
		registry.pids[proc.Pid] = true
	}
	registry.Unlock()
	if err != nil {
		frameW.Close()
		statusR.Close()
		return nil, fmt.Errorf("start shim: %w", err)
	}
	return &worker{proc: proc, pid: proc.Pid, pidfd: pidfd, frameW: frameW, statusR: statusR}, nil
}

func (w *worker) send(f frame) {
	b, _ := json.Marshal(f)
	// A dead shim makes this fail with EPIPE; the status pipe says the rest.
	_, _ = w.frameW.Write(b)
	w.frameW.Close()
}

// readStatus collects what the shim wrote before exec; it returns at EOF,
// which is the exec or the shim's death.
func (w *worker) readStatus() <-chan string {
	ch := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(w.statusR, 1024))
		w.statusR.Close()
		ch <- string(b)
	}()
	return ch
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
