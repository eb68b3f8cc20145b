package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"jobfence/agent"
	"jobfence/handlers"
	"jobfence/internal/logging"
	"jobfence/jobs"
)

const (
	opsCredName  = "DB_PASSWORD"
	opsCredValue = "cred-value-Zq81xPw07hT"
)

// Must-show 2 (processes): a server and an agent at debug level handle a
// job whose credential value reaches the worker, a job that fails printing
// it, result posts carrying the real dispatch secret with a stale identity
// and a wrong secret, and requests bearing every token. Neither process's
// log holds a token, the dispatch token, the credential value or any
// dispatch secret, while the logs do record that work.
func testRedactionInProcessLogs(t *testing.T, bin string) {
	o := newOps(t, bin, nil)
	creds := o.write("credentials.json", fmt.Sprintf(`{"warehouse": {%q: %q}}`, opsCredName, opsCredValue))
	srv := o.startServer("r1", nil, "--credentials-file", creds)

	// Dispatches reach the agent through a proxy that records them, so the
	// test knows each secret the server generated.
	agentAddr := freeAddr(t)
	rec := &dispatchRecorder{}
	proxyURL := rec.start(t, "http://"+agentAddr)
	o.startAgent("agent-r", srv.base, agentAddr, srv.base, "--advertise", proxyURL)

	body := opsJob("redact/ok", `test "$DB_PASSWORD" = "`+opsCredValue+`"`)
	body["credentials"] = "warehouse"
	ok := o.submit(srv.base, body)
	o.waitFor("the credentialed job finished", 60*time.Second, func() bool {
		j := o.job(srv.base, ok)
		return j != nil && j.State != jobs.Pending && j.State != jobs.Running
	})
	if j := o.job(srv.base, ok); j.State != jobs.Committed {
		t.Fatalf("the job using the credential: %s %+v", j.State, j.Result)
	}

	// The value is printed by a command that then fails: an outcome path
	// with a detail the agent reports.
	bad := opsJob("redact/bad", `echo "$DB_PASSWORD" >&2; echo "$DB_PASSWORD"; exit 7`)
	bad["credentials"] = "warehouse"
	failed := o.submit(srv.base, bad)
	fj := o.waitState(srv.base, failed, jobs.Unknown)
	if strings.Contains(fmt.Sprint(fj.Result), opsCredValue) {
		t.Errorf("the credential value reached the job record: %+v", fj.Result)
	}

	secrets := rec.secrets()
	if len(secrets) != 2 {
		t.Fatalf("recorded %d dispatches, want 2", len(secrets))
	}
	// The right secret with a stale invocation id, then a wrong secret.
	j := o.job(srv.base, ok)
	stale := map[string]any{"dispatch_revision": j.Dispatch.DispatchRevision, "invocation_id": "00000000-0000-4000-8000-000000000000",
		"agent_epoch": j.Dispatch.AgentEpoch, "secret": secrets[0], "code": "EXIT_COMMITTED", "phase": "NATIVE_RETURN",
		"exit_code": 0, "proof": "CHILD_REAPED", "detail": opsCredValue}
	if st, raw := o.callAt(srv.base, "POST", "/v1/jobs/"+ok+"/result", opsTokens[handlers.RoleAgent], stale); st < 400 {
		t.Errorf("stale result accepted: %d %s", st, raw)
	}
	stale["secret"] = flipLast(secrets[0])
	if st, _ := o.callAt(srv.base, "POST", "/v1/jobs/"+ok+"/result", opsTokens[handlers.RoleAgent], stale); st != http.StatusForbidden {
		t.Errorf("wrong secret: %d, want 403", st)
	}
	for _, tok := range opsTokens {
		o.callAt(srv.base, "GET", "/v1/status", tok, nil)
		o.callAt(srv.base, "PUT", "/v1/settings/dispatch", tok, map[string]any{"paused": false})
	}
	o.callAt(srv.base, "GET", "/v1/jobs", opsDispatchToken, nil)

	hidden := append([]string{opsDispatchToken, opsCredValue}, secrets...)
	for _, tok := range opsTokens {
		hidden = append(hidden, tok)
	}
	o.mu.Lock()
	procs := append([]*opsProc(nil), o.procs...)
	o.mu.Unlock()
	o.stopAll()
	// The logs must show the work, or their silence would prove nothing.
	expect := map[string][]string{
		procs[0].name: {`"job_dispatched"`, `"component":"dispatcher"`, `"component":"http"`, `"route":"/v1/jobs/{id}/result"`},
		procs[1].name: {`"dispatch accepted"`, `"result reported"`},
	}
	for _, p := range procs {
		logs := p.logs.String()
		for _, want := range expect[p.name] {
			if !strings.Contains(logs, want) {
				t.Errorf("%s logs lack %s", p.name, want)
			}
		}
		for _, h := range hidden {
			if strings.Contains(logs, h) {
				t.Errorf("%s logged a secret (%.6s…)", p.name, h)
			}
		}
	}
}

