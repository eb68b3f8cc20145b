package server

import (
	"context"
	"net/http"
	"testing"
	"time"

	"jobfence/handlers"
)

// Must-show 10, HTTP side: an undecodable unresolved record makes every
// admission answer 503 admission-fail-closed (naming it, writing nothing)
// until an operator force-releases it.
func TestAPIAdmissionFailsClosedUntilForceRelease(t *testing.T) {
	h := startAPI(t, nil)
	h.admit("healthy/before")
	const corruptID = "0193a0c0-dead-7000-8000-00000000beef"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A record no decoder can read, planted the way a bad write or a
	// foreign tool would leave it (the key layout is internal/store/keys.go's).
	put, err := h.etcd.Put(ctx, h.srv.cfg.Prefix+"/jobs/"+corruptID, `{"id":"`+corruptID+`","state":`)
	if err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the read model to see the planted record", func() bool {
		var st struct {
			Replica struct {
				Cursor int64 `json:"cursor"`
			} `json:"replica"`
		}
		h.do("GET", "/v1/status", handlers.RoleViewer, nil).decode(t, &st)
		return st.Replica.Cursor >= put.Header.Revision
	})
	before := h.rev()
	for _, target := range []string{"healthy/other", "elsewhere/x"} {
		r := h.do("POST", "/v1/jobs", handlers.RoleSubmitter, jobBody(target))
		slug, p := r.problem(t)
		if r.status != http.StatusServiceUnavailable || slug != "admission-fail-closed" || p["job_id"] != corruptID {
			t.Fatalf("admission of %s: %d %s", target, r.status, r.body)
		}
	}
	if after := h.rev(); after != before {
		t.Errorf("a refused admission wrote: %d -> %d", before, after)
	}
	if r := h.do("POST", "/v1/jobs/"+corruptID+"/force-release", handlers.RoleSubmitter, `{"note":"x"}`); r.status != http.StatusForbidden {
		t.Errorf("submitter force release: %d", r.status)
	}
	fr := h.do("POST", "/v1/jobs/"+corruptID+"/force-release", handlers.RoleOperator, `{"note":"record truncated by a disk incident; target checked by hand"}`)
	if fr.status != http.StatusOK {
		t.Fatalf("force release of the corrupt record: %d %s", fr.status, fr.body)
	}
	h.admit("healthy/other")
}
