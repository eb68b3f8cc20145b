package isolation

import (
	"errors"
	"log/slog"
	"os"
	"syscall"
	"time"
)

// ShimCommand is the argument that turns this binary into the preflight's
// canary: the agent's preflight starts "<self> worker probe-wait" in its
// probe domain and nothing else starts it. Commands are exec'd directly.
const ShimCommand = "worker"

// Mode names a cgroup layout.
type Mode string

const (
	// ModeV2 is a pure cgroup v2 hierarchy with memory and pids.
	ModeV2 Mode = "cgroup2"
	// ModeHybrid is cgroup2 for tracking plus v1 memory and pids for limits.
	ModeHybrid Mode = "hybrid"
	// ModeNone is any layout that cannot be verified.
	ModeNone Mode = "none"
)

// ErrUnverified is returned by Run on a host whose isolation could not be
// verified: nothing is started.
var ErrUnverified = errors.New("isolation unverified")

// ErrLocked means another live agent owns the cgroup root.
var ErrLocked = errors.New("another agent holds the cgroup root")

// Config says where domains live and which canary the preflight starts.
type Config struct {
	// Root is the cgroup2 directory under which domains are created; empty
	// autodetects (DefaultRoot). On hybrid hosts the v1 memory and pids
	// directories of the same relative path hold the limits.
	Root string
	// ShimPath is the binary the preflight starts as its canary (with
	// ShimArgs and "probe-wait"); default /proc/self/exe.
	ShimPath string
	// ShimArgs follow ShimPath in the canary's argv; default ["worker"].
	ShimArgs []string
	// Logger receives the sweep and preflight records; default discards.
	Logger *slog.Logger
}

func (c *Config) defaults() {
	if c.ShimPath == "" {
		c.ShimPath = "/proc/self/exe"
	}
	if c.ShimArgs == nil {
		c.ShimArgs = []string{ShimCommand}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// Report is what a preflight found. It is the agent's isolation report.
type Report struct {
	Mode        Mode     `json:"mode"`
	Verified    bool     `json:"verified"`
	Detail      string   `json:"detail"`
	Root        string   `json:"root,omitempty"`
	V1Memory    string   `json:"v1_memory,omitempty"`
	V1Pids      string   `json:"v1_pids,omitempty"`
	Controllers []string `json:"controllers,omitempty"`
}

// Spec is one command to run in a fresh domain.
type Spec struct {
	// Name makes the domain name unique within the epoch: letters, digits,
	// '-' and '_', at most 64 bytes.
	Name string
	// Argv is the command; Argv[0] must be an absolute path.
	Argv []string
	// Env is the complete environment ("KEY=value"); nothing is inherited.
	// It is the command's execve environment, never its argv.
	Env []string
	// Dir is the working directory; empty means "/".
	Dir         string
	MemoryBytes int64
	Pids        int64
	// TermAt starts the kill ladder if the worker is still alive; zero means
	// no deadline.
	TermAt time.Time
	// Grace is how long the ladder waits after SIGTERM before cgroup.kill.
	Grace time.Duration
	// ReapBound is how long the domain may take to empty after cgroup.kill.
	ReapBound time.Duration
	// Stdout and Stderr receive the command's output; nil means /dev/null.
	Stdout, Stderr *os.File
	// Started, if set, is called with the worker's pid once it is released
	// from its exec stop.
	Started func(pid int)
}

// Result is what happened to the domain.
type Result struct {
	// Launched is false only when the command provably never ran: fork,
	// chdir or exec failed, or a check at the exec stop (v1 attach,
	// RLIMIT_CORE, membership, limits) failed and the worker was killed
	// before its first instruction. Rejection then says why.
	Launched  bool
	Rejection string
	// ExitCode is the worker's exit status; -1 when a signal ended it.
	ExitCode int
	Signal   syscall.Signal
	// TermDeadline: the worker was alive at TermAt and the ladder ran.
	TermDeadline bool
	// Cancelled: the context ended while the worker was alive and the ladder ran.
	Cancelled    bool
	OOMKilled    bool
	PidsLimitHit bool
	// Leftovers: processes were still in the domain after the worker ended.
	Leftovers bool
	// Killed: the ladder reached cgroup.kill.
	Killed bool
	Reaped bool
	Empty  bool
	// Breach: the domain was empty but the worker had not exited; it had
	// left its cgroup.
	Breach  bool
	Removed bool
}

// ReapProof is the proof a slot may be released on: the exact worker was
// reaped, the domain was seen empty, and the worker had not escaped it.
func (r Result) ReapProof() bool { return r.Reaped && r.Empty && !r.Breach }

// SetupError means the domain or the spawner could not be set up: nothing
// was started.
type SetupError struct{ Err error }

func (e *SetupError) Error() string { return "domain setup: " + e.Err.Error() }
func (e *SetupError) Unwrap() error { return e.Err }
