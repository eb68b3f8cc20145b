package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"jobfence/handlers"
)

// devAgentFlags are the local agent's settings in `jobfence dev`.
type devAgentFlags struct {
	listen       string
	capacity     int
	clockSkew    time.Duration
	termGrace    time.Duration
	reapBound    time.Duration
	minRunWindow time.Duration
}

func (f *devAgentFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.listen, "agent-listen", "127.0.0.1:9090", "dispatch listener of the local agent")
	fs.IntVar(&f.capacity, "agent-capacity", 2, "concurrent workers of the local agent")
	fs.DurationVar(&f.clockSkew, "clock-skew", time.Second, "local agent: assumed clock skew between server and agent")
	fs.DurationVar(&f.termGrace, "term-grace", 10*time.Second, "local agent: SIGTERM to cgroup kill")
	fs.DurationVar(&f.reapBound, "reap-bound", 11*time.Second, "local agent: cgroup kill to an empty domain")
	fs.DurationVar(&f.minRunWindow, "min-run-window", 5*time.Second, "local agent: least run time a deadline must fund")
}

// startDevAgent runs `jobfence agent` as a child process, so the agent keeps
// its own process hygiene (subreaper, no core dumps) apart from the server,
// exactly as on a worker host. The child dies with dev (PDEATHSIG), and its
// workers die with it. The returned channel closes when the child has exited.
func startDevAgent(ctx context.Context, f devAgentFlags, serverAddr, dataDir string, entries []handlers.TokenEntry, dispatchTokenFile string) (<-chan struct{}, error) {
	var token string
	for _, e := range entries {
		if e.Role == handlers.RoleAgent {
			token = e.Token
			break
		}
	}
	if token == "" {
		return nil, errors.New("the tokens file has no agent token")
	}
	if dispatchTokenFile == "" {
		return nil, errors.New("no dispatch token")
	}
	tokenFile := filepath.Join(dataDir, "agent-token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "agent",
		"--id", "dev-agent",
		"--listen", f.listen,
		"--server", "http://"+serverAddr,
		"--token-file", tokenFile,
		"--dispatch-token-file", dispatchTokenFile,
		"--capacity", fmt.Sprint(f.capacity),
		"--clock-skew", f.clockSkew.String(),
		"--term-grace", f.termGrace.String(),
		"--reap-bound", f.reapBound.String(),
		"--min-run-window", f.minRunWindow.String(),
		"--log-format", "text",
	)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.Env = os.Environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	go func() {
		select {
		case <-ctx.Done():
			// The agent's own SIGTERM path kills and reaps its workers and
			// reports them before it exits.
			_ = cmd.Process.Signal(syscall.SIGTERM)
		case <-done:
		}
	}()
	return done, nil
}
