package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"jobfence/internal/logging"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// Config is everything a jobfence server process needs. cmd/jobfence fills
// it from flags and JOBFENCE_* variables; tests fill it directly. Zero fields
// take the defaults ApplyDefaults sets.
type Config struct {
	// Listen is the HTTP address (default 127.0.0.1:8080). Ignored when
	// Listener is set.
	Listen string
	// Listener, when set, is used instead of binding Listen (tests pass a
	// 127.0.0.1:0 listener).
	Listener net.Listener

	// DataDir holds the embedded etcd member (default ./data). Unused with
	// EtcdEndpoints.
	DataDir string
	// EtcdEndpoints selects an external cluster instead of the embedded member.
	EtcdEndpoints []string
	// EtcdCA, EtcdCert and EtcdKey are PEM files for TLS to the external
	// cluster; the CA alone gives server-verified TLS, cert and key add a
	// client certificate.
	EtcdCA, EtcdCert, EtcdKey string
	// Prefix namespaces every key (default /jobfence).
	Prefix string

	// EtcdName, EtcdPeerURL, EtcdClientURL, EtcdInitialCluster and
	// EtcdClusterState make the embedded member one of a cluster (etcd's own
	// --name, --listen/advertise-peer-urls, --listen/advertise-client-urls,
	// --initial-cluster, --initial-cluster-state). Empty: a single member on
	// free 127.0.0.1 ports. Unused with EtcdEndpoints.
	EtcdName, EtcdPeerURL, EtcdClientURL, EtcdInitialCluster string
	// EtcdClusterState is "new" (default) or "existing" (joining a cluster
	// that already runs, after `etcdctl member add`).
	EtcdClusterState string
	// EtcdQuotaBackendBytes caps the embedded member's backend; past it etcd
	// raises the NOSPACE alarm and refuses writes until an operator reclaims
	// space. 0 keeps etcd's default. Unused with EtcdEndpoints.
	EtcdQuotaBackendBytes int64

	// TLSCert and TLSKey serve the HTTP listener over TLS (both or neither).
	TLSCert, TLSKey string
	// TLSCA verifies agents' certificates when dispatching; empty uses the
	// system roots.
	TLSCA string

	// AdvertiseURL is this replica's API base URL as the other replicas
	// reach it (http(s)://host:port), published in the replica registry so
	// their overviews can show this replica's read-model cursor. Empty:
	// derived from the bound listen address, an unspecified host (0.0.0.0,
	// ::) becoming 127.0.0.1, https when TLSCert is set.
	AdvertiseURL string

	// TokensFile is the JSON array of {subject, role, token}; required.
	TokensFile string

	// QuotaGlobal and QuotaPerScope bound unresolved jobs (10000 / 1000).
	QuotaGlobal   int
	QuotaPerScope int
	// Defaults fill omitted limits and bound memory (256 MiB default, 4 GiB
	// maximum, 256 pids, 3600 s deadline).
	Defaults jobs.Defaults

	// ElectionTTL is the leader session's TTL (default 5s): leadership moves
	// within it after a leader dies.
	ElectionTTL time.Duration
	// ReplicaID names this replica (default hostname-pid).
	ReplicaID string

	// HTTP server timeouts (defaults 5s, 30s, 30s, 120s). Event streams clear
	// their write deadline and carry their own bound.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// ShutdownTimeout bounds the drain of in-flight requests (default 10s).
	ShutdownTimeout time.Duration

	// OnLeader runs while this replica holds leadership; its context ends
	// when leadership is lost or the server stops. The dispatcher plugs in
	// here. nil: the replica campaigns and shows leadership but runs nothing.
	OnLeader func(ctx context.Context, l store.Leadership) error
	// NoDashboard leaves the operator pages out (only the JSON API and the
	// operational endpoints are served).
	NoDashboard bool

	// Redactor holds the secret values scrubbed from every log record; New
	// adds the tokens of TokensFile. Logger should be built on it
	// (logging.New); nil: New makes one that only this server's parts feed.
	Redactor *logging.Redactor

	Logger *slog.Logger
	Now    func() time.Time
}