// flipLast changes the last hex digit, keeping the secret's shape.
func flipLast(s string) string {
	if s == "" {
		return "0"
	}
	c := byte('0')
	if s[len(s)-1] == '0' {
		c = '1'
	}
	return s[:len(s)-1] + string(c)
}

// dispatchRecorder is a reverse proxy in front of an agent that keeps the
// secret of every dispatch it forwards.
type dispatchRecorder struct {
	mu   sync.Mutex
	seen []string
}

func (d *dispatchRecorder) start(t *testing.T, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == "/v1/dispatches" {
			raw, _ := io.ReadAll(r.Body)
			var req agent.DispatchRequest
			if json.Unmarshal(raw, &req) == nil && req.Secret != "" {
				d.mu.Lock()
				d.seen = append(d.seen, req.Secret)
				d.mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(raw))
		}
		proxy.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + l.Addr().String()
}

func (d *dispatchRecorder) secrets() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.seen...)
}

// Must-show 2 (in process): the redactor a server builds knows every token
// of its tokens file, and the dispatcher's instrumented agent client teaches
// it each dispatch's secret and credential values before the send, so a
// record naming them, logged by any component (the server derives each
// component's logger from one pipeline), shows none of them.
func TestRedactionEveryComponent(t *testing.T) {
	dir := t.TempDir()
	tokens := writeAPITokens(t, dir)
	var out bytes.Buffer
	var outMu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(p) })
	r := logging.NewRedactor()
	lg, ring := logging.New(logging.Config{Format: logging.FormatJSON, Level: slog.LevelDebug, Writer: w}, r)
	s, err := New(Config{TokensFile: tokens, DataDir: filepath.Join(dir, "data"), Logger: lg, Redactor: r})
	if err != nil {
		t.Fatal(err)
	}
	if s.Redactor() != r {
		t.Fatal("the server did not keep the given redactor")
	}
	var entries []handlers.TokenEntry
	raw, _ := os.ReadFile(tokens)
	if err := json.Unmarshal(raw, &entries); err != nil || len(entries) == 0 {
		t.Fatalf("tokens file: %v", err)
	}
	secret, credValue := "5f2a9c0d41e87b36a0c9d2e4f1b8a7c6", "credential-Kp93jsQ"
	logged := make(chan struct{})
	fake := agentFunc(func(ctx context.Context, d AgentDispatch) error {
		// What a careless component would do with the send in hand.
		lg.With("component", "dispatcher").Warn("send_failed", "secret_copy", d.Secret, "creds", d.Credentials,
			"err", fmt.Errorf("agent said %s/%s", d.Secret, d.Credentials["DB"]))
		close(logged)
		return errors.New("connection reset")
	})
	agents := s.InstrumentAgents(fake)
	job := &jobs.Job{ID: "j1", Dispatch: &jobs.Dispatch{InvocationID: "i1"}}
	if err := agents.Dispatch(context.Background(), "http://127.0.0.1:1", AgentDispatch{Job: job, Secret: secret, Credentials: map[string]string{"DB": credValue}}); err == nil {
		t.Fatal("the wrapper hid the agent client's error")
	}
	<-logged
	hidden := []string{secret, credValue}
	for _, e := range entries {
		hidden = append(hidden, e.Token)
	}
	for _, comp := range []string{"server", "http", "store", "dispatcher", "web", "agent"} {
		cl := lg.With("component", comp)
		for _, h := range hidden {
			cl.Info("probe", "value", h, "text", "before "+h+" after", "group", slog.GroupValue(slog.String("inner", h)))
			cl.Error("probe_error", "err", fmt.Errorf("wrapped: %w", errors.New(h)))
		}
	}
	outMu.Lock()
	text := out.String()
	outMu.Unlock()
	for _, rec := range ring.Recent(ring.Cap()) {
		text += fmt.Sprint(rec)
	}
	for _, h := range hidden {
		if strings.Contains(text, h) {
			t.Errorf("a secret (%.6s…) reached the log output", h)
		}
	}
	if n := strings.Count(text, logging.Redacted); n < len(hidden)*6*3 {
		t.Errorf("only %d redactions: the probes did not log what they should", n)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

type agentFunc func(ctx context.Context, d AgentDispatch) error

func (f agentFunc) Dispatch(ctx context.Context, _ string, d AgentDispatch) error { return f(ctx, d) }
func (f agentFunc) Tombstone(context.Context, string, string, string) (string, error) {
	return "", errors.New("not used")
}
