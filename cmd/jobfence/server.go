package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/go-json-experiment/json"

	"jobfence/internal/logging"
	"jobfence/server"
)

// serverFlags binds every server flag to cfg; dev reuses it.
type serverFlags struct {
	etcdEndpoints string
	logFormat     string
	logLevel      string
}

func bindServerFlags(fs *flag.FlagSet, cfg *server.Config, sf *serverFlags) {
	d := server.DefaultJobDefaults()
	fs.StringVar(&cfg.Listen, "listen", server.DefaultListen, "HTTP listen address (host:port)")
	fs.StringVar(&cfg.DataDir, "data-dir", server.DefaultDataDir, "directory of the embedded etcd member")
	fs.StringVar(&cfg.TokensFile, "tokens-file", "", `bearer tokens, JSON [{"subject","role","token"}] (role viewer|submitter|operator|agent)`)
	fs.StringVar(&sf.etcdEndpoints, "etcd-endpoints", "", "comma-separated URLs of an external etcd cluster (default: embedded etcd in --data-dir)")
	fs.StringVar(&cfg.EtcdCA, "etcd-ca", "", "PEM CA bundle for TLS to the external etcd")
	fs.StringVar(&cfg.EtcdCert, "etcd-cert", "", "PEM client certificate for the external etcd")
	fs.StringVar(&cfg.EtcdKey, "etcd-key", "", "PEM client key for the external etcd")
	fs.StringVar(&cfg.Prefix, "prefix", server.DefaultPrefix, "etcd key prefix")
	fs.StringVar(&cfg.EtcdName, "etcd-name", "", "embedded member name (a three-node cluster names each member)")
	fs.StringVar(&cfg.EtcdPeerURL, "etcd-peer-url", "", "embedded member's peer URL, listened on and advertised (default a free 127.0.0.1 port)")
	fs.StringVar(&cfg.EtcdClientURL, "etcd-client-url", "", "embedded member's client URL, listened on and advertised (default a free 127.0.0.1 port)")
	fs.StringVar(&cfg.EtcdInitialCluster, "etcd-initial-cluster", "", "every member as name=peerURL,... (default this member alone)")
	fs.StringVar(&cfg.EtcdClusterState, "etcd-initial-cluster-state", "", "new (default) or existing (joining a running cluster)")
	fs.Int64Var(&cfg.EtcdQuotaBackendBytes, "etcd-quota-backend-bytes", 0, "embedded member's backend quota in bytes; past it writes fail until space is reclaimed (default etcd's)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "PEM certificate chain served on --listen (with --tls-key)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "PEM key of --tls-cert")
	fs.StringVar(&cfg.TLSCA, "tls-ca", "", "PEM CA bundle that agents' certificates are verified with (default: system roots)")
	fs.IntVar(&cfg.QuotaGlobal, "quota-global", server.DefaultQuotaGlobal, "most unresolved jobs in all")
	fs.IntVar(&cfg.QuotaPerScope, "quota-per-scope", server.DefaultQuotaPerScope, "most unresolved jobs per scope")
	fs.DurationVar(&cfg.ElectionTTL, "election-ttl", server.DefaultElectionTTL, "leader session TTL")
	fs.StringVar(&cfg.ReplicaID, "replica-id", "", "this replica's name (default hostname-pid)")
	fs.StringVar(&cfg.AdvertiseURL, "advertise-url", "", "this replica's API base URL as the other replicas reach it, for their dashboards (default from --listen: a wildcard host becomes 127.0.0.1, https with --tls-cert)")
	fs.Int64Var(&cfg.Defaults.MaxMemoryBytes, "max-memory", d.MaxMemoryBytes, "largest limits.memory_bytes a job may ask for")
	fs.Int64Var(&cfg.Defaults.MemoryBytes, "default-memory", d.MemoryBytes, "limits.memory_bytes when omitted")
	fs.Int64Var(&cfg.Defaults.Pids, "default-pids", d.Pids, "limits.pids when omitted")
	fs.Int64Var(&cfg.Defaults.DeadlineSeconds, "default-deadline", d.DeadlineSeconds, "limits.deadline_seconds when omitted")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 0, "bound on draining in-flight requests (default 10s)")
	fs.StringVar(&sf.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&sf.logLevel, "log-level", "info", "debug, info, warn or error")
}

