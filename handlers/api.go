// Package handlers is jobfence's JSON REST API: chi routes, bearer-token
// authentication with nested roles, strict request decoding and one adapter
// that turns every handler error into RFC 9457 problem+json (internal/problem).
// Handlers follow one shape: authenticate, decode, validate, one store call,
// encode with an explicit status. They never build etcd operations.
package handlers

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-json-experiment/json"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"jobfence/internal/metrics"
	"jobfence/internal/problem"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// LeaderInfo is what this replica knows about the current leader.
type LeaderInfo struct {
	ID               string
	Since            time.Time
	ElectionRevision int64
}

// Config wires an API. Store and Auth are required; a nil Logger discards.
type Config struct {
	Store    *store.Store
	Auth     *Auth
	Logger   *slog.Logger
	Defaults jobs.Defaults
	// ReplicaID names this replica in /v1/status.
	ReplicaID string
	// Leader reports the elected leader; nil or a zero ID means none is known.
	Leader func() LeaderInfo
	// Ready adds a readiness check to /readyz beyond the read model's first
	// list (the server passes an etcd round trip). nil means none.
	Ready func(ctx context.Context) error
	// OpenAPI is served at /openapi.yaml.
	OpenAPI []byte
	// Registry receives the API's metrics and is served at /metrics; nil
	// creates a private one.
	Registry *prometheus.Registry
	// Web, when set, serves every path outside /v1 and the operational
	// endpoints (the dashboard at /).
	Web http.Handler
	// Events, when set, serves GET /v1/events instead of the API's own
	// bearer-only stream (the dashboard's also accepts its session cookie).
	Events http.Handler
	// Admissions counts every authorized POST /v1/jobs by outcome; nil
	// counts nothing. *metrics.Server is one.
	Admissions AdmissionRecorder
}

// AdmissionRecorder receives one outcome label (a metrics.Admission* value)
// per submission.
type AdmissionRecorder interface {
	AdmissionOutcome(outcome string)
}

// API serves the REST routes. Build it with New.
type API struct {
	Store    *store.Store
	Auth     *Auth
	Logger   *slog.Logger
	Defaults jobs.Defaults
	// Web is mounted at / when set (see Config.Web).
	Web http.Handler
	// Events replaces the API's own /v1/events stream when set.
	Events http.Handler

	replicaID  string
	leader     func() LeaderInfo
	ready      func(ctx context.Context) error
	openAPI    []byte
	registry   *prometheus.Registry
	requests   *prometheus.CounterVec
	admissions AdmissionRecorder

	// streams is closed by CloseStreams so long-lived event streams end
	// before graceful shutdown waits for in-flight requests.
	streams     chan struct{}
	streamsOnce sync.Once

	root chi.Router
}

// New builds an API from cfg.
func New(cfg Config) *API {
	lg := cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "jobfence_http_requests_total",
		Help: "HTTP requests answered, by route pattern and status code.",
	}, []string{"route", "code"})
	if err := reg.Register(requests); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			requests = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	a := &API{
		Store:      cfg.Store,
		Auth:       cfg.Auth,
		Logger:     lg,
		Defaults:   cfg.Defaults,
		Web:        cfg.Web,
		Events:     cfg.Events,
		replicaID:  cfg.ReplicaID,
		leader:     cfg.Leader,
		ready:      cfg.Ready,
		openAPI:    cfg.OpenAPI,
		registry:   reg,
		requests:   requests,
		admissions: cfg.Admissions,
		streams:    make(chan struct{}),
	}
	return a
}

// LeaderInfo is what /v1/status shows as the leader.
func (a *API) LeaderInfo() LeaderInfo {
	if a.leader == nil {
		return LeaderInfo{}
	}
	return a.leader()
}

// ReplicaID names this replica.
func (a *API) ReplicaID() string { return a.replicaID }

// CloseStreams ends every open event stream; the server calls it when
// shutdown starts, because http.Server.Shutdown does not cancel them.
func (a *API) CloseStreams() {
	a.streamsOnce.Do(func() { close(a.streams) })
}

