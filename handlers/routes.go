package handlers

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"jobfence/internal/problem"
)

// Routes is every route jobfence serves; openapi.yaml describes exactly
// these (routes_test.go walks the router against it both ways).
func (a *API) Routes() chi.Router {
	r := chi.NewRouter()
	a.root = r
	r.Use(requestID, a.observe, limitBody)
	notFound := a.Handle(func(http.ResponseWriter, *http.Request) error { return problem.ErrNotFound })
	// The dashboard gets every path the API does not know. It is the root's
	// not-found handler rather than a catch-all route, so a wrong method on
	// an API path stays a problem+json 405 instead of reaching the pages.
	if a.Web != nil {
		r.NotFound(a.Web.ServeHTTP)
	} else {
		r.NotFound(notFound)
	}
	r.MethodNotAllowed(a.Handle(a.methodNotAllowed))

	r.Get("/healthz", a.Handle(a.healthz))
	r.Get("/readyz", a.Handle(a.readyz))
	r.Get("/openapi.yaml", a.Handle(a.openapi))
	r.Method(http.MethodGet, "/metrics", a.metrics())

	r.Route("/v1", func(r chi.Router) {
		r.NotFound(notFound)
		r.Post("/jobs", a.Handle(a.countAdmission(a.Require(RoleSubmitter, a.admitJob))))
		r.Get("/jobs", a.Handle(a.Require(RoleViewer, a.listJobs)))
		r.Get("/jobs/{id}", a.Handle(a.Require(RoleViewer, a.getJob)))
		r.Post("/jobs/{id}/cancel", a.Handle(a.Require(RoleSubmitter, a.cancelJob)))
		r.Post("/jobs/{id}/force-release", a.Handle(a.Require(RoleOperator, a.forceRelease)))
		r.Post("/jobs/{id}/result", a.Handle(a.Require(RoleAgent, a.postResult)))

		r.Get("/fences", a.Handle(a.Require(RoleViewer, a.listFences)))
		r.Get("/agents", a.Handle(a.Require(RoleViewer, a.listAgents)))
		r.Put("/agents/{id}", a.Handle(a.Require(RoleAgent, a.putAgent)))
		r.Get("/slots", a.Handle(a.Require(RoleViewer, a.listSlots)))
		r.Get("/status", a.Handle(a.Require(RoleViewer, a.status)))
		if a.Events != nil {
			r.Method(http.MethodGet, "/events", a.Events)
		} else {
			r.Get("/events", a.Handle(a.Require(RoleViewer, a.events)))
		}

		r.Put("/settings/admission", a.Handle(a.Require(RoleOperator, a.putAdmission)))
		r.Put("/settings/dispatch", a.Handle(a.Require(RoleOperator, a.putDispatch)))
	})
	return r
}

var methods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions,
}

// methodNotAllowed answers 405 with the methods the path does serve, found
// by asking the router, because chi keeps its own list private.
func (a *API) methodNotAllowed(w http.ResponseWriter, r *http.Request) error {
	var allow []string
	for _, m := range methods {
		if a.root != nil && a.root.Match(chi.NewRouteContext(), m, r.URL.Path) {
			allow = append(allow, m)
		}
	}
	return &problem.MethodNotAllowedError{Allow: allow}
}