// finish turns the parsed flag strings into cfg fields.
func (sf *serverFlags) finish(cfg *server.Config, stderr io.Writer) error {
	if sf.etcdEndpoints != "" {
		for _, ep := range strings.Split(sf.etcdEndpoints, ",") {
			cfg.EtcdEndpoints = append(cfg.EtcdEndpoints, strings.TrimSpace(ep))
		}
	}
	cfg.Redactor = logging.NewRedactor()
	lg, _, err := newLogger(stderr, sf.logFormat, sf.logLevel, cfg.Redactor)
	if err != nil {
		return err
	}
	cfg.Logger = lg
	return nil
}

// newLogger builds the process's logger on internal/logging, so every record
// passes the redactor before any sink.
func newLogger(w io.Writer, format, level string, secrets *logging.Redactor) (*slog.Logger, *logging.Ring, error) {
	f, ferr := logging.ParseFormat(format)
	lvl, lerr := logging.ParseLevel(level)
	if err := errors.Join(ferr, lerr); err != nil {
		return nil, nil, err
	}
	lg, ring := logging.New(logging.Config{Format: f, Level: lvl, Writer: w}, secrets)
	return lg, ring, nil
}

// envOverlay gives every flag not set on the command line the value of
// JOBFENCE_<FLAG> (upper case, dashes as underscores), so the flag wins.
func envOverlay(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		name := "JOBFENCE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	})
	return errors.Join(errs...)
}

func parseServerArgs(name string, args []string, cfg *server.Config, dc *server.DispatchConfig, extra ...func(*flag.FlagSet)) error {
	fs := flag.NewFlagSet("jobfence "+name, flag.ContinueOnError)
	var sf serverFlags
	bindServerFlags(fs, cfg, &sf)
	server.RegisterDispatchFlags(fs, dc)
	for _, bind := range extra {
		bind(fs)
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := envOverlay(fs); err != nil {
		return err
	}
	return sf.finish(cfg, os.Stderr)
}

func runServer(ctx context.Context, args []string) error {
	var cfg server.Config
	dc := server.DefaultDispatchConfig()
	if err := parseServerArgs("server", args, &cfg, &dc); err != nil {
		return err
	}
	s, err := newServer(cfg, dc)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// newServer builds the replica; with a dispatch token it also dispatches
// while elected. Without one it admits and inspects but never sends a job,
// and says so.
func newServer(cfg server.Config, dc server.DispatchConfig) (*server.Server, error) {
	s, err := server.New(cfg)
	if err != nil {
		return nil, err
	}
	registerDispatchSecrets(s.Redactor(), dc)
	if dc.DispatchTokenFile == "" {
		cfg.Logger.Warn("dispatch_disabled", "reason", "no --dispatch-token-file: jobs are admitted but never dispatched")
		return s, nil
	}
	if err := s.EnableDispatch(dc); err != nil {
		return nil, err
	}
	return s, nil
}

// registerDispatchSecrets adds the dispatch token and every credential value
// the profiles file holds now to the redactor. Values added to the file
// later are registered by the dispatcher's agent client when first sent.
// Unreadable files are left to the dispatcher, which reports them.
func registerDispatchSecrets(r *logging.Redactor, dc server.DispatchConfig) {
	if dc.DispatchTokenFile != "" {
		if raw, err := os.ReadFile(dc.DispatchTokenFile); err == nil {
			r.Add(strings.TrimSpace(string(raw)))
		}
	}
	if dc.CredentialsFile != "" {
		if raw, err := os.ReadFile(dc.CredentialsFile); err == nil {
			var profiles map[string]map[string]string
			if json.Unmarshal(raw, &profiles) == nil {
				for _, p := range profiles {
					for _, v := range p {
						r.Add(v)
					}
				}
			}
		}
	}
}