// HandlerFunc is the shape of every API handler: it writes a success answer
// itself and returns an error for everything else.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle adapts h to net/http, rendering its error as problem+json.
func (a *API) Handle(h HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			a.WriteError(w, r, err)
		}
	}
}

// WriteError renders err through the problem table. Errors the table does
// not know are logged with the request id and answered as "internal".
func (a *API) WriteError(w http.ResponseWriter, r *http.Request, err error) {
	p, internal := problem.From(err)
	p.Instance = r.URL.Path
	p.RequestID = w.Header().Get("X-Request-Id")
	if internal {
		a.Logger.ErrorContext(r.Context(), "request_failed",
			"request_id", p.RequestID, "method", r.Method, "path", r.URL.Path, "err", err.Error())
	}
	problem.Write(w, p, err)
}

// WriteJSON encodes v with an explicit status.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	body, err := json.Marshal(v, json.Deterministic(true))
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// A failed write cannot become a problem answer: the status is on the wire.
	_, _ = w.Write(body)
	return nil
}

type ctxKey int

const principalKey ctxKey = 1

// PrincipalFrom returns the authenticated caller that Require stored.
func PrincipalFrom(ctx context.Context) (Principal, bool) {
	p, ok := ctx.Value(principalKey).(Principal)
	return p, ok
}

// Require authenticates the request and checks the role before h runs.
// Agent endpoints pass RoleAgent, which no other role satisfies.
func (a *API) Require(role Role, h HandlerFunc) HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		p, err := a.Auth.FromRequest(r)
		if err != nil {
			return err
		}
		if !p.Allows(role) {
			return problem.ErrForbidden
		}
		return h(w, r.WithContext(context.WithValue(r.Context(), principalKey, p)))
	}
}

// requestID stamps every answer, problem or not, with a fresh id.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", uuid.NewString())
		next.ServeHTTP(w, r)
	})
}

// statusWriter remembers the status for metrics and the access log.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and SetWriteDeadline.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (a *API) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				a.Logger.ErrorContext(r.Context(), "handler_panic",
					"request_id", w.Header().Get("X-Request-Id"), "path", r.URL.Path, "panic", v)
				if sw.status == 0 {
					a.WriteError(sw, r, errors.New("panic"))
				}
			}
			route := "unmatched"
			if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
				route = rc.RoutePattern()
			}
			code := sw.status
			if code == 0 {
				code = http.StatusOK
			}
			a.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
			if a.Logger.Enabled(r.Context(), slog.LevelDebug) {
				a.Logger.DebugContext(r.Context(), "http_request",
					"request_id", w.Header().Get("X-Request-Id"), "method", r.Method, "route", route,
					"status", code, "duration_ms", time.Since(start).Milliseconds())
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// countAdmission records the outcome of one submission. Requests refused
// before the submitter role was proven are not submissions and are not
// counted; a 200 is a replay of an earlier admission.
func (a *API) countAdmission(h HandlerFunc) HandlerFunc {
	if a.admissions == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		sw := &statusWriter{ResponseWriter: w}
		err := h(sw, r)
		var outcome string
		switch {
		case err == nil && sw.status == http.StatusOK:
			outcome = metrics.AdmissionReplayed
		case err == nil:
			outcome = metrics.AdmissionAdmitted
		case errors.Is(err, problem.ErrUnauthenticated) || errors.Is(err, problem.ErrForbidden):
			return err
		default:
			outcome = metrics.AdmissionOutcomeOf(err)
			if outcome == metrics.AdmissionError && badInput(err) {
				outcome = metrics.AdmissionInvalid
			}
		}
		a.admissions.AdmissionOutcome(outcome)
		return err
	}
}

// badInput reports whether err rejected the request body or headers
// (400, 413, 415, 422) rather than failing inside the server.
func badInput(err error) bool {
	p, internal := problem.From(err)
	if internal {
		return false
	}
	switch p.Status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		return true
	}
	return false
}
