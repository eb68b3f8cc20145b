package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"jobfence/internal/metrics"
	"jobfence/isolation"
	"jobfence/jobs"
)

// Agent is one agent process: one epoch, one cgroup root.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics.Agent
	host  *isolation.Host
	epoch string
	queue chan *invocation

	mu          sync.Mutex
	invocations map[string]*invocation

	secretsMu sync.Mutex
	recent    []string

	ready chan struct{}
}

// invocation is the agent's record of one invocation id. req is dropped once
// the run is over, so credentials do not outlive their use.
type invocation struct {
	id      string
	status  string
	expires time.Time
	req     *DispatchRequest
}

// New checks the configuration.
func New(cfg Config) (*Agent, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Agent{
		cfg:         cfg,
		log:         cfg.Logger.With("agent_id", cfg.ID),
		m:           metrics.NewAgent(),
		queue:       make(chan *invocation, max(cfg.QueueSize, 1)),
		invocations: map[string]*invocation{},
		ready:       make(chan struct{}),
	}, nil
}

// Ready is closed once the startup sweep is done, the epoch chosen and the
// listener serving.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Epoch is this process's epoch; valid after Ready.
func (a *Agent) Epoch() string { return a.epoch }

// Run sweeps leftovers of earlier processes, picks the epoch, serves the
// dispatch API, heartbeats, and runs dispatches until ctx ends. Running
// domains are then taken down by their ladders and their reports attempted
// before Run returns.
func (a *Agent) Run(ctx context.Context) error {
	if a.cfg.ReapOrphans {
		if err := isolation.BecomeSubreaper(); err != nil {
			return fmt.Errorf("become subreaper: %w", err)
		}
	}
	host, err := isolation.Open(isolation.Config{Root: a.cfg.CgroupRoot, ShimPath: a.cfg.ShimPath, ShimArgs: a.cfg.ShimArgs, Logger: a.log})
	if err != nil {
		a.cfg.Listener.Close()
		return err
	}
	defer host.Close()
	a.host, a.epoch = host, host.Epoch()
	rep := host.Report()
	if rep.Verified {
		a.m.SetIsolationVerified(true)
	} else {
		a.log.Error("isolation unverified: every dispatch will be refused", "detail", rep.Detail)
	}
	a.log = a.log.With("agent_epoch", a.epoch)

	srv := &http.Server{
		Handler:           a.routes(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       60 * time.Second,
		ErrorLog:          slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	var wg sync.WaitGroup
	serveErr := make(chan error, 1)
	ln := a.cfg.Listener
	if a.cfg.TLS != nil {
		ln = tls.NewListener(ln, a.cfg.TLS)
	}
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	})
	runCtx, cancelRuns := context.WithCancel(context.Background())
	var execs sync.WaitGroup
	for i := 0; i < a.cfg.Capacity; i++ {
		execs.Go(func() { a.executor(ctx, runCtx) })
	}
	wg.Go(func() { a.heartbeat(ctx) })
	wg.Go(func() { a.housekeeping(ctx) })
	close(a.ready)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = srv.Shutdown(shutCtx)
	cancel()
	cancelRuns()
	execs.Wait()
	// Accepted but never started: they provably never ran, and saying so
	// releases their slots now rather than at the deadline.
	for drained := false; !drained; {
		select {
		case inv := <-a.queue:
			a.neverStarted(ctx, inv, "the agent shut down before the run started")
		default:
			drained = true
		}
	}
	a.m.SetQueueDepth(0)
	wg.Wait()
	a.cfg.HTTPClient.CloseIdleConnections()
	return runErr
}

// route is one operation of the listener; agent/openapi.yaml documents
// exactly these, and the contract test walks them.
type route struct {
	pattern string
	handler http.Handler
}

func (a *Agent) routeTable() []route {
	return []route{
		{"POST /v1/dispatches", a.auth(a.handleDispatch)},
		{"GET /v1/invocations/{id}", a.auth(a.handleStatus)},
		{"POST /v1/invocations/{id}/tombstone", a.auth(a.handleTombstone)},
		{"GET /metrics", a.m.Handler()},
		{"GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok\n")) })},
		{"GET /openapi.yaml", http.HandlerFunc(serveOpenAPI)},
	}
}

