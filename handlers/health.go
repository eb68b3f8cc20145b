package handlers

import (
	"context"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"jobfence/internal/problem"
)

type health struct {
	Status string `json:"status"`
}

// Ready is the body of a 200 from /readyz. The replica's cursor is there so
// the other replicas can show it on their overview without a credential:
// revisions are not secrets, and no token travels between replicas.
type Ready struct {
	Status  string        `json:"status"`
	Replica StatusReplica `json:"replica"`
}

// healthz says only that the process serves HTTP.
func (a *API) healthz(w http.ResponseWriter, r *http.Request) error {
	return WriteJSON(w, http.StatusOK, health{Status: "ok"})
}

// readyz: the read model finished its first list and etcd answers.
func (a *API) readyz(w http.ResponseWriter, r *http.Request) error {
	if !a.Store.Ready() {
		return &problem.NotReadyError{What: "the read model"}
	}
	if a.ready != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.ready(ctx); err != nil {
			a.Logger.WarnContext(r.Context(), "readiness_check_failed", "err", err.Error())
			return &problem.NotReadyError{What: "etcd"}
		}
	}
	cur := a.Store.Cursor()
	return WriteJSON(w, http.StatusOK, Ready{Status: "ready", Replica: StatusReplica{ID: a.replicaID, Cursor: cur.Revision, Lag: cur.Lag}})
}

func (a *API) openapi(w http.ResponseWriter, r *http.Request) error {
	if len(a.openAPI) == 0 {
		return problem.ErrNotFound
	}
	w.Header().Set("Content-Type", "application/yaml")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(a.openAPI)
	return nil
}

func (a *API) metrics() http.Handler {
	return promhttp.HandlerFor(a.registry, promhttp.HandlerOpts{})
}
