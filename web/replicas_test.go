package web

import (
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// withPeers gives the overview two other replicas: one that answered with
// its cursor and one that did not.
func withPeers(c *Config) {
	c.Replicas = func() []Replica {
		return []Replica{
			{ID: "replica-b", Cursor: 4711, Lag: 3},
			{ID: "replica-c", Unreachable: true, Detail: "did not answer"},
			// The server's list may include this replica; it is shown once.
			{ID: "replica-test", Cursor: 1, Lag: 99},
		}
	}
}

// The overview has one row per replica: this one with its own cursor and
// the markers, the others with theirs, and one that did not answer as
// unreachable rather than as a cursor or a lag of 0.
func TestOverviewListsEveryReplica(t *testing.T) {
	h := newHarness(t, withPeers)
	c := h.client()
	c.login(viewerToken)
	res, body := c.get("/")
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET /: %d", res.StatusCode)
	}
	rows := regexp.MustCompile(`(?s)<tr data-replica="([^"]+)">(.*?)</tr>`).FindAllStringSubmatch(body, -1)
	var ids []string
	byID := map[string]string{}
	for _, r := range rows {
		ids = append(ids, r[1])
		byID[r[1]] = r[2]
	}
	if strings.Join(ids, ",") != "replica-b,replica-c,replica-test" {
		t.Fatalf("replica rows %v, want replica-b, replica-c, replica-test in id order", ids)
	}
	self := byID["replica-test"]
	if !strings.Contains(self, "(this replica)") || !strings.Contains(self, ">leader<") {
		t.Errorf("this replica's row lacks its markers: %s", self)
	}
	if strings.Contains(self, `data-cursor="replica-test">1<`) || strings.Contains(self, ">99<") {
		t.Errorf("this replica's row shows the list's entry, not its own cursor: %s", self)
	}
	b := byID["replica-b"]
	if !strings.Contains(b, `data-cursor="replica-b">4711<`) || !strings.Contains(b, `data-lag="replica-b">3<`) ||
		strings.Contains(b, "this replica") || strings.Contains(b, ">leader<") {
		t.Errorf("replica-b's row: %s", b)
	}
	cRow := byID["replica-c"]
	if !strings.Contains(cRow, "unreachable") || !strings.Contains(cRow, "did not answer") ||
		strings.Contains(cRow, "data-cursor") || strings.Contains(cRow, "data-lag") {
		t.Errorf("replica-c's row must say unreachable and show no cursor or lag: %s", cRow)
	}
}

// Without a replica list the overview shows this replica alone.
func TestOverviewWithoutRegistry(t *testing.T) {
	h := newHarness(t)
	c := h.client()
	c.login(viewerToken)
	_, body := c.get("/")
	if n := strings.Count(body, "<tr data-replica="); n != 1 || !strings.Contains(body, `<tr data-replica="replica-test">`) {
		t.Fatalf("%d replica rows without a registry, want this replica's only", n)
	}
}
