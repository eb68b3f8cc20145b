package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"jobfence/agent"
	"jobfence/internal/logging"
	"jobfence/internal/tlsconfig"
)

// runAgent wires flags (or JOBFENCE_* variables) into agent.Config and runs
// the agent until ctx ends.
func runAgent(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	id := fs.String("id", "", "agent id (required)")
	listen := fs.String("listen", "127.0.0.1:9090", "address of the dispatch listener")
	advertise := fs.String("advertise", "", "base URL announced to the server (default http://<listen address>)")
	server := fs.String("server", "", "jobfence server base URL (required)")
	tokenFile := fs.String("token-file", "", "file holding this agent's token (agent role)")
	dispatchTokenFile := fs.String("dispatch-token-file", "", "file holding the token the server presents to agents")
	capacity := fs.Int("capacity", 1, "concurrent workers")
	queueSize := fs.Int("queue-size", 0, "accepted dispatches waiting for a worker (default: capacity)")
	cgroupRoot := fs.String("cgroup-root", "", "cgroup2 directory for worker domains (default: autodetect)")
	skew := fs.Duration("clock-skew", time.Second, "assumed clock skew between server and agent")
	grace := fs.Duration("term-grace", 10*time.Second, "SIGTERM to cgroup kill")
	reap := fs.Duration("reap-bound", 11*time.Second, "cgroup kill to an empty domain")
	minRun := fs.Duration("min-run-window", 5*time.Second, "least run time a deadline must fund")
	defMem := fs.Int64("default-memory", 256<<20, "memory limit in bytes when a job sets none")
	defPids := fs.Int64("default-pids", 256, "pids limit when a job sets none")
	tlsCert := fs.String("tls-cert", "", "PEM certificate for the dispatch listener (with --tls-key)")
	tlsKey := fs.String("tls-key", "", "PEM key for the dispatch listener")
	tlsCA := fs.String("tls-ca", "", "PEM CA bundle to verify the server's certificate")
	logFormat := fs.String("log-format", "json", "json or text")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := agentFlagsFromEnv(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	// The tokens and every dispatch's secret and credential values are
	// registered here, so no log record of any agent part shows them.
	secrets := logging.NewRedactor()
	log, _, err := newLogger(os.Stderr, *logFormat, *logLevel, secrets)
	if err != nil {
		return err
	}

	var errs []error
	token, err := readTokenFile(*tokenFile)
	if err != nil {
		errs = append(errs, fmt.Errorf("token-file: %w", err))
	}
	dispatchToken, err := readTokenFile(*dispatchTokenFile)
	if err != nil {
		errs = append(errs, fmt.Errorf("dispatch-token-file: %w", err))
	}
	secrets.Add(token, dispatchToken)
	var listenTLS *tls.Config
	if *tlsCert != "" || *tlsKey != "" {
		if listenTLS, err = tlsconfig.Server(*tlsCert, *tlsKey); err != nil {
			errs = append(errs, fmt.Errorf("tls-cert/tls-key: %w", err))
		}
	}
	clientTLS, err := tlsconfig.Client(*tlsCA)
	if err != nil {
		errs = append(errs, fmt.Errorf("tls-ca: %w", err))
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Hygiene isolation cannot give the agent itself: descriptors leaked by
	// whoever started us never reach a worker, a crash leaves no core with
	// secrets in it, and same-uid workers cannot read our memory.
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	_ = unix.Setrlimit(unix.RLIMIT_CORE, &unix.Rlimit{})
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)

	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	a, err := agent.New(agent.Config{
		ID: *id, Listener: ln, Advertise: *advertise, ServerURL: *server,
		Token: token, DispatchToken: dispatchToken,
		Capacity: *capacity, QueueSize: *queueSize, CgroupRoot: *cgroupRoot,
		ClockSkew: *skew, TermGrace: *grace, ReapBound: *reap, MinRunWindow: *minRun,
		DefaultMemory: *defMem, DefaultPids: *defPids,
		TLS:         listenTLS,
		ReapOrphans: true,
		Secrets:     secrets,
		Logger:      log,
		HTTPClient: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, TLSClientConfig: clientTLS,
			MaxIdleConnsPerHost: 4, IdleConnTimeout: 90 * time.Second,
		}},
	})
	if err != nil {
		ln.Close()
		return err
	}
	return a.Run(ctx)
}

// agentFlagsFromEnv parses args after taking unset flags from JOBFENCE_<FLAG>.
func agentFlagsFromEnv(fs *flag.FlagSet, args []string) error {
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		name := "JOBFENCE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
		}
	})
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return fs.Parse(args)
}

func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", errors.New("required")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	t := strings.TrimSpace(string(b))
	if t == "" {
		return "", errors.New("empty")
	}
	return t, nil
}
