package web

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"go.uber.org/goleak"

	"jobfence/internal/etcdtest"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// The dashboard must accept the real store as its Store.
var _ Store = (*store.Store)(nil)

// TestMain stops the shared etcd and then checks that no stream, browser or
// store goroutine outlived its test.
func TestMain(m *testing.M) {
	code := m.Run()
	etcdtest.Shutdown()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left running:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Planted values: none of them may ever appear in a page, a stream or a cookie.
const (
	operatorToken  = "tok-operator-3c9d0e1f2a3b4c5d6e7f"
	viewerToken    = "tok-viewer-8a7b6c5d4e3f2a1b0c9d"
	submitterToken = "tok-submitter-1f2e3d4c5b6a79880a"
	agentToken     = "tok-agent-0a1b2c3d4e5f6a7b8c9d0e"
	// credentialValue is what the "warehouse-rw" profile would resolve to at
	// dispatch; the dashboard has no way to reach it and must not show it.
	credentialValue = "cred-value-p4ssw0rd-77f1e2"
)

var testTokens = map[string][2]string{
	operatorToken:  {"olga", "operator"},
	viewerToken:    {"vic", "viewer"},
	submitterToken: {"sam", "submitter"},
	agentToken:     {"agent-1", "agent"},
}

type harness struct {
	t      *testing.T
	st     *store.Store
	dash   *Dashboard
	srv    *httptest.Server
	leader store.Leadership
	// secret is the dispatch secret of every job driven through MarkRunning.
	secret string
}

func newHarness(t *testing.T, opts ...func(*Config)) *harness {
	t.Helper()
	cli := etcdtest.New(t)
	prefix := etcdtest.Prefix(t)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	st, err := store.New(store.Config{
		Client:        cli,
		Prefix:        prefix,
		QuotaGlobal:   100,
		QuotaPerScope: 10,
		Defaults:      jobs.Defaults{MemoryBytes: 64 << 20, MaxMemoryBytes: 1 << 30, Pids: 64, DeadlineSeconds: 600},
		ReplicaID:     "replica-test",
		Now:           time.Now,
		Logger:        logger,
	})
	if err != nil {
		t.Fatalf("store.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- st.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-runDone
	})
	waitFor(t, 10*time.Second, "the read model's first list", st.Ready)

	el, err := store.NewElector(cli, prefix, "replica-test", 5*time.Second)
	if err != nil {
		t.Fatalf("NewElector: %v", err)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	lead, err := el.Campaign(cctx)
	if err != nil {
		t.Fatalf("Campaign: %v", err)
	}
	t.Cleanup(func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		_ = el.Resign(rctx)
	})

	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	h := &harness{t: t, st: st, leader: lead, secret: hex.EncodeToString(secret)}
	cfg := Config{
		Store: st,
		Authenticate: func(token string) (string, string, bool) {
			e, ok := testTokens[token]
			return e[0], e[1], ok
		},
		Leader: func() (string, time.Time, int64) {
			return lead.ID, time.Now().Add(-time.Minute), lead.Rev
		},
		ReplicaID:     "replica-test",
		QuotaGlobal:   100,
		QuotaPerScope: 10,
		KeepAlive:     time.Second,
		Logger:        logger,
	}
	for _, o := range opts {
		o(&cfg)
	}
	h.dash = New(cfg)
	h.srv = httptest.NewServer(h.dash)
	t.Cleanup(func() {
		h.dash.CloseStreams()
		h.srv.Close()
	})
	if !strings.HasPrefix(h.srv.URL, "http://127.0.0.1:") {
		t.Fatalf("test server listens on %s, want 127.0.0.1", h.srv.URL)
	}
	return h
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not synchronisation
	}
}

// admit admits a job on target through the store, as POST /v1/jobs would.
func (h *harness) admit(target, credentials string) *jobs.Job {
	h.t.Helper()
	scope, name, _ := strings.Cut(target, "/")
	j, created, err := h.st.Admit(context.Background(), store.AdmitInput{
		Target:    jobs.Target{Scope: strings.ToLower(scope), Name: strings.ToLower(name), Display: target},
		Operation: "create",
		Spec: jobs.Spec{
			Command:     []string{"/usr/local/bin/build-index", "--table", "orders"},
			Env:         map[string]string{"TABLE": "orders"},
			Credentials: credentials,
			WorkingDir:  "/",
			Limits:      jobs.Limits{MemoryBytes: 64 << 20, Pids: 64, DeadlineSeconds: 600},
			Outcome:     jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{}},
		},
		Actor: "sam",
	})
	if err != nil || !created {
		h.t.Fatalf("Admit(%s): created=%v err=%v", target, created, err)
	}
	return j
}

