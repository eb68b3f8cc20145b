package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-json-experiment/json"

	"jobfence/handlers"
	"jobfence/server"
)

// devRoles get one token each in the generated tokens file.
var devRoles = []handlers.Role{handlers.RoleViewer, handlers.RoleSubmitter, handlers.RoleOperator, handlers.RoleAgent}

// devTokens returns the tokens file under dataDir, writing one (mode 0600)
// with a random token per role when none exists, so tokens survive restarts.
func devTokens(dataDir string) (path string, entries []handlers.TokenEntry, err error) {
	path = filepath.Join(dataDir, "tokens.json")
	raw, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(raw, &entries); err != nil {
			return "", nil, fmt.Errorf("%s exists but is not a tokens file; remove it to regenerate", path)
		}
		return path, entries, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", nil, err
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", nil, err
	}
	for _, role := range devRoles {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return "", nil, err
		}
		entries = append(entries, handlers.TokenEntry{Subject: "dev-" + string(role), Role: role, Token: hex.EncodeToString(b)})
	}
	out, err := json.Marshal(entries, json.Deterministic(true))
	if err != nil {
		return "", nil, err
	}
	// O_EXCL: two dev processes racing on a fresh dir must not mix tokens.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", nil, err
	}
	if _, err := f.Write(append(out, '\n')); err != nil {
		f.Close()
		return "", nil, err
	}
	if err := f.Close(); err != nil {
		return "", nil, err
	}
	return path, entries, writeTokensEnv(dataDir, entries)
}

// devDispatchToken returns <data-dir>/dispatch-token, the token the server
// presents to agents, creating it (mode 0600) when absent.
func devDispatchToken(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "dispatch-token")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", err
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.Write([]byte(hex.EncodeToString(b) + "\n")); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

// writeTokensEnv writes <data-dir>/tokens.env, shell assignments of the same
// tokens, so `. ./data/tokens.env` makes the README's curl lines work as printed.
func writeTokensEnv(dataDir string, entries []handlers.TokenEntry) error {
	var b strings.Builder
	for _, e := range entries {
		fmt.Fprintf(&b, "%s_TOKEN=%s\n", strings.ToUpper(string(e.Role)), e.Token)
	}
	return os.WriteFile(filepath.Join(dataDir, "tokens.env"), []byte(b.String()), 0o600)
}

// runDev runs a server on embedded etcd with a generated tokens file and
// prints how to reach it.
func runDev(ctx context.Context, args []string) error {
	var cfg server.Config
	dc := server.DefaultDispatchConfig()
	var af devAgentFlags
	if err := parseServerArgs("dev", args, &cfg, &dc, af.bind); err != nil {
		return err
	}
	if len(cfg.EtcdEndpoints) > 0 {
		return errors.New("dev always uses embedded etcd; use `jobfence server` with --etcd-endpoints")
	}
	if cfg.TokensFile == "" {
		path, _, err := devTokens(cfg.DataDir)
		if err != nil {
			return fmt.Errorf("tokens: %w", err)
		}
		cfg.TokensFile = path
	}
	var entries []handlers.TokenEntry
	if raw, err := os.ReadFile(cfg.TokensFile); err == nil {
		_ = json.Unmarshal(raw, &entries)
	}
	if dc.DispatchTokenFile == "" {
		path, err := devDispatchToken(cfg.DataDir)
		if err != nil {
			return fmt.Errorf("dispatch token: %w", err)
		}
		dc.DispatchTokenFile = path
	}
	s, err := newServer(cfg, dc)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-s.Started():
	}
	agentDone, err := startDevAgent(ctx, af, s.Addr(), cfg.DataDir, entries, dc.DispatchTokenFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "jobfence dev: local agent not started: %v\n", err)
	}
	printDev(s.Addr(), cfg.TokensFile, entries)
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "jobfence dev: not running as root: the local agent cannot create worker cgroups, so its isolation is unverified and jobs stay PENDING")
	}
	err = <-done
	if agentDone != nil {
		<-agentDone
	}
	return err
}

func printDev(addr, tokensFile string, entries []handlers.TokenEntry) {
	base := "http://" + addr
	tok := map[handlers.Role]string{}
	fmt.Printf("\njobfence dev is running\n\n  dashboard and API  %s/\n  tokens file        %s (shell: . %s)\n\n",
		base, tokensFile, filepath.Join(filepath.Dir(tokensFile), "tokens.env"))
	for _, e := range entries {
		if _, seen := tok[e.Role]; !seen {
			tok[e.Role] = e.Token
			fmt.Printf("  %-10s %s   (%s)\n", e.Role, e.Token, e.Subject)
		}
	}
	if sub := tok[handlers.RoleSubmitter]; sub != "" {
		fmt.Printf("\nadmit a job:\n\n  curl -sS -X POST %s/v1/jobs -H 'Authorization: Bearer %s' -H 'Content-Type: application/json' -d '{\"target\":\"demo/hello\",\"command\":[\"/bin/echo\",\"hello\"]}'\n", base, sub)
	}
	if v := tok[handlers.RoleViewer]; v != "" {
		fmt.Printf("\nlist jobs:\n\n  curl -sS %s/v1/jobs -H 'Authorization: Bearer %s'\n\n", base, v)
	}
}
