package isolation

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func unverified(l *layout, err error) Report {
	r := Report{Mode: ModeNone, Detail: err.Error()}
	if l != nil {
		r.Mode, r.Root, r.V1Memory, r.V1Pids, r.Controllers = l.mode, l.v2, l.mem, l.pids, l.controllers
	}
	return r
}

func verified(l *layout) Report {
	r := Report{Mode: l.mode, Verified: true, Root: l.v2, V1Memory: l.mem, V1Pids: l.pids, Controllers: l.controllers}
	switch l.mode {
	case ModeV2:
		r.Detail = "cgroup2 with memory and pids at " + l.v2 + "; probe domain limited, entered, killed, emptied and reaped"
	case ModeHybrid:
		r.Detail = "cgroup2 tracking at " + l.v2 + " with v1 memory at " + l.mem + " and v1 pids at " + l.pids + "; probe domain limited, entered, killed, emptied and reaped"
	}
	return r
}

// Preflight proves the layout under cfg.Root without taking the root's lock
// and without sweeping: it creates a probe domain, writes and reads back its
// limits, starts the canary inside exactly as a command is started (parked,
// attached, checked, released), checks its membership again, kills the
// domain, waits for it to empty and reaps the canary through its pidfd.
func Preflight(cfg Config) Report {
	cfg.defaults()
	l, err := detect(cfg.Root)
	if err != nil {
		return unverified(nil, err)
	}
	if err := l.ensureBase(); err != nil {
		return unverified(l, err)
	}
	if err := probe(l, cfg.ShimPath, cfg.ShimArgs); err != nil {
		return unverified(l, err)
	}
	return verified(l)
}

// Host runs domains under one root for one agent epoch.
type Host struct {
	cfg    Config
	l      *layout
	report Report
	epoch  string
	lockFD int
	swept  []string
	mu     sync.Mutex
	closed bool
}

// Open prepares the root for a new agent process: it takes the root's lock,
// kills and removes every domain left by earlier processes, runs the
// preflight, and only then picks the epoch. A host whose layout cannot be
// verified is still returned (its Report says why; Run refuses); an error
// means the agent must not start at all: another agent holds the root, or a
// leftover domain could not be emptied, so a new epoch would prove nothing.
func Open(cfg Config) (*Host, error) {
	cfg.defaults()
	h := &Host{cfg: cfg, lockFD: -1}
	l, err := detect(cfg.Root)
	if err != nil {
		h.report = unverified(nil, err)
		h.epoch = randHex(16)
		return h, nil
	}
	h.l = l
	if err := l.ensureBase(); err != nil {
		h.report = unverified(l, err)
		h.epoch = randHex(16)
		return h, nil
	}
	fd, err := unix.Open(l.v2, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open cgroup root: %w", err)
	}
	if err := unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, l.v2)
		}
		return nil, fmt.Errorf("lock cgroup root: %w", err)
	}
	h.lockFD = fd
	swept, err := sweep(l, cfg.Logger)
	h.swept = swept
	if err != nil {
		h.Close()
		return nil, err
	}
	if err := probe(l, cfg.ShimPath, cfg.ShimArgs); err != nil {
		h.report = unverified(l, err)
	} else {
		h.report = verified(l)
	}
	h.epoch = randHex(16)
	cfg.Logger.Info("isolation ready", "mode", string(h.report.Mode), "verified", h.report.Verified,
		"detail", h.report.Detail, "swept_domains", len(swept), "agent_epoch", h.epoch)
	return h, nil
}

// Epoch is this host's epoch, chosen after the sweep.
func (h *Host) Epoch() string { return h.epoch }

// Report is the preflight's verdict.
func (h *Host) Report() Report { return h.report }

// Swept lists the leftover domains the startup sweep removed.
func (h *Host) Swept() []string { return append([]string(nil), h.swept...) }

// Close releases the root's lock. Domains still running are not touched.
func (h *Host) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	if h.lockFD >= 0 {
		return unix.Close(h.lockFD)
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Run creates the domain, runs the command in it and tears it down. It
// returns after the domain is empty and the worker reaped, or after the reap
// bound passed without that (then Result.ReapProof is false and the domain
// is left in place for the next sweep).
func (h *Host) Run(ctx context.Context, s Spec) (Result, error) {
	if !h.report.Verified {
		return Result{}, ErrUnverified
	}
	if !nameRE.MatchString(s.Name) {
		return Result{}, &SetupError{fmt.Errorf("domain name %q not allowed", s.Name)}
	}
	if len(s.Argv) == 0 || !filepath.IsAbs(s.Argv[0]) {
		return Result{}, &SetupError{errors.New("command is not an absolute path")}
	}
	for _, e := range s.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return Result{}, &SetupError{errors.New("environment entry without a name")}
		}
	}
	d, err := createDomain(h.l, "d."+h.epoch+"."+s.Name, s.MemoryBytes, s.Pids)
	if err != nil {
		return Result{}, &SetupError{err}
	}
	return h.runDomain(ctx, d, s)
}