func (a *Agent) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range a.routeTable() {
		mux.Handle(rt.pattern, rt.handler)
	}
	// ServeMux answers an unknown path or method in plain text; every error
	// of this API is problem+json, so those two are answered here.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// API.md: every answer carries X-Request-Id, health and metrics too.
		w.Header().Set("X-Request-Id", requestID())
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		var allow []string
		for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "" {
				allow = append(allow, m)
			}
		}
		if len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeProblem(w, r, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed", "this path does not serve "+r.Method)
			return
		}
		writeProblem(w, r, http.StatusNotFound, "not-found", "Not found", "no such path")
	})
}

func requestID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func writeProblem(w http.ResponseWriter, r *http.Request, status int, slug, title, detail string) {
	id := w.Header().Get("X-Request-Id")
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(Problem{Type: ProblemTypeBase + slug, Title: title, Status: status, Detail: detail, Instance: r.URL.Path, RequestID: id})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *Agent) auth(next http.HandlerFunc) http.HandlerFunc {
	want := []byte("Bearer " + a.cfg.DispatchToken)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			writeProblem(w, r, http.StatusUnauthorized, "unauthenticated", "Unauthenticated", "missing or unknown dispatch token")
			return
		}
		next(w, r)
	}
}

// readJSON reads one strict JSON object under API.md's input rules: exact
// member names (a case variant is unknown), no duplicate or unknown member,
// valid UTF-8, nothing after the object. tooLarge reports a body over the
// limit, which the caller turns into its own answer.
func readJSON(w http.ResponseWriter, r *http.Request, v any) (tooLarge bool, err error) {
	if !jsonContentType(r.Header.Get("Content-Type")) {
		writeProblem(w, r, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type", "the body must be application/json")
		return false, errors.New("content type")
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		writeProblem(w, r, http.StatusBadRequest, "malformed", "Malformed request", "the body could not be read")
		return false, err
	}
	if len(b) > maxBody {
		return true, errors.New("too large")
	}
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		writeProblem(w, r, http.StatusBadRequest, "malformed", "Malformed request", "the body must be one JSON object")
		return false, errors.New("not an object")
	}
	// encoding/json matches member names case-insensitively and keeps the
	// last of duplicate members; the v2 decoder does neither.
	dec := jsontext.NewDecoder(bytes.NewReader(b))
	if err := jsonv2.UnmarshalDecode(dec, v, jsonv2.RejectUnknownMembers(true)); err != nil {
		writeProblem(w, r, http.StatusBadRequest, "malformed", "Malformed request", "the body is not the expected JSON object")
		return false, err
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		writeProblem(w, r, http.StatusBadRequest, "malformed", "Malformed request", "trailing data after the JSON object")
		return false, errors.New("trailing data")
	}
	return false, nil
}

// jsonContentType accepts application/json with at most a utf-8 charset.
func jsonContentType(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}

func (a *Agent) refuse(w http.ResponseWriter, r *http.Request, slug, detail string, req *DispatchRequest) {
	attrs := []any{"refusal", slug}
	if req != nil {
		attrs = append(attrs, "job_id", req.JobID, "invocation_id", req.InvocationID)
	}
	a.log.Warn("dispatch refused", attrs...)
	writeProblem(w, r, RefusalStatus[slug], slug, "Dispatch refused", detail)
}

