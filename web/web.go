package web

import (
	"context"
	"embed"
	"errors"
	"io/fs"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/a-h/templ"
	"github.com/go-chi/chi/v5"

	"jobfence/internal/store"
	"jobfence/jobs"
)

//go:embed static
var staticFiles embed.FS

// Store is what the dashboard reads and the two writes it makes.
// *store.Store implements it; the dashboard never reaches etcd any other way.
type Store interface {
	Fences() []store.Fence
	Slots() []store.Slot
	Agents() []store.AgentView
	List(ctx context.Context, f store.ListFilter) ([]*jobs.Job, string, error)
	Get(ctx context.Context, id string) (*jobs.Job, error)
	Counts() map[jobs.State]int
	QuotaUse() (global int, perScope map[string]int)
	Settings() store.Settings
	SetAdmissionOpen(ctx context.Context, open bool) error
	SetDispatchPaused(ctx context.Context, paused bool) error
	Cursor() store.Cursor
	Subscribe() (<-chan store.Change, func())
	ForceRelease(ctx context.Context, id, actor, note string) (*jobs.Job, error)
}

// Replica is another replica's read-model position, for the overview.
type Replica struct {
	ID     string
	Cursor int64
	Lag    int64
	// Unreachable: the replica is registered but gave no cursor (Cursor and
	// Lag are then meaningless); Detail says why in words.
	Unreachable bool
	Detail      string
}

// Config wires a Dashboard. Store and Authenticate are required.
type Config struct {
	// Store is the replica's store (*store.Store).
	Store Store
	// Authenticate maps a token to its subject and role ("viewer",
	// "submitter", "operator" or "agent"); agent tokens cannot sign in.
	Authenticate func(token string) (subject, role string, ok bool)
	// Leader reports the elected leader; an empty id means none is known.
	Leader func() (id string, since time.Time, electionRevision int64)
	// ReplicaID names this replica on the overview.
	ReplicaID string
	// Replicas lists the other registered replicas with their cursors (or
	// why there is none); nil shows this replica only. It is called on every
	// overview render, so it should answer from a cache.
	Replicas func() []Replica
	// QuotaGlobal and QuotaPerScope are shown beside quota use; 0 hides them.
	QuotaGlobal   int
	QuotaPerScope int
	// PageSize is the number of jobs per /jobs page (default 50, at most 500).
	PageSize int
	// SessionTTL bounds a session (default 12h). The role is fixed at sign-in,
	// so this is also how long a revoked token's session survives.
	SessionTTL time.Duration
	// KeepAlive is the event stream's comment interval (default 15s).
	KeepAlive time.Duration
	// MaxStream bounds one event stream; EventSource reconnects (default 30m).
	MaxStream time.Duration
	// WriteTimeout bounds each write on the event stream (default 10s).
	WriteTimeout time.Duration
	Logger       *slog.Logger
	Now          func() time.Time
}

// Validate returns every problem with cfg at once.
func (c Config) Validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("web: Store is required"))
	}
	if c.Authenticate == nil {
		errs = append(errs, errors.New("web: Authenticate is required"))
	}
	if c.PageSize < 0 || c.PageSize > 500 {
		errs = append(errs, errors.New("web: PageSize must be between 1 and 500"))
	}
	if c.SessionTTL < 0 || c.KeepAlive < 0 || c.MaxStream < 0 || c.WriteTimeout < 0 {
		errs = append(errs, errors.New("web: durations must not be negative"))
	}
	return errors.Join(errs...)
}

// Dashboard serves the operator pages, their static files, the login and
// /v1/events. It is an http.Handler.
type Dashboard struct {
	cfg      Config
	log      *slog.Logger
	now      func() time.Time
	sessions *sessions
	router   http.Handler

	streams     chan struct{}
	streamsOnce sync.Once
}

// New builds the dashboard. It panics on an invalid Config, as a wiring
// mistake cannot be served around; call Config.Validate first to report it.
func New(cfg Config) *Dashboard {
	if err := cfg.Validate(); err != nil {
		panic(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = 50
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = 15 * time.Second
	}
	if cfg.MaxStream == 0 {
		cfg.MaxStream = 30 * time.Minute
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	d := &Dashboard{
		cfg:      cfg,
		log:      cfg.Logger,
		now:      cfg.Now,
		sessions: newSessions(cfg.SessionTTL, cfg.Now),
		streams:  make(chan struct{}),
	}
	d.router = d.routes()
	return d
}

// ServeHTTP implements http.Handler.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.router.ServeHTTP(w, r)
}

// CloseStreams ends every open event stream; call it when shutdown starts,
// because http.Server.Shutdown does not cancel streaming requests.
func (d *Dashboard) CloseStreams() {
	d.streamsOnce.Do(func() { close(d.streams) })
}

// SessionFromRequest reports the dashboard session a request carries, so a
// JSON route mounted elsewhere (GET /v1/events) can accept it like a token.
func (d *Dashboard) SessionFromRequest(r *http.Request) (subject, role string, ok bool) {
	s := d.sessions.fromRequest(r)
	if s == nil {
		return "", "", false
	}
	return s.subject, s.role, true
}

// Events is the /v1/events handler alone, for a router that mounts it itself.
func (d *Dashboard) Events() http.Handler { return http.HandlerFunc(d.events) }

func (d *Dashboard) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(securityHeaders)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		d.errorPage(w, r, http.StatusNotFound, "There is no such page.")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		d.errorPage(w, r, http.StatusMethodNotAllowed, "This page does not accept that method.")
	})

	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err)
	}
	r.Handle("/static/*", http.StripPrefix("/static/", http.FileServerFS(static)))

	r.Get("/login", d.loginForm)
	r.Post("/login", d.login)
	r.Get("/logout", d.logoutForm)
	r.Post("/logout", d.write(roleViewer, d.logout))
	r.Get("/v1/events", d.events)

	r.Get("/", d.page(roleViewer, d.overview))
	r.Get("/fences", d.page(roleViewer, d.fences))
	r.Get("/agents", d.page(roleViewer, d.agents))
	r.Get("/jobs", d.page(roleViewer, d.jobsList))
	r.Get("/jobs/{id}", d.page(roleViewer, d.job))
	r.Get("/jobs/{id}/force-release", d.page(roleOperator, d.releaseForm))
	r.Post("/jobs/{id}/force-release", d.write(roleOperator, d.forceRelease))
	r.Post("/settings/admission", d.write(roleOperator, d.setAdmission))
	r.Post("/settings/dispatch", d.write(roleOperator, d.setDispatch))

	// Cross-origin writes are refused before any handler sees them, on top of
	// SameSite=Strict and the per-session CSRF token.
	return http.NewCrossOriginProtection().Handler(r)
}

// securityHeaders keeps pages from being framed or from loading anything
// that is not ours.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		next.ServeHTTP(w, r)
	})
}

// render writes a page with its status; a failure after the status is on the
// wire can only be logged.
func (d *Dashboard) render(w http.ResponseWriter, r *http.Request, status int, c templ.Component) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := c.Render(r.Context(), w); err != nil {
		d.log.WarnContext(r.Context(), "web_render_failed", "path", r.URL.Path, "err", err.Error())
	}
}

func (d *Dashboard) errorPage(w http.ResponseWriter, r *http.Request, status int, msg string) {
	var u *User
	if s := d.sessions.fromRequest(r); s != nil {
		u = s.user()
	}
	d.render(w, r, status, ErrorPage(ErrorView{
		Page:    Page{Title: http.StatusText(status), User: u},
		Status:  status,
		Message: msg,
	}))
}