// unknown drives a fresh job on target to UNKNOWN the way the dispatcher
// does: markRunning under leadership, then the deadline sweep's
// NO_TRUSTED_RESULT. Its slot stays held: nothing proves the domain is gone.
func (h *harness) unknown(target string) *jobs.Job {
	h.t.Helper()
	ctx := context.Background()
	j := h.admit(target, "warehouse-rw")
	sum := sha256.Sum256([]byte(h.secret))
	j, err := h.st.MarkRunning(ctx, h.leader, j.ID, j.Revision, store.MarkRunningInput{
		AgentID:      "agent-1",
		AgentEpoch:   "epoch-" + uuid.NewString(),
		AgentAddress: "127.0.0.1:1",
		InvocationID: uuid.NewString(),
		SecretHash:   hex.EncodeToString(sum[:]),
		Deadline:     time.Now().Add(time.Minute),
	})
	if err != nil {
		h.t.Fatalf("MarkRunning: %v", err)
	}
	j, err = h.st.Classify(ctx, h.leader, j.ID, j.Revision, jobs.CodeNoTrustedResult, "deadline passed without a result")
	if err != nil {
		h.t.Fatalf("Classify: %v", err)
	}
	if j.State != jobs.Unknown || !j.Slot.Held {
		h.t.Fatalf("after Classify: state %s slot %+v, want UNKNOWN with the slot held", j.State, j.Slot)
	}
	h.waitSynced(j.Revision)
	return j
}

// putAgent registers an agent the way its heartbeat does.
func (h *harness) putAgent(id string) {
	h.t.Helper()
	_, err := h.st.PutAgent(context.Background(), id, jobs.AgentRegistration{
		Address:   "127.0.0.1:7443",
		Epoch:     "epoch-" + uuid.NewString(),
		Capacity:  4,
		Isolation: jobs.Isolation{Mode: "cgroup-v2", Verified: true, Detail: "memory, pids, group OOM kill"},
	})
	if err != nil {
		h.t.Fatalf("PutAgent: %v", err)
	}
}

func (h *harness) waitSynced(rev int64) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.st.WaitSynced(ctx, rev); err != nil {
		h.t.Fatalf("WaitSynced(%d): %v", rev, err)
	}
}

func (h *harness) fenced(target string) bool {
	for _, f := range h.st.Fences() {
		if f.Target == target {
			return true
		}
	}
	return false
}

// client is a browser-like HTTP client: a cookie jar and no redirects
// followed, so each answer can be checked as sent.
type client struct {
	h   *harness
	c   *http.Client
	jar *cookiejar.Jar
}

func (h *harness) client() *client {
	jar, _ := cookiejar.New(nil)
	return &client{h: h, jar: jar, c: &http.Client{
		Jar:           jar,
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (c *client) do(method, path string, form url.Values, header map[string]string) (*http.Response, string) {
	c.h.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.h.srv.URL+path, body)
	if err != nil {
		c.h.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	res, err := c.c.Do(req)
	if err != nil {
		c.h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.h.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return res, string(b)
}

func (c *client) get(path string) (*http.Response, string) { return c.do("GET", path, nil, nil) }

func (c *client) post(path string, form url.Values) (*http.Response, string) {
	return c.do("POST", path, form, nil)
}

// login signs in with token and returns the session's CSRF token as the
// pages carry it.
func (c *client) login(token string) string {
	c.h.t.Helper()
	res, _ := c.post("/login", url.Values{"token": {token}, "next": {"/"}})
	if res.StatusCode != http.StatusSeeOther {
		c.h.t.Fatalf("login: status %d, want 303", res.StatusCode)
	}
	_, page := c.get("/")
	return csrfOf(c.h.t, page)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the page")
	}
	return m[1]
}