// handleDispatch applies the receive checks in their fixed order (epoch,
// isolation, payload bounds, repeated invocation id, deadline funding, queue
// space). Every refusal leaves no record behind, and the invocation never
// executes.
func (a *Agent) handleDispatch(w http.ResponseWriter, r *http.Request) {
	var req DispatchRequest
	tooLarge, err := readJSON(w, r, &req)
	if tooLarge {
		a.refuse(w, r, RefusalPayloadTooLarge, fmt.Sprintf("the body exceeds %d bytes", maxBody), nil)
		return
	}
	if err != nil {
		return
	}
	a.learnSecrets(&req)
	if req.AgentEpoch != a.epoch {
		a.refuse(w, r, RefusalEpochMismatch, "agent_epoch is not this agent process's epoch", &req)
		return
	}
	if rep := a.host.Report(); !rep.Verified {
		a.refuse(w, r, RefusalIsolationUnverified, rep.Detail, &req)
		return
	}
	if problem := checkBounds(&req); problem != "" {
		a.refuse(w, r, RefusalPayloadTooLarge, problem, &req)
		return
	}
	// A repeat of an accepted invocation is answered before the deadline
	// check: by now its deadline may be unfundable, and a refusal would claim
	// that an invocation which is running, or ran, never will.
	a.mu.Lock()
	if inv, ok := a.invocations[req.InvocationID]; ok {
		st := inv.status
		a.mu.Unlock()
		if st == StatusTombstoned {
			a.refuse(w, r, RefusalTombstoned, "this invocation was tombstoned and never runs", &req)
			return
		}
		// One invocation id, one execution: a repeat is accepted and ignored.
		a.log.Warn("repeated invocation ignored", "job_id", req.JobID, "invocation_id", req.InvocationID)
		writeJSON(w, http.StatusAccepted, InvocationStatus{Status: st})
		return
	}
	now := a.cfg.Now()
	if need := a.cfg.reservation() + a.cfg.MinRunWindow; req.Deadline.Sub(now) < need {
		a.mu.Unlock()
		a.refuse(w, r, RefusalDeadlineUnfundable, fmt.Sprintf("the deadline leaves %s; at least %s is needed", req.Deadline.Sub(now).Round(time.Millisecond), need), &req)
		return
	}
	if len(a.queue) >= cap(a.queue) || a.cfg.QueueSize == 0 {
		a.mu.Unlock()
		a.refuse(w, r, RefusalQueueFull, "no queue space", &req)
		return
	}
	inv := &invocation{id: req.InvocationID, status: StatusQueued, expires: req.Deadline.Add(a.cfg.Retention), req: &req}
	a.invocations[req.InvocationID] = inv
	a.queue <- inv
	a.m.SetQueueDepth(len(a.queue))
	a.mu.Unlock()
	a.log.Info("dispatch accepted", "job_id", req.JobID, "invocation_id", req.InvocationID, "deadline", req.Deadline)
	writeJSON(w, http.StatusAccepted, InvocationStatus{Status: StatusQueued})
}

// checkBounds names the first field out of the agent's bounds, or "".
func checkBounds(req *DispatchRequest) string {
	switch {
	case req.JobID == "" || len(req.JobID) > 64:
		return "job_id: 1-64 bytes"
	case !idRE.MatchString(req.InvocationID):
		return "invocation_id: 1-64 letters, digits, '-' or '_'"
	case req.Secret == "" || len(req.Secret) > 256:
		return "secret: 1-256 bytes"
	case req.Deadline.IsZero():
		return "deadline: required"
	case len(req.Spec.Command) < 1 || len(req.Spec.Command) > maxArgs:
		return fmt.Sprintf("spec.command: 1-%d arguments", maxArgs)
	case !filepath.IsAbs(req.Spec.Command[0]):
		return "spec.command: the first argument must be an absolute path"
	case len(req.Spec.Env) > maxEnv:
		return fmt.Sprintf("spec.env: at most %d entries", maxEnv)
	case len(req.Credentials) > maxCredentials:
		return fmt.Sprintf("credentials: at most %d entries", maxCredentials)
	case req.Spec.Limits.MemoryBytes != 0 && req.Spec.Limits.MemoryBytes < minMemory:
		return fmt.Sprintf("spec.limits.memory_bytes: at least %d", minMemory)
	case req.Spec.Limits.Pids < 0 || req.Spec.Limits.Pids > maxPids:
		return fmt.Sprintf("spec.limits.pids: 1-%d", maxPids)
	case req.Spec.WorkingDir != "" && (!filepath.IsAbs(req.Spec.WorkingDir) || filepath.Clean(req.Spec.WorkingDir) != req.Spec.WorkingDir):
		return "spec.working_dir: an absolute clean path"
	}
	n := 0
	for _, arg := range req.Spec.Command {
		n += len(arg)
		if strings.IndexByte(arg, 0) >= 0 {
			return "spec.command: NUL in an argument"
		}
	}
	if n > maxArgBytes {
		return fmt.Sprintf("spec.command: more than %d bytes", maxArgBytes)
	}
	n = 0
	for _, m := range []map[string]string{req.Spec.Env, req.Credentials} {
		for k, v := range m {
			n += len(k) + len(v)
			if !envNameRE.MatchString(k) || strings.IndexByte(v, 0) >= 0 {
				return "spec.env or credentials: names [A-Za-z_][A-Za-z0-9_]*, no NUL in values"
			}
		}
	}
	if n > maxEnvBytes {
		return fmt.Sprintf("spec.env and credentials: more than %d bytes", maxEnvBytes)
	}
	return ""
}