func (h *Host) runDomain(ctx context.Context, d *domain, s Spec) (Result, error) {
	w, rejection, err := startWorker(d, s.Argv, s.Env, s.Dir, s.Stdout, s.Stderr)
	if err != nil {
		_ = d.remove()
		return Result{}, &SetupError{err}
	}
	var res Result
	if rejection != "" {
		// The command never ran an instruction; the domain still goes
		// through the full teardown.
		res.Rejection = rejection
		if w == nil {
			// os.StartProcess reaped the child that failed to exec.
			res.Reaped = true
			h.teardown(d, nil, &res, s, false)
		} else {
			h.teardown(d, w, &res, s, false)
		}
		res.Leftovers = false
		return res, nil
	}
	res.Launched = true
	if s.Started != nil {
		s.Started(w.pid)
	}
	wakeR, wakeW, err := os.Pipe()
	if err != nil {
		wakeR, wakeW = nil, nil
	}
	stop := make(chan struct{})
	if wakeW != nil {
		go func() {
			select {
			case <-ctx.Done():
				wakeW.Write([]byte{1})
			case <-stop:
			}
		}()
	}
	var wakes []int
	if wakeR != nil {
		wakes = append(wakes, int(wakeR.Fd()))
	}
	if d.oomFD >= 0 {
		wakes = append(wakes, d.oomFD)
	}
	exited := waitExit(w.pidfd, wakes, s.TermAt)
	close(stop)
	if wakeR != nil {
		wakeR.Close()
		wakeW.Close()
	}
	if !exited {
		switch {
		case ctx.Err() != nil:
			res.Cancelled = true
		case d.oomFD >= 0 && pidfdExited(d.oomFD):
			// v1 OOM kills one process; the rest of the domain goes with it.
			res.OOMKilled = true
		default:
			res.TermDeadline = true
		}
	}
	h.teardown(d, w, &res, s, !exited)
	return res, nil
}

// teardown runs the ladder when needed, waits for empty, reaps and removes.
func (h *Host) teardown(d *domain, w *worker, res *Result, s Spec, alive bool) {
	grace, bound := s.Grace, s.ReapBound
	if bound <= 0 {
		bound = 10 * time.Second
	}
	pop, _ := d.populated()
	if !alive && pop {
		res.Leftovers = true
	}
	if pop && (res.OOMKilled || d.oomKilled()) {
		res.Killed = true
		if err := d.kill(); err != nil {
			h.cfg.Logger.Error("cgroup kill failed", "domain", d.name, "error", err)
		}
	} else if pop {
		d.signalAll(unix.SIGTERM)
		if empty, _ := d.waitEmpty(grace); !empty {
			res.Killed = true
			if err := d.kill(); err != nil {
				h.cfg.Logger.Error("cgroup kill failed", "domain", d.name, "error", err)
			}
		}
	}
	res.Empty, _ = d.waitEmpty(bound)
	if !res.Empty {
		h.cfg.Logger.Error("domain did not empty within the reap bound", "domain", d.name)
	}
	if w == nil {
		// Nothing was started, or what was started is already reaped.
		h.removeIfEmpty(d, res)
		return
	}
	// Once the domain is empty the worker must have exited. If its pidfd is
	// not readable it left the cgroup: no proof, and it is killed directly.
	if waitExit(w.pidfd, nil, time.Now().Add(time.Second)) {
		res.Reaped = true
	} else if res.Empty {
		res.Breach = true
		h.cfg.Logger.Error("worker escaped its domain", "domain", d.name, "pid", w.pid)
		_ = unix.PidfdSendSignal(w.pidfd, unix.SIGKILL, nil, 0)
	}
	res.OOMKilled = res.OOMKilled || d.oomKilled()
	res.PidsLimitHit = d.pidsLimitHit()
	if !res.Reaped && !res.Breach {
		// Stuck (uninterruptible sleep): keep the domain for the next sweep
		// and reap in the background when it finally goes.
		go func() {
			_, _ = w.reap()
			if ok, _ := d.waitEmpty(time.Hour); ok {
				_ = d.remove()
			}
		}()
		return
	}
	st, err := w.reap()
	if err == nil {
		res.Reaped = true
		ws := st.Sys().(syscall.WaitStatus)
		if ws.Signaled() {
			res.ExitCode, res.Signal = -1, ws.Signal()
		} else {
			res.ExitCode = ws.ExitStatus()
		}
	}
	h.removeIfEmpty(d, res)
}

func (h *Host) removeIfEmpty(d *domain, res *Result) {
	if res.Empty {
		if err := d.remove(); err != nil {
			h.cfg.Logger.Error("remove domain failed", "domain", d.name, "error", err)
		} else {
			res.Removed = true
		}
	} else {
		d.close()
	}
}

