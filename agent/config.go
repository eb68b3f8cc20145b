// Package agent is the jobfence agent: it receives dispatches from the
// leader, checks each one in a fixed order (epoch, isolation, payload bounds,
// deadline funding, repeated invocation id, queue space), runs accepted ones
// in isolated worker domains with a bounded pool, and reports each outcome
// back to the server with its proof as soon as the domain is reaped and
// empty (nothing else runs between the two). It reaches the cluster only
// over HTTP.
package agent

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"time"

	"jobfence/internal/logging"
)

// Config is one agent process. Zero durations and sizes take the defaults
// listed with each field.
type Config struct {
	// ID names the agent in the cluster (required).
	ID string
	// Listener serves the dispatch API (required; cmd opens it from --listen).
	Listener net.Listener
	// TLS, when set, serves the dispatch API over TLS on Listener.
	TLS *tls.Config
	// Advertise is the base URL announced to the server; default
	// "http://" (or "https://" with TLS) + the listener's address.
	Advertise string
	// ServerURL is the jobfence server's base URL (required).
	ServerURL string
	// Token authenticates the agent to the server (agent role; required).
	Token string
	// DispatchToken is what the server must present to this agent (required).
	DispatchToken string
	// Capacity is the number of executors (required, 1-1024).
	Capacity int
	// QueueSize bounds accepted-but-not-started dispatches; default Capacity.
	QueueSize int
	// CgroupRoot is isolation.Config.Root; empty autodetects.
	CgroupRoot string
	// ShimPath and ShimArgs start the isolation preflight's canary; default
	// this binary's "worker". Commands are exec'd directly, never through it.
	ShimPath string
	ShimArgs []string
	// ClockSkew is the assumed skew between server and agent clocks; 1s.
	ClockSkew time.Duration
	// TermGrace is SIGTERM to cgroup.kill; 10s.
	TermGrace time.Duration
	// ReapBound is cgroup.kill to an empty domain; 11s.
	ReapBound time.Duration
	// MinRunWindow is the least run time a deadline must fund; 5s.
	MinRunWindow time.Duration
	// DefaultMemory and DefaultPids apply when a spec leaves them out;
	// 256 MiB and 256.
	DefaultMemory int64
	DefaultPids   int64
	// Heartbeat is the registration interval (a third of the server's
	// liveness window); 2s.
	Heartbeat time.Duration
	// Retention keeps an invocation's record past its deadline; 10m.
	Retention time.Duration
	// ReapOrphans makes the process a child subreaper and reaps adopted
	// orphans (after each report, and every few seconds). Only for a
	// process that starts no other children.
	ReapOrphans bool
	// HTTPClient talks to the server; default one with a 10s timeout.
	HTTPClient *http.Client
	// Secrets, when set, learns the secret and credential values of every
	// dispatch received, before any check can log about it; Logger should
	// be built on it (internal/logging) so no record shows them.
	Secrets *logging.Redactor
	Logger  *slog.Logger
	Now     func() time.Time
}

const (
	maxBody        = 1 << 20
	maxArgs        = 256
	maxArgBytes    = 128 << 10
	maxEnv         = 256
	maxCredentials = 64
	maxEnvBytes    = 256 << 10
	minMemory      = 4 << 20
	maxPids        = 65536
	maxDetail      = 512
)

var (
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	idRE      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
	agentIDRE = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
)

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.ClockSkew, time.Second)
	def(&c.TermGrace, 10*time.Second)
	def(&c.ReapBound, 11*time.Second)
	def(&c.MinRunWindow, 5*time.Second)
	def(&c.Heartbeat, 2*time.Second)
	def(&c.Retention, 10*time.Minute)
	if c.QueueSize == 0 {
		c.QueueSize = c.Capacity
	}
	if c.DefaultMemory == 0 {
		c.DefaultMemory = 256 << 20
	}
	if c.DefaultPids == 0 {
		c.DefaultPids = 256
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Advertise == "" && c.Listener != nil {
		scheme := "http://"
		if c.TLS != nil {
			scheme = "https://"
		}
		c.Advertise = scheme + c.Listener.Addr().String()
	}
}

// Validate returns every problem of the configuration at once.
func (c *Config) Validate() error {
	var errs []error
	if !agentIDRE.MatchString(c.ID) {
		errs = append(errs, errors.New("id: 1-128 letters, digits, '.', '_', ':' or '-' required"))
	}
	if c.Listener == nil {
		errs = append(errs, errors.New("listen: required"))
	}
	if u, err := url.Parse(c.ServerURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, errors.New("server: an http or https URL required"))
	}
	if c.Token == "" {
		errs = append(errs, errors.New("token-file: an agent token required"))
	}
	if c.DispatchToken == "" {
		errs = append(errs, errors.New("dispatch-token-file: a dispatch token required"))
	}
	if c.Capacity < 1 || c.Capacity > 1024 {
		errs = append(errs, errors.New("capacity: 1-1024"))
	}
	if c.QueueSize < 0 || c.QueueSize > 65536 {
		errs = append(errs, errors.New("queue size: 0-65536"))
	}
	for name, d := range map[string]time.Duration{"clock-skew": c.ClockSkew, "term-grace": c.TermGrace, "reap-bound": c.ReapBound, "min-run-window": c.MinRunWindow, "heartbeat": c.Heartbeat, "retention": c.Retention} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative", name))
		}
	}
	if c.DefaultMemory < 0 || (c.DefaultMemory > 0 && c.DefaultMemory < minMemory) {
		errs = append(errs, fmt.Errorf("default-memory: at least %d bytes", minMemory))
	}
	if c.DefaultPids < 0 || c.DefaultPids > maxPids {
		errs = append(errs, fmt.Errorf("default-pids: 1-%d", maxPids))
	}
	return errors.Join(errs...)
}

// reservation is what a deadline must fund beyond the run itself: the kill
// ladder and reap finish skew before the deadline the server holds.
func (c *Config) reservation() time.Duration { return c.ClockSkew + c.TermGrace + c.ReapBound }
