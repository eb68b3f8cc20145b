package isolation

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// domain is one worker's cgroups.
type domain struct {
	l         *layout
	name      string
	v2, v2Rel string
	mem, pids string // hybrid only
	dirFD     int    // O_PATH fd of v2, the CLONE_INTO_CGROUP target
	events    *os.File
	// Hybrid only: an eventfd the v1 memory cgroup signals on OOM, and the
	// memory.oom_control file it is registered against.
	oomFD      int
	oomControl *os.File
	// checks are the limit files and values read back after writing; they
	// are read again while the worker is parked, just before it runs.
	checks []limitCheck
}

type limitCheck struct {
	Path string
	Want string
}

// membership is one line the worker's /proc/<pid>/cgroup must hold.
type membership struct {
	Controller string // "" for the cgroup2 line
	Path       string
}

func (d *domain) memberships() []membership {
	m := []membership{{Path: d.v2Rel}}
	if d.l.mode == ModeHybrid {
		m = append(m,
			membership{Controller: "memory", Path: filepath.Join(d.l.memRel, d.name)},
			membership{Controller: "pids", Path: filepath.Join(d.l.pidsRel, d.name)})
	}
	return m
}

func roundPage(n int64) int64 {
	p := int64(os.Getpagesize())
	return n / p * p
}

func writeFile(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

func (d *domain) setLimit(path, v, want string) error {
	if err := writeFile(path, v); err != nil {
		return err
	}
	got, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read back %s: %w", filepath.Base(path), err)
	}
	if strings.TrimSpace(string(got)) != want {
		return fmt.Errorf("%s reads %q after writing %q", filepath.Base(path), strings.TrimSpace(string(got)), want)
	}
	d.checks = append(d.checks, limitCheck{Path: path, Want: want})
	return nil
}

// createDomain makes the domain's cgroups and limits, reading each back. On
// any failure it removes what it made.
func createDomain(l *layout, name string, memBytes, pids int64) (d *domain, err error) {
	if memBytes < 1<<20 || pids < 1 {
		return nil, fmt.Errorf("limits out of range: memory %d bytes, pids %d", memBytes, pids)
	}
	d = &domain{l: l, name: name, v2: filepath.Join(l.v2, name), v2Rel: filepath.Join(l.v2Rel, name), dirFD: -1, oomFD: -1}
	if err := os.Mkdir(d.v2, 0o755); err != nil {
		return nil, fmt.Errorf("create domain: %w", err)
	}
	defer func() {
		if err != nil {
			d.remove()
			d = nil
		}
	}()
	mem := strconv.FormatInt(memBytes, 10)
	memWant := strconv.FormatInt(roundPage(memBytes), 10)
	pid := strconv.FormatInt(pids, 10)
	switch l.mode {
	case ModeV2:
		if err := d.setLimit(filepath.Join(d.v2, "memory.max"), mem, memWant); err != nil {
			return d, err
		}
		if _, err := os.Stat(filepath.Join(d.v2, "memory.swap.max")); err == nil {
			if err := d.setLimit(filepath.Join(d.v2, "memory.swap.max"), "0", "0"); err != nil {
				return d, err
			}
		} else if swapActive() {
			return d, errors.New("swap is on but memory.swap.max is missing: the memory limit would not hold")
		}
		if err := d.setLimit(filepath.Join(d.v2, "memory.oom.group"), "1", "1"); err != nil {
			return d, err
		}
		if err := d.setLimit(filepath.Join(d.v2, "pids.max"), pid, pid); err != nil {
			return d, err
		}
	case ModeHybrid:
		d.mem, d.pids = filepath.Join(l.mem, name), filepath.Join(l.pids, name)
		if err := os.Mkdir(d.mem, 0o755); err != nil {
			d.mem = ""
			return d, fmt.Errorf("create v1 memory domain: %w", err)
		}
		if err := d.setLimit(filepath.Join(d.mem, "memory.limit_in_bytes"), mem, memWant); err != nil {
			return d, err
		}
		// memsw must not be below the limit, so it is written second; it only
		// exists with swap accounting.
		if _, err := os.Stat(filepath.Join(d.mem, "memory.memsw.limit_in_bytes")); err == nil {
			if err := d.setLimit(filepath.Join(d.mem, "memory.memsw.limit_in_bytes"), mem, memWant); err != nil {
				return d, err
			}
		} else if swapActive() {
			return d, errors.New("swap is on but memory.memsw.limit_in_bytes is missing: the memory limit would not hold")
		}
		if err := os.Mkdir(d.pids, 0o755); err != nil {
			d.pids = ""
			return d, fmt.Errorf("create v1 pids domain: %w", err)
		}
		if err := d.setLimit(filepath.Join(d.pids, "pids.max"), pid, pid); err != nil {
			return d, err
		}
		if err := d.watchOOM(); err != nil {
			return d, err
		}
	default:
		return d, fmt.Errorf("unverified layout %s", l.mode)
	}
	if _, err := os.Stat(filepath.Join(d.v2, "cgroup.kill")); err != nil {
		return d, fmt.Errorf("cgroup.kill missing (kernel before 5.14?): %w", err)
	}
	if d.events, err = os.Open(filepath.Join(d.v2, "cgroup.events")); err != nil {
		return d, fmt.Errorf("open cgroup.events: %w", err)
	}
	if d.dirFD, err = unix.Open(d.v2, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return d, fmt.Errorf("open domain directory: %w", err)
	}
	return d, nil
}