// Defaults as documented on Config.
const (
	DefaultListen        = "127.0.0.1:8080"
	DefaultDataDir       = "./data"
	DefaultPrefix        = "/jobfence"
	DefaultQuotaGlobal   = 10000
	DefaultQuotaPerScope = 1000
	DefaultElectionTTL   = 5 * time.Second
)

// DefaultJobDefaults are the limits an omitted submission field takes.
func DefaultJobDefaults() jobs.Defaults {
	return jobs.Defaults{
		MemoryBytes:     256 << 20,
		MaxMemoryBytes:  4 << 30,
		Pids:            256,
		DeadlineSeconds: 3600,
	}
}

// ApplyDefaults fills zero fields.
func (c *Config) ApplyDefaults() {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.QuotaGlobal == 0 {
		c.QuotaGlobal = DefaultQuotaGlobal
	}
	if c.QuotaPerScope == 0 {
		c.QuotaPerScope = DefaultQuotaPerScope
	}
	d := DefaultJobDefaults()
	if c.Defaults.MemoryBytes == 0 {
		c.Defaults.MemoryBytes = d.MemoryBytes
	}
	if c.Defaults.MaxMemoryBytes == 0 {
		c.Defaults.MaxMemoryBytes = d.MaxMemoryBytes
	}
	if c.Defaults.Pids == 0 {
		c.Defaults.Pids = d.Pids
	}
	if c.Defaults.DeadlineSeconds == 0 {
		c.Defaults.DeadlineSeconds = d.DeadlineSeconds
	}
	if c.ElectionTTL == 0 {
		c.ElectionTTL = DefaultElectionTTL
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "replica"
		}
		c.ReplicaID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.ReadHeaderTimeout == 0 {
		c.ReadHeaderTimeout = 5 * time.Second
	}
	if c.ReadTimeout == 0 {
		c.ReadTimeout = 30 * time.Second
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 30 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 120 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.Redactor == nil {
		c.Redactor = logging.NewRedactor()
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem at once. Call it after ApplyDefaults.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.TokensFile == "" {
		bad("tokens-file is required")
	}
	if c.Listener == nil {
		if _, _, err := net.SplitHostPort(c.Listen); err != nil {
			bad("listen %q is not host:port", c.Listen)
		}
	}
	if len(c.EtcdEndpoints) == 0 && c.DataDir == "" {
		bad("data-dir is required without etcd-endpoints")
	}
	for _, ep := range c.EtcdEndpoints {
		if strings.TrimSpace(ep) == "" {
			bad("etcd-endpoints has an empty entry")
		}
	}
	if (c.EtcdCert == "") != (c.EtcdKey == "") {
		bad("etcd-cert and etcd-key go together")
	}
	if len(c.EtcdEndpoints) == 0 && (c.EtcdCA != "" || c.EtcdCert != "") {
		bad("etcd-ca, etcd-cert and etcd-key need etcd-endpoints")
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		bad("tls-cert and tls-key go together")
	}
	embedded := c.EtcdName != "" || c.EtcdPeerURL != "" || c.EtcdClientURL != "" || c.EtcdInitialCluster != "" || c.EtcdClusterState != ""
	if embedded && len(c.EtcdEndpoints) > 0 {
		bad("etcd-name, etcd-peer-url, etcd-client-url, etcd-initial-cluster and etcd-initial-cluster-state configure the embedded member: not with etcd-endpoints")
	}
	for name, u := range map[string]string{"etcd-peer-url": c.EtcdPeerURL, "etcd-client-url": c.EtcdClientURL} {
		if u == "" {
			continue
		}
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			bad("%s %q is not an http(s)://host:port URL", name, u)
		}
	}
	if c.EtcdInitialCluster != "" {
		if c.EtcdName == "" || c.EtcdPeerURL == "" {
			bad("etcd-initial-cluster needs etcd-name and etcd-peer-url")
		} else if !strings.Contains(","+c.EtcdInitialCluster+",", ","+c.EtcdName+"="+c.EtcdPeerURL+",") {
			bad("etcd-initial-cluster must list this member as %s=%s", c.EtcdName, c.EtcdPeerURL)
		}
	}
	if c.EtcdQuotaBackendBytes < 0 {
		bad("etcd-quota-backend-bytes must not be negative")
	}
	if c.EtcdQuotaBackendBytes != 0 && len(c.EtcdEndpoints) > 0 {
		bad("etcd-quota-backend-bytes configures the embedded member: not with etcd-endpoints")
	}
	switch c.EtcdClusterState {
	case "", "new", "existing":
	default:
		bad("etcd-initial-cluster-state %q: want new or existing", c.EtcdClusterState)
	}
	if !strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/") {
		bad("prefix %q must start with / and not end with /", c.Prefix)
	}
	if c.QuotaGlobal < 1 {
		bad("quota-global must be at least 1, got %d", c.QuotaGlobal)
	}
	if c.QuotaPerScope < 1 {
		bad("quota-per-scope must be at least 1, got %d", c.QuotaPerScope)
	}
	if c.QuotaPerScope > c.QuotaGlobal {
		bad("quota-per-scope (%d) exceeds quota-global (%d)", c.QuotaPerScope, c.QuotaGlobal)
	}
	const minMemory = 4 << 20
	if c.Defaults.MaxMemoryBytes < minMemory {
		bad("max-memory must be at least 4 MiB")
	}
	if c.Defaults.MemoryBytes < minMemory || c.Defaults.MemoryBytes > c.Defaults.MaxMemoryBytes {
		bad("default memory must be between 4 MiB and max-memory")
	}
	if c.Defaults.Pids < 1 || c.Defaults.Pids > 65536 {
		bad("default pids must be 1-65536")
	}
	if c.Defaults.DeadlineSeconds < 1 || c.Defaults.DeadlineSeconds > 604800 {
		bad("default deadline must be 1-604800 seconds")
	}
	if c.AdvertiseURL != "" {
		if err := checkAdvertiseURL(c.AdvertiseURL); err != nil {
			bad("advertise-url %q %v", c.AdvertiseURL, err)
		}
	}
	if c.ElectionTTL < time.Second {
		bad("election-ttl must be at least 1s, got %s", c.ElectionTTL)
	}
	if c.ReplicaID == "" || strings.ContainsAny(c.ReplicaID, "/ \t\n") {
		bad("replica id %q must be non-empty without slashes or spaces", c.ReplicaID)
	}
	for name, d := range map[string]time.Duration{
		"read-header timeout": c.ReadHeaderTimeout, "read timeout": c.ReadTimeout,
		"write timeout": c.WriteTimeout, "idle timeout": c.IdleTimeout, "shutdown timeout": c.ShutdownTimeout,
	} {
		if d < 0 {
			bad("%s must not be negative", name)
		}
	}
	return errors.Join(errs...)
}

// checkAdvertiseURL accepts a base URL other replicas can call: http or
// https, a host, and nothing a base does not have.
func checkAdvertiseURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return errors.New("is not a URL")
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("must be http:// or https://")
	case u.Host == "" || u.Hostname() == "":
		return errors.New("has no host")
	case u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/"):
		return errors.New("must be a base URL (no user, path, query or fragment)")
	}
	return nil
}

// advertiseURL is the base URL this replica registers: the configured one,
// or one derived from the address the listener is bound to (bound rather
// than configured, so port 0 resolves to the real port).
func advertiseURL(configured, bound string, tls bool) string {
	if configured != "" {
		return strings.TrimSuffix(configured, "/")
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port)
}