// probe runs the canary: a limited domain, a waiting copy of the canary
// binary started, parked, attached and checked exactly as a command is, its
// membership checked again once it runs, then kill, empty and reap.
func probe(l *layout, shimPath string, shimArgs []string) error {
	d, err := createDomain(l, "p."+randHex(8), 64<<20, 16)
	if err != nil {
		return fmt.Errorf("probe domain: %w", err)
	}
	argv := append(append([]string{shimPath}, shimArgs...), probeWait)
	w, rejection, err := startWorker(d, argv, nil, "/", nil, nil)
	if err != nil || w == nil {
		_ = d.remove()
		if err == nil {
			err = errors.New(rejection)
		}
		return fmt.Errorf("probe start: %w", err)
	}
	fail := func(err error) error {
		_ = d.kill()
		_, _ = d.waitEmpty(5 * time.Second)
		if waitExit(w.pidfd, nil, time.Now().Add(5*time.Second)) {
			_, _ = w.reap()
			_ = d.remove()
		}
		return err
	}
	if rejection != "" {
		return fail(fmt.Errorf("probe refused: %s", rejection))
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", w.pid))
	if err != nil {
		return fail(fmt.Errorf("read probe membership: %w", err))
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, m := range d.memberships() {
		if !hasMembership(lines, m) {
			return fail(fmt.Errorf("probe worker is not in %s %s", m.Controller, m.Path))
		}
	}
	if err := d.kill(); err != nil {
		return fail(err)
	}
	if empty, err := d.waitEmpty(5 * time.Second); err != nil || !empty {
		return fail(fmt.Errorf("probe domain did not empty after cgroup.kill (%v)", err))
	}
	if !waitExit(w.pidfd, nil, time.Now().Add(time.Second)) {
		return fail(errors.New("probe worker outlived its empty domain"))
	}
	st, err := w.reap()
	if err != nil {
		return fmt.Errorf("reap probe worker: %w", err)
	}
	if ws := st.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return fmt.Errorf("probe worker ended with %v, not SIGKILL", st)
	}
	if err := d.remove(); err != nil {
		return fmt.Errorf("remove probe domain: %w", err)
	}
	return nil
}

// sweep kills and removes every domain (and probe) under the root. It runs
// with the root's lock held, so none of them belongs to a live agent.
func sweep(l *layout, log *slog.Logger) ([]string, error) {
	var removed []string
	var errs []error
	seen := map[string]bool{}
	entries, err := os.ReadDir(l.v2)
	if err != nil {
		return nil, fmt.Errorf("list cgroup root: %w", err)
	}
	isDomain := func(e os.DirEntry) bool {
		return e.IsDir() && (strings.HasPrefix(e.Name(), "d.") || strings.HasPrefix(e.Name(), "p."))
	}
	for _, e := range entries {
		if !isDomain(e) {
			continue
		}
		name := e.Name()
		seen[name] = true
		dir := filepath.Join(l.v2, name)
		f, err := os.Open(filepath.Join(dir, "cgroup.events"))
		if err != nil {
			errs = append(errs, fmt.Errorf("open events of %s: %w", name, err))
			continue
		}
		pop, _ := eventsPopulated(int(f.Fd()))
		if pop {
			_ = writeFile(filepath.Join(dir, "cgroup.kill"), "1")
			if empty, _ := waitEventsEmpty(int(f.Fd()), 10*time.Second); !empty {
				f.Close()
				errs = append(errs, fmt.Errorf("leftover domain %s did not empty after cgroup.kill", name))
				continue
			}
		}
		f.Close()
		if err := removeTwins(l, name); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := rmTree(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
		log.Info("leftover domain removed", "domain", name, "was_populated", pop)
	}
	if l.mode == ModeHybrid {
		// A crash between the v2 and v1 mkdirs, or during removal, leaves v1
		// directories alone. Nothing of ours runs in them without also being
		// in v2, but they are emptied the hard way all the same.
		for _, base := range []string{l.mem, l.pids} {
			es, _ := os.ReadDir(base)
			for _, e := range es {
				if !isDomain(e) || seen[e.Name()] {
					continue
				}
				if err := removeTwins(l, e.Name()); err != nil {
					errs = append(errs, err)
					continue
				}
				removed = append(removed, e.Name())
			}
		}
	}
	return removed, errors.Join(errs...)
}

func removeTwins(l *layout, name string) error {
	if l.mode != ModeHybrid {
		return nil
	}
	for _, base := range []string{l.mem, l.pids} {
		dir := filepath.Join(base, name)
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		for i := 0; i < 100; i++ {
			ps := procs(dir)
			if len(ps) == 0 {
				break
			}
			for _, p := range ps {
				_ = unix.Kill(p, unix.SIGKILL)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := rmTree(dir); err != nil {
			return err
		}
	}
	return nil
}
