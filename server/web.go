package server

import (
	"net/http"
	"time"

	"jobfence/handlers"
	"jobfence/web"
)

// dashboard builds the operator pages on the API's store, tokens and leader
// view, so the JSON API and the pages cannot disagree about who may do what.
func dashboard(cfg Config, api *handlers.API) *web.Dashboard {
	return web.New(web.Config{
		Store: api.Store,
		Authenticate: func(token string) (string, string, bool) {
			p, ok := api.Auth.Authenticate(token)
			return p.Subject, string(p.Role), ok
		},
		Leader: func() (string, time.Time, int64) {
			li := api.LeaderInfo()
			return li.ID, li.Since, li.ElectionRevision
		},
		ReplicaID:     cfg.ReplicaID,
		QuotaGlobal:   cfg.QuotaGlobal,
		QuotaPerScope: cfg.QuotaPerScope,
		Logger:        cfg.Logger.With("component", "web"),
		Now:           cfg.Now,
	})
}

var _ http.Handler = (*web.Dashboard)(nil)
