package server

import (
	"context"
	"testing"
	"time"

	"jobfence/handlers"
	"jobfence/internal/etcdtest"
	"jobfence/internal/store"
)

type leaderTerm struct {
	l     store.Leadership
	ended chan struct{}
}

// recordTerms is an OnLeader hook that reports each term and its end.
func recordTerms(terms chan<- leaderTerm) func(context.Context, store.Leadership) error {
	return func(ctx context.Context, l store.Leadership) error {
		t := leaderTerm{l: l, ended: make(chan struct{})}
		terms <- t
		<-ctx.Done()
		close(t.ended)
		return nil
	}
}

func waitTerm(t *testing.T, terms <-chan leaderTerm) leaderTerm {
	t.Helper()
	select {
	case tm := <-terms:
		return tm
	case <-time.After(30 * time.Second):
		t.Fatal("no leadership term began")
	}
	return leaderTerm{}
}

// The OnLeader seam runs only on the elected replica; a follower's status
// names the leader; a stopping leader ends its term and resigns, and the
// other replica takes over with a newer election revision.
func TestLeadershipMovesOnShutdown(t *testing.T) {
	prefix := etcdtest.Prefix(t)
	terms1, terms2 := make(chan leaderTerm, 4), make(chan leaderTerm, 4)
	h1 := startAPI(t, func(c *Config) { c.Prefix, c.ReplicaID, c.OnLeader = prefix, "r1", recordTerms(terms1) })
	t1 := waitTerm(t, terms1)
	if t1.l.ID != "r1" || t1.l.Rev == 0 {
		t.Fatalf("first term %+v", t1.l)
	}
	h2 := startAPI(t, func(c *Config) { c.Prefix, c.ReplicaID, c.OnLeader = prefix, "r2", recordTerms(terms2) })
	var st struct {
		Leader struct {
			ID               string `json:"id"`
			ElectionRevision int64  `json:"election_revision"`
		} `json:"leader"`
		Replica struct {
			ID string `json:"id"`
		} `json:"replica"`
	}
	h2.do("GET", "/v1/status", handlers.RoleViewer, nil).decode(t, &st)
	if st.Leader.ID != "r1" || st.Leader.ElectionRevision != t1.l.Rev || st.Replica.ID != "r2" {
		t.Errorf("follower status %+v", st)
	}
	if _, leading := h2.srv.Leadership(); leading {
		t.Fatal("both replicas lead")
	}
	select {
	case tm := <-terms2:
		t.Fatalf("the follower ran the leader hook: %+v", tm.l)
	default:
	}

	h1.stop()
	select {
	case <-t1.ended:
	default:
		t.Error("the first term's context was still live after its server stopped")
	}
	t2 := waitTerm(t, terms2)
	if t2.l.ID != "r2" || t2.l.Rev <= t1.l.Rev {
		t.Errorf("second term %+v after %+v", t2.l, t1.l)
	}
	h2.do("GET", "/v1/status", handlers.RoleViewer, nil).decode(t, &st)
	if st.Leader.ID != "r2" {
		t.Errorf("status after failover names %q", st.Leader.ID)
	}
}
