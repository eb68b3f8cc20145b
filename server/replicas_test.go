package server

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/internal/store"
)

// overviewRows signs in to base's dashboard as a viewer and returns the
// replica rows of its overview, by replica id.
func overviewRows(t *testing.T, base string) map[string]string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	resp, err := c.PostForm(base+"/login", url.Values{"token": {apiTokens[handlers.RoleViewer]}})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	resp, err = c.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("overview at %s: %d %v", base, resp.StatusCode, err)
	}
	out := map[string]string{}
	for _, m := range replicaRow.FindAllStringSubmatch(string(raw), -1) {
		out[m[1]] = m[2]
	}
	return out
}

var replicaRow = regexp.MustCompile(`(?s)<tr data-replica="([^"]+)">(.*?)</tr>`)

// cursorIn is the cursor a replica row shows ("" when it shows none).
func cursorIn(row, id string) string {
	m := regexp.MustCompile(`data-cursor="` + regexp.QuoteMeta(id) + `">(\d+)<`).FindStringSubmatch(row)
	if m == nil {
		return ""
	}
	return m[1]
}

// readyCursor is the cursor base's /readyz reports (validated against
// openapi.yaml by the harness's client).
func readyCursor(t *testing.T, h *apiH, id string) int64 {
	t.Helper()
	r := h.do("GET", "/readyz", "", nil)
	if r.status != http.StatusOK {
		t.Fatalf("readyz: %d %s", r.status, r.body)
	}
	var body handlers.Ready
	r.decode(t, &body)
	if body.Status != "ready" || body.Replica.ID != id || body.Replica.Cursor <= 0 || body.Replica.Lag < 0 {
		t.Fatalf("readyz body %s", r.body)
	}
	return body.Replica.Cursor
}

// Two replicas on one etcd: each lists the other with the cursor the other
// reports; an idle pair (leases kept alive, overviews asking each other)
// writes nothing; a stopped replica leaves the list.
func TestReplicasOnTheOverview(t *testing.T) {
	prefix := ""
	a := startAPI(t, func(c *Config) { prefix = c.Prefix; c.ReplicaID = "replica-a" })
	b := startAPI(t, func(c *Config) { c.Prefix = prefix; c.ReplicaID = "replica-b" })

	var rows map[string]string
	pollUntil(t, "A's overview shows B's cursor as B reports it", func() bool {
		rows = overviewRows(t, a.base)
		want := strconv.FormatInt(readyCursor(t, b, "replica-b"), 10)
		return cursorIn(rows["replica-b"], "replica-b") == want
	})
	if len(rows) != 2 || rows["replica-a"] == "" {
		t.Fatalf("A's overview rows %v, want replica-a and replica-b", rows)
	}
	leader := a.srv.leader.get().ID
	for id, row := range rows {
		self := id == "replica-a"
		if regexp.MustCompile(`\(this replica\)`).MatchString(row) != self {
			t.Errorf("row %s: this-replica marker wrong: %s", id, row)
		}
		if regexp.MustCompile(`>leader<`).MatchString(row) != (id == leader) {
			t.Errorf("row %s: leader marker wrong (leader %s): %s", id, leader, row)
		}
	}
	pollUntil(t, "B's overview shows A", func() bool {
		return cursorIn(overviewRows(t, b.base)["replica-a"], "replica-a") != ""
	})

	// Idle: over two election TTLs (the registry leases' TTL, so without
	// keepalives both keys would be gone) the revision stands still while
	// both overviews keep asking each other.
	before := a.rev()
	start := time.Now()
	for time.Since(start) < 2*2*time.Second {
		if len(a.srv.Store().Replicas()) != 2 {
			t.Fatalf("a registration lapsed while idle: %+v", a.srv.Store().Replicas())
		}
		_ = overviewRows(t, a.base)
		_ = overviewRows(t, b.base)
		time.Sleep(200 * time.Millisecond) // pacing of the idle window's probes
	}
	if after := a.rev(); after != before {
		t.Fatalf("two idle replicas moved the etcd revision %d -> %d", before, after)
	}

	b.stop()
	// A graceful stop revokes the lease at once; the view and the overview
	// follow without waiting for a TTL.
	pollUntil(t, "A's overview drops B", func() bool {
		_, ok := overviewRows(t, a.base)["replica-b"]
		return !ok && len(a.srv.Store().Replicas()) == 1
	})
}

// A registered replica that does not answer is shown unreachable, never
// with a cursor; one that answers is asked without any credential.
func TestReplicaPeersUnreachableAndNoCredentials(t *testing.T) {
	a := startAPI(t, func(c *Config) { c.ReplicaID = "replica-a" })

	var mu sync.Mutex
	var seen []http.Header
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(handlers.Ready{Status: "ready", Replica: handlers.StatusReplica{ID: "replica-p", Cursor: 987654, Lag: 5}})
	}))
	defer peer.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String()
	ln.Close()

	register := func(id, u string) func() {
		reg, err := store.NewReplicaRegistration(a.etcd, a.srv.cfg.Prefix, store.ReplicaInfo{ID: id, URL: u, StartedAt: time.Now()}, time.Second, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = reg.Run(ctx) }()
		stop := func() { cancel(); <-done }
		t.Cleanup(stop)
		return stop
	}
	register("replica-p", peer.URL)
	stopGhost := register("replica-ghost", closed)

	var rows map[string]string
	pollUntil(t, "the overview shows the peer's cursor and the ghost unreachable", func() bool {
		rows = overviewRows(t, a.base)
		return cursorIn(rows["replica-p"], "replica-p") == "987654" &&
			regexp.MustCompile(`unreachable`).MatchString(rows["replica-ghost"])
	})
	if cursorIn(rows["replica-ghost"], "replica-ghost") != "" || regexp.MustCompile(`data-lag=`).MatchString(rows["replica-ghost"]) {
		t.Errorf("the unreachable replica shows a cursor or lag: %s", rows["replica-ghost"])
	}
	mu.Lock()
	for _, h := range seen {
		if h.Get("Authorization") != "" || h.Get("Cookie") != "" {
			t.Errorf("a replica sent a credential to another: %v", h)
		}
	}
	n := len(seen)
	mu.Unlock()
	if n == 0 {
		t.Fatal("the peer was never asked")
	}

	stopGhost()
	pollUntil(t, "the stopped ghost leaves the overview", func() bool {
		_, ok := overviewRows(t, a.base)["replica-ghost"]
		return !ok
	})
}
