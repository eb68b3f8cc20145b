package handlers_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"

	"jobfence/handlers"
	"jobfence/internal/apitest"
	"jobfence/internal/etcdtest"
	"jobfence/internal/store"
	"jobfence/jobs"
)

const (
	agentToken    = "agent-token-0123456789abcdef"
	operatorToken = "operator-token-0123456789abcd"
	viewerToken   = "viewer-token-0123456789abcdef"
)

// agentAPI is the real API over a real store on the test binary's embedded
// etcd, reached over 127.0.0.1 with answers validated against openapi.yaml.
type agentAPI struct {
	t      testing.TB
	ctx    context.Context
	st     *store.Store
	cli    *clientv3.Client
	l      store.Leadership
	base   string
	client *http.Client
}

func startAgentAPI(t testing.TB) *agentAPI {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cli := etcdtest.New(t)
	prefix := etcdtest.Prefix(t)
	st, err := store.New(store.Config{Client: cli, Prefix: prefix, QuotaGlobal: 10, QuotaPerScope: 10,
		Defaults: jobs.Defaults{MemoryBytes: 64 << 20, MaxMemoryBytes: 1 << 30, Pids: 64, DeadlineSeconds: 60}, ReplicaID: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = st.Run(ctx) }()
	auth, err := handlers.NewAuth([]handlers.TokenEntry{
		{Subject: "agent-1", Role: handlers.RoleAgent, Token: agentToken},
		{Subject: "op", Role: handlers.RoleOperator, Token: operatorToken},
		{Subject: "view", Role: handlers.RoleViewer, Token: viewerToken},
	})
	if err != nil {
		t.Fatal(err)
	}
	api := handlers.New(handlers.Config{Store: st, Auth: auth, ReplicaID: "r1"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.Routes(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	el, err := store.NewElector(cli, prefix, "r1", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Close()
		_ = el.Close()
		cancel()
		<-runDone
	})
	deadline := time.Now().Add(20 * time.Second)
	for !st.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("read model not ready")
		}
		time.Sleep(10 * time.Millisecond)
	}
	l, err := el.Campaign(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return &agentAPI{t: t, ctx: ctx, st: st, cli: cli, l: l, base: "http://" + ln.Addr().String(),
		client: &http.Client{Transport: apitest.Transport(t, nil), Timeout: 30 * time.Second}}
}

type answer struct {
	status int
	body   map[string]any
}

func (a *agentAPI) call(method, path, token string, body any) answer {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &m)
	return answer{status: resp.StatusCode, body: m}
}

func slug(a answer) string {
	s, _ := a.body["type"].(string)
	return s[strings.LastIndex(s, "/")+1:]
}

func (a *agentAPI) rev() int64 {
	a.t.Helper()
	resp, err := a.cli.Get(a.ctx, "revision-probe")
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.Header.Revision
}

// running admits a job and marks it RUNNING the way the dispatcher does,
// returning the job and the secret only the agent knows.
func (a *agentAPI) running(target string) (*jobs.Job, string) {
	a.t.Helper()
	tg, err := jobs.ParseTarget(target)
	if err != nil {
		a.t.Fatal(err)
	}
	j, _, err := a.st.Admit(a.ctx, store.AdmitInput{Target: tg, Actor: "sub", Spec: jobs.Spec{
		Command: []string{"/bin/true"}, Limits: jobs.Limits{MemoryBytes: 64 << 20, Pids: 8, DeadlineSeconds: 60},
		Outcome: jobs.Outcome{CommittedExitCodes: []int{0}, NotCommittedExitCodes: []int{3}},
	}})
	if err != nil {
		a.t.Fatal(err)
	}
	secret := strings.ReplaceAll(uuid.NewString(), "-", "")
	j, err = a.st.MarkRunning(a.ctx, a.l, j.ID, j.Revision, store.MarkRunningInput{
		AgentID: "agent-1", AgentEpoch: "epoch-1", AgentAddress: "http://127.0.0.1:1",
		InvocationID: uuid.NewString(), SecretHash: jobs.HashSecret(secret), Deadline: time.Now().Add(time.Minute),
	})
	if err != nil {
		a.t.Fatal(err)
	}
	return j, secret
}

func envelope(j *jobs.Job, secret string, code jobs.ResultCode, exit int) map[string]any {
	return map[string]any{
		"dispatch_revision": j.Dispatch.DispatchRevision, "invocation_id": j.Dispatch.InvocationID,
		"agent_epoch": j.Dispatch.AgentEpoch, "secret": secret, "code": code,
		"phase": jobs.PhaseNativeReturn, "exit_code": exit, "detail": "exited", "proof": jobs.ProofChildReaped,
	}
}

func (a *agentAPI) job(id string) *jobs.Job {
	a.t.Helper()
	j, err := a.st.Get(a.ctx, id)
	if err != nil {
		a.t.Fatal(err)
	}
	return j
}

func TestResultSecretIsCheckedFirst(t *testing.T) {
	a := startAgentAPI(t)
	j, secret := a.running("wh/secret")
	path := "/v1/jobs/" + j.ID + "/result"

	before := a.rev()
	// A wrong secret with a proof and a committed code applies nothing at all.
	wrong := envelope(j, strings.Repeat("0", 32), jobs.CodeExitCommitted, 0)
	if got := a.call("POST", path, agentToken, wrong); got.status != http.StatusForbidden || slug(got) != "forbidden" {
		t.Fatalf("wrong secret: %d %v", got.status, got.body)
	}
	// The secret is checked before the identity: a wrong secret on a
	// mismatched identity is still 403, so a guess learns nothing.
	wrong["invocation_id"] = uuid.NewString()
	if got := a.call("POST", path, agentToken, wrong); got.status != http.StatusForbidden {
		t.Fatalf("wrong secret and identity: %d", got.status)
	}
	if a.rev() != before {
		t.Fatal("a rejected envelope wrote to etcd")
	}
	if got := a.job(j.ID); got.State != jobs.Running || !got.Slot.Held {
		t.Fatalf("a wrong secret changed the job: %s %+v", got.State, got.Slot)
	}

	// The right secret with another identity is stale, and nothing is written either.
	for field, v := range map[string]any{"invocation_id": uuid.NewString(), "dispatch_revision": j.Dispatch.DispatchRevision + 1, "agent_epoch": "epoch-0"} {
		env := envelope(j, secret, jobs.CodeExitCommitted, 0)
		env[field] = v
		if got := a.call("POST", path, agentToken, env); got.status != http.StatusConflict || slug(got) != "stale" {
			t.Fatalf("mismatched %s: %d %v", field, got.status, got.body)
		}
	}
	if a.rev() != before {
		t.Fatal("a stale envelope wrote to etcd")
	}

	good := envelope(j, secret, jobs.CodeExitCommitted, 0)
	if got := a.call("POST", path, agentToken, good); got.status != http.StatusOK || got.body["applied"] != true {
		t.Fatalf("right envelope: %d %v", got.status, got.body)
	}
	done := a.job(j.ID)
	if done.State != jobs.Committed || done.Slot.Held || done.Slot.Proof != jobs.ProofChildReaped || !done.Resolved {
		t.Fatalf("after the report: %s %+v resolved=%v", done.State, done.Slot, done.Resolved)
	}
	// A repeat answers the same and changes nothing.
	after := a.rev()
	if got := a.call("POST", path, agentToken, good); got.status != http.StatusOK || got.body["applied"] != true {
		t.Fatalf("repeat: %d %v", got.status, got.body)
	}
	if a.rev() != after || a.job(j.ID).Revision != done.Revision {
		t.Fatal("a repeated envelope wrote to etcd")
	}
}

func TestLateResultIsKeptAndReleasesTheSlot(t *testing.T) {
	a := startAgentAPI(t)
	j, secret := a.running("wh/late")
	if _, err := a.st.Classify(a.ctx, a.l, j.ID, j.Revision, jobs.CodeNoTrustedResult, "deadline"); err != nil {
		t.Fatal(err)
	}
	env := envelope(j, secret, jobs.CodeExitCommitted, 0)
	if got := a.call("POST", "/v1/jobs/"+j.ID+"/result", agentToken, env); got.status != http.StatusOK {
		t.Fatalf("late report: %d %v", got.status, got.body)
	}
	got := a.job(j.ID)
	if got.State != jobs.Unknown || got.Slot.Held || got.Slot.Proof != jobs.ProofChildReaped {
		t.Fatalf("state %s slot %+v", got.State, got.Slot)
	}
	if got.Result == nil || len(got.Result.Late) != 1 || got.Result.Late[0].Code != jobs.CodeExitCommitted {
		t.Fatalf("late evidence %+v", got.Result)
	}
	if got.Resolved || len(a.st.Fences()) != 1 {
		t.Fatal("a late report resolved an UNKNOWN job")
	}
}

func TestResultInputAndRoles(t *testing.T) {
	a := startAgentAPI(t)
	j, secret := a.running("wh/input")
	path := "/v1/jobs/" + j.ID + "/result"
	good := envelope(j, secret, jobs.CodeExitCommitted, 0)
	before := a.rev()

	cases := []struct {
		name   string
		token  string
		path   string
		body   any
		status int
		slug   string
	}{
		{"no token", "", path, good, 401, "unauthenticated"},
		{"operator token", operatorToken, path, good, 403, "forbidden"},
		{"viewer token", viewerToken, path, good, 403, "forbidden"},
		{"not a uuid", agentToken, "/v1/jobs/nope/result", good, 404, "not-found"},
		{"unknown job", agentToken, "/v1/jobs/" + uuid.NewString() + "/result", good, 404, "not-found"},
		{"unknown field", agentToken, path, `{"secret":"x","bogus":1}`, 400, "malformed"},
		{"trailing data", agentToken, path, `{} {}`, 400, "malformed"},
		{"server code", agentToken, path, withField(good, "code", "TOMBSTONED"), 422, "invalid"},
		{"server proof", agentToken, path, withField(good, "proof", "AGENT_EPOCH_REPLACED"), 422, "invalid"},
		{"exit code", agentToken, path, withField(good, "exit_code", 300), 422, "invalid"},
		{"control char", agentToken, path, withField(good, "detail", "a\u202eb"), 422, "invalid"},
		{"empty secret", agentToken, path, withField(good, "secret", ""), 422, "invalid"},
	}
	for _, tc := range cases {
		got := a.call("POST", tc.path, tc.token, tc.body)
		if got.status != tc.status || slug(got) != tc.slug {
			t.Errorf("%s: %d %s, want %d %s", tc.name, got.status, slug(got), tc.status, tc.slug)
		}
	}
	if a.rev() != before || a.job(j.ID).State != jobs.Running {
		t.Fatal("rejected input changed something")
	}
}

func withField(m map[string]any, k string, v any) map[string]any {
	c := map[string]any{}
	for kk, vv := range m {
		c[kk] = vv
	}
	c[k] = v
	return c
}

func TestPutAgent(t *testing.T) {
	a := startAgentAPI(t)
	reg := map[string]any{"address": "http://127.0.0.1:7070", "epoch": "e-1", "capacity": 2,
		"isolation": map[string]any{"mode": "cgroup-hybrid", "verified": true, "detail": "ok"}}
	got := a.call("PUT", "/v1/agents/agent-1", agentToken, reg)
	if got.status != http.StatusOK || got.body["id"] != "agent-1" || got.body["epoch"] != "e-1" {
		t.Fatalf("register: %d %v", got.status, got.body)
	}
	list := a.call("GET", "/v1/agents", viewerToken, nil)
	agents, _ := list.body["agents"].([]any)
	if len(agents) != 1 || agents[0].(map[string]any)["address"] != "http://127.0.0.1:7070" {
		t.Fatalf("agents %v", list.body)
	}

	before := a.rev()
	for name, tc := range map[string]struct {
		id, token string
		body      any
		status    int
	}{
		"operator token": {"agent-1", operatorToken, reg, 403},
		"bad address":    {"agent-1", agentToken, withField(reg, "address", "file:///etc/passwd"), 422},
		"address path":   {"agent-1", agentToken, withField(reg, "address", "http://h:1/x"), 422},
		"zero capacity":  {"agent-1", agentToken, withField(reg, "capacity", 0), 422},
		"empty epoch":    {"agent-1", agentToken, withField(reg, "epoch", ""), 422},
		"bad id":         {"agent%20one", agentToken, reg, 422},
		"unknown field":  {"agent-1", agentToken, withField(reg, "extra", true), 400},
	} {
		if got := a.call("PUT", "/v1/agents/"+tc.id, tc.token, tc.body); got.status != tc.status {
			t.Errorf("%s: %d %v, want %d", name, got.status, got.body, tc.status)
		}
	}
	if a.rev() != before {
		t.Fatal("a rejected registration wrote to etcd")
	}
}

// FuzzResultEndpoint throws arbitrary bodies at the result endpoint of a
// RUNNING job: the answer is always a client status or 200, never an
// internal error, and only a 200 may change the job.
func FuzzResultEndpoint(f *testing.F) {
	f.Add([]byte(`{"dispatch_revision":1,"invocation_id":"x","agent_epoch":"e","secret":"s","code":"EXIT_COMMITTED","phase":"NATIVE_RETURN","proof":"NONE"}`))
	f.Add([]byte(`{"secret":"` + strings.Repeat("a", 200) + `"}`))
	f.Add([]byte(`{"exit_code":-1,"code":"KILLED_OOM","phase":"INDETERMINATE_AFTER_LAUNCH","proof":"CHILD_REAPED"}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"detail":"\u0000"}`))
	f.Add([]byte(`{"Secret":"a","secret":"b"}`))
	// One API and one RUNNING job serve every input; a server per input
	// would make the fuzzer crawl.
	a := startAgentAPI(f)
	j, _ := a.running("wh/fuzz")
	f.Fuzz(func(t *testing.T, body []byte) {
		before, err := a.st.Get(a.ctx, j.ID)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", a.base+"/v1/jobs/"+j.ID+"/result", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+agentToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
		case 400, 403, 409, 413, 422:
			if after, _ := a.st.Get(a.ctx, j.ID); after.Revision != before.Revision {
				t.Fatalf("answer %d but the job changed", resp.StatusCode)
			}
		default:
			t.Fatalf("answer %d to %q", resp.StatusCode, body)
		}
	})
}
