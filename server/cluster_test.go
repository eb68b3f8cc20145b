package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/jobs"
)

// Must-show 4: three `jobfence server` processes whose embedded etcd members
// form one cluster. The jobfence leader is killed with SIGKILL; the two
// others keep admitting, a survivor takes leadership, and its dispatcher
// sends the new job to the agent, which runs it to COMMITTED.
func testThreeNodeCluster(t *testing.T, bin string) {
	o := newOps(t, bin, nil)
	names := []string{"n1", "n2", "n3"}
	peers := map[string]string{}
	var initial []string
	for _, n := range names {
		peers[n] = "http://" + freeAddr(t)
		initial = append(initial, n+"="+peers[n])
	}
	cluster := strings.Join(initial, ",")

	// Every member waits for a quorum before its server starts, so all three
	// are launched before any is awaited.
	procs := map[string]*opsProc{}
	for _, n := range names {
		procs[n] = o.launchServer(n, nil, "--etcd-name", n, "--etcd-peer-url", peers[n],
			"--etcd-client-url", "http://"+freeAddr(t), "--etcd-initial-cluster", cluster,
			"--etcd-initial-cluster-state", "new")
	}
	for _, n := range names {
		o.awaitServer(procs[n])
	}

	// One cluster: a job admitted at n1 is visible, fenced, at n3.
	first := o.submit(procs["n1"].base, opsJob("cluster/first", "exit 0"))
	o.waitFor("n3 sees the job admitted at n1", 30*time.Second, func() bool { return o.job(procs["n3"].base, first) != nil })

	leader := ""
	o.waitFor("a leader is elected", 30*time.Second, func() bool {
		leader = o.leaderAt(procs["n2"].base)
		return procs[leader] != nil
	})
	var survivors []string
	for _, n := range names {
		if n != leader {
			survivors = append(survivors, n)
		}
	}
	// The agent reports to a survivor so the kill leaves its path intact.
	home := procs[survivors[0]].base
	o.startAgent("agent-c", home, freeAddr(t), home)
	o.waitState(home, first, jobs.Committed)

	procs[leader].kill()

	// Admissions continue on both survivors. Losing a member may cost a
	// raft election, so a 5xx is retried under the same Idempotency-Key:
	// a retry can never admit twice.
	var admitted []string
	for i, n := range survivors {
		base := procs[n].base
		body := opsJob(fmt.Sprintf("cluster/after-kill-%d", i), "exit 0")
		key := fmt.Sprintf("after-kill-%d", i)
		var id string
		o.waitFor("admission at "+n+" after the kill", 60*time.Second, func() bool {
			st, raw := o.callAt(base, "POST", "/v1/jobs", opsTokens[handlers.RoleSubmitter], body, "Idempotency-Key", key)
			switch {
			case st == http.StatusCreated || st == http.StatusOK:
				var j struct {
					ID string `json:"id"`
				}
				_ = json.Unmarshal(raw, &j)
				id = j.ID
				return true
			case st == 0 || st >= 500:
				return false
			}
			t.Fatalf("admission at %s after the kill: %d %s", n, st, raw)
			return false
		})
		admitted = append(admitted, id)
	}

	newLeader := ""
	o.waitFor("a survivor leads", 30*time.Second, func() bool {
		newLeader = o.leaderAt(home)
		return newLeader != "" && newLeader != leader
	})
	for _, id := range admitted {
		j := o.waitState(home, id, jobs.Committed)
		if j.Dispatch == nil || j.Dispatch.AgentID != "agent-c" {
			t.Errorf("job %s dispatch %+v", id, j.Dispatch)
		}
		if actor := historyActor(j, jobs.EventMarkRunning); actor != "dispatcher@"+newLeader {
			t.Errorf("job %s was marked running by %q, want the new leader %s", id, actor, newLeader)
		}
	}
	// Both survivors answer from the same cluster state.
	for _, n := range survivors {
		for _, id := range admitted {
			if j := o.job(procs[n].base, id); j == nil || j.State != jobs.Committed {
				o.waitFor(n+" sees "+id+" committed", 30*time.Second, func() bool {
					j := o.job(procs[n].base, id)
					return j != nil && j.State == jobs.Committed
				})
			}
		}
	}
}

// leaderAt is the leader's replica id as base's /v1/status shows it.
func (o *ops) leaderAt(base string) string {
	st, raw := o.callAt(base, "GET", "/v1/status", opsTokens[handlers.RoleViewer], nil)
	if st != http.StatusOK {
		return ""
	}
	var s struct {
		Leader struct {
			ID string `json:"id"`
		} `json:"leader"`
	}
	_ = json.Unmarshal(raw, &s)
	return s.Leader.ID
}

func historyActor(j *jobs.Job, e jobs.Event) string {
	for _, h := range j.History {
		if h.Event == e {
			return h.Actor
		}
	}
	return ""
}

// The cluster flags configure the embedded member only, and only coherently.
func TestClusterConfigValidation(t *testing.T) {
	base := func() Config {
		c := Config{TokensFile: "/t.json"}
		c.ApplyDefaults()
		return c
	}
	ok := base()
	ok.EtcdName, ok.EtcdPeerURL, ok.EtcdClientURL = "n1", "http://127.0.0.1:2380", "http://127.0.0.1:2379"
	ok.EtcdInitialCluster = "n1=http://127.0.0.1:2380,n2=http://127.0.0.1:2381"
	ok.EtcdClusterState = "existing"
	ok.TLSCert, ok.TLSKey = "/c.pem", "/k.pem"
	if err := ok.Validate(); err != nil {
		t.Fatalf("a coherent member: %v", err)
	}
	cases := map[string]func(*Config){
		"etcd-endpoints":             func(c *Config) { c.EtcdEndpoints = []string{"http://127.0.0.1:2379"} },
		"etcd-peer-url":              func(c *Config) { c.EtcdPeerURL = "127.0.0.1:2380" },
		"must list this member":      func(c *Config) { c.EtcdInitialCluster = "n2=http://127.0.0.1:2381" },
		"needs etcd-name":            func(c *Config) { c.EtcdName = "" },
		"etcd-initial-cluster-state": func(c *Config) { c.EtcdClusterState = "joining" },
		"tls-cert and tls-key":       func(c *Config) { c.TLSKey = "" },
	}
	for want, mutate := range cases {
		c := ok
		mutate(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}