// attachV1 writes pid into the v1 limit cgroups. EINVAL means the task is
// still being set up by fork; it is retried a bounded number of times (a
// worker parked at its exec stop is past that point).
func (d *domain) attachV1(pid int) error {
	if d.l.mode != ModeHybrid {
		return nil
	}
	for _, dir := range []string{d.mem, d.pids} {
		var err error
		for i := 0; i < 50; i++ {
			err = os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
			if !errors.Is(err, syscall.EINVAL) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if err != nil {
			return fmt.Errorf("attach worker to %s: %w", dir, err)
		}
	}
	return nil
}

// populated reads cgroup.events from offset 0, which also re-arms the poll
// notification.
func (d *domain) populated() (bool, error) {
	return eventsPopulated(int(d.events.Fd()))
}

func eventsPopulated(fd int) (bool, error) {
	buf := make([]byte, 256)
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return false, fmt.Errorf("read cgroup.events: %w", err)
	}
	return !bytes.Contains(buf[:n], []byte("populated 0")), nil
}

// waitEmpty waits until no live process is in the domain or timeout passes.
func (d *domain) waitEmpty(timeout time.Duration) (bool, error) {
	return waitEventsEmpty(int(d.events.Fd()), timeout)
}

func waitEventsEmpty(fd int, timeout time.Duration) (bool, error) {
	end := time.Now().Add(timeout)
	for {
		pop, err := eventsPopulated(fd)
		if err != nil || !pop {
			return !pop, err
		}
		left := time.Until(end)
		if left <= 0 {
			return false, nil
		}
		ms := int(left / time.Millisecond)
		if ms < 1 {
			ms = 1
		}
		_, err = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}, ms)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false, fmt.Errorf("poll cgroup.events: %w", err)
		}
	}
}

// kill SIGKILLs every process of the domain and its sub-cgroups at once;
// forks racing with it are killed by the kernel too.
func (d *domain) kill() error {
	return writeFile(filepath.Join(d.v2, "cgroup.kill"), "1")
}

// procs lists the pids of the domain and of every cgroup below it (a root
// worker can create sub-cgroups).
func procs(dir string) []int {
	var out []int
	_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return nil
		}
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return nil
	})
	return out
}

// signalAll sends sig (then SIGCONT, so a stopped process can act on it) to
// every member, re-listing until no new pid shows up. Each pid is pinned with
// a pidfd and its membership checked after pinning, so a recycled pid is
// never signalled.
func (d *domain) signalAll(sig unix.Signal) int {
	seen := map[int]bool{}
	for round := 0; round < 16; round++ {
		fresh := 0
		for _, pid := range procs(d.v2) {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			fresh++
			fd, err := unix.PidfdOpen(pid, 0)
			if err != nil {
				continue
			}
			if inCgroup(pid, d.v2Rel) {
				_ = unix.PidfdSendSignal(fd, sig, nil, 0)
				_ = unix.PidfdSendSignal(fd, unix.SIGCONT, nil, 0)
			}
			unix.Close(fd)
		}
		if fresh == 0 {
			break
		}
	}
	return len(seen)
}

func inCgroup(pid int, rel string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return under(p, rel)
		}
	}
	return false
}

// counter reads "key N" from a flat keyed cgroup file; missing means 0.
func counter(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// oomKilled reports whether the kernel OOM-killed anything in the domain. v1
// kills one process, not the group, so any kill fails the whole domain.
func (d *domain) oomKilled() bool {
	if d.l.mode == ModeHybrid {
		return counter(filepath.Join(d.mem, "memory.oom_control"), "oom_kill") > 0
	}
	return counter(filepath.Join(d.v2, "memory.events"), "oom_kill") > 0
}

func (d *domain) pidsLimitHit() bool {
	if d.l.mode == ModeHybrid {
		return counter(filepath.Join(d.pids, "pids.events"), "max") > 0
	}
	return counter(filepath.Join(d.v2, "pids.events"), "max") > 0
}

// watchOOM registers an eventfd for v1 OOM notifications, so a domain whose
// worker survives the kill of one of its processes is torn down at once.
func (d *domain) watchOOM() error {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	d.oomFD = efd
	if d.oomControl, err = os.Open(filepath.Join(d.mem, "memory.oom_control")); err != nil {
		return fmt.Errorf("open memory.oom_control: %w", err)
	}
	return writeFile(filepath.Join(d.mem, "cgroup.event_control"), fmt.Sprintf("%d %d", efd, d.oomControl.Fd()))
}

func (d *domain) close() {
	if d.oomFD >= 0 {
		unix.Close(d.oomFD)
		d.oomFD = -1
	}
	if d.oomControl != nil {
		d.oomControl.Close()
		d.oomControl = nil
	}
	if d.events != nil {
		d.events.Close()
		d.events = nil
	}
	if d.dirFD >= 0 {
		unix.Close(d.dirFD)
		d.dirFD = -1
	}
}

// remove closes the domain's fds and removes its directories: the v1 twins
// first, the v2 tracking directory last, because the sweep keys on it.
func (d *domain) remove() error {
	d.close()
	var errs []error
	for _, dir := range []string{d.mem, d.pids, d.v2} {
		if dir == "" {
			continue
		}
		if err := rmTree(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmTree removes a cgroup directory and its sub-cgroups, deepest first.
// rmdir right after the last exit can briefly answer EBUSY.
func rmTree(dir string) error {
	// The usual domain has no sub-cgroups: one rmdir, without listing the
	// dozens of control files a walk would read.
	if err := unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		var err error
		wait := time.Millisecond
		for try := 0; try < 10; try++ {
			err = unix.Rmdir(dirs[i])
			if err == nil || errors.Is(err, unix.ENOENT) {
				err = nil
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(wait)
			wait *= 2
		}
		if err != nil {
			return fmt.Errorf("remove %s: %w", dirs[i], err)
		}
	}
	return nil
}