func (a *Agent) handleStatus(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	st := StatusUnknown
	if inv, ok := a.invocations[r.PathValue("id")]; ok {
		st = inv.status
	}
	a.mu.Unlock()
	writeJSON(w, http.StatusOK, InvocationStatus{Status: st})
}

func (a *Agent) handleTombstone(w http.ResponseWriter, r *http.Request) {
	var req TombstoneRequest
	tooLarge, err := readJSON(w, r, &req)
	if tooLarge {
		writeProblem(w, r, http.StatusRequestEntityTooLarge, "too-large", "Too large", "the body is too large")
		return
	}
	if err != nil {
		return
	}
	if req.AgentEpoch != a.epoch {
		// A new process cannot know what its predecessor received.
		writeProblem(w, r, RefusalStatus[RefusalEpochMismatch], RefusalEpochMismatch, "Epoch mismatch", "agent_epoch is not this agent process's epoch")
		return
	}
	id := r.PathValue("id")
	if !idRE.MatchString(id) {
		writeProblem(w, r, http.StatusBadRequest, "malformed", "Malformed request", "invalid invocation id")
		return
	}
	a.mu.Lock()
	inv, ok := a.invocations[id]
	if !ok {
		// No dispatch can outlive this horizon: deadlines are at most a week.
		inv = &invocation{id: id, status: StatusTombstoned, expires: a.cfg.Now().Add(7*24*time.Hour + a.cfg.Retention)}
		a.invocations[id] = inv
	}
	st := inv.status
	a.mu.Unlock()
	if !ok {
		a.log.Info("invocation tombstoned", "invocation_id", id)
	}
	writeJSON(w, http.StatusOK, InvocationStatus{Status: st})
}

func (a *Agent) setStatus(inv *invocation, st string) {
	a.mu.Lock()
	inv.status = st
	if st == StatusReported {
		inv.req = nil
	}
	a.mu.Unlock()
}

// heartbeat announces the epoch right away, then every Heartbeat.
func (a *Agent) heartbeat(ctx context.Context) {
	rep := a.host.Report()
	body := jobs.AgentRegistration{
		Address:   a.cfg.Advertise,
		Epoch:     a.epoch,
		Capacity:  a.cfg.Capacity,
		Isolation: jobs.Isolation{Mode: string(rep.Mode), Verified: rep.Verified, Detail: sanitize(rep.Detail, nil)},
	}
	t := time.NewTicker(a.cfg.Heartbeat)
	defer t.Stop()
	announced := false
	for {
		status, err := a.send(ctx, http.MethodPut, "/v1/agents/"+url.PathEscape(a.cfg.ID), body)
		switch {
		case err != nil:
			a.log.Warn("heartbeat failed", "error", err)
		case status != http.StatusOK && status != http.StatusCreated && status != http.StatusNoContent:
			a.log.Warn("heartbeat refused", "status", status)
		case !announced:
			announced = true
			a.log.Info("epoch announced", "address", a.cfg.Advertise, "capacity", a.cfg.Capacity, "isolation_verified", rep.Verified)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// send makes one authenticated JSON request to the server and returns its status.
func (a *Agent) send(ctx context.Context, method, path string, body any) (int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return 0, err
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(a.cfg.ServerURL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+a.cfg.Token)
	resp, err := a.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode, nil
}

// housekeeping forgets expired invocation records and reaps adopted orphans.
func (a *Agent) housekeeping(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := a.cfg.Now()
		a.mu.Lock()
		// An expired record keeps only its id and status: forgetting the id
		// would let a late tombstone request be answered "tombstoned" for an
		// invocation that ran.
		for _, inv := range a.invocations {
			if now.After(inv.expires) && inv.status != StatusQueued && inv.status != StatusRunning {
				inv.req = nil
			}
		}
		a.mu.Unlock()
		if a.cfg.ReapOrphans {
			isolation.ReapOrphans()
		}
	}
}
