package web

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// cookieName holds only a random session id: the token never leaves the
// login request.
const cookieName = "jobfence_session"

// maxSessions bounds memory against a flood of sign-ins.
const maxSessions = 10000

// maxFormBytes bounds every form body the dashboard reads.
const maxFormBytes = 16 << 10

type role int

const (
	roleNone role = iota
	roleViewer
	roleSubmitter
	roleOperator
)

func parseRole(s string) role {
	switch s {
	case "viewer":
		return roleViewer
	case "submitter":
		return roleSubmitter
	case "operator":
		return roleOperator
	}
	// Agent tokens and anything unknown cannot use the dashboard.
	return roleNone
}

type session struct {
	id      string
	subject string
	role    string
	rank    role
	csrf    string
	expires time.Time
}

func (s *session) user() *User {
	return &User{Subject: s.subject, Role: s.role, CSRF: s.csrf, CanOperate: s.rank >= roleOperator}
}

type sessions struct {
	mu  sync.Mutex
	m   map[string]*session
	ttl time.Duration
	now func() time.Time
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{m: map[string]*session{}, ttl: ttl, now: now}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (ss *sessions) create(subject, roleName string) *session {
	now := ss.now()
	s := &session{
		id:      randomToken(),
		subject: subject,
		role:    roleName,
		rank:    parseRole(roleName),
		csrf:    randomToken(),
		expires: now.Add(ss.ttl),
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.m) >= maxSessions {
		var oldest *session
		for id, o := range ss.m {
			if !now.Before(o.expires) {
				delete(ss.m, id)
				continue
			}
			if oldest == nil || o.expires.Before(oldest.expires) {
				oldest = o
			}
		}
		if len(ss.m) >= maxSessions && oldest != nil {
			delete(ss.m, oldest.id)
		}
	}
	ss.m[s.id] = s
	return s
}

func (ss *sessions) get(id string) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[id]
	if s == nil {
		return nil
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, id)
		return nil
	}
	return s
}

func (ss *sessions) delete(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, id)
}

func (ss *sessions) fromRequest(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil
	}
	return ss.get(c.Value)
}

func (s *session) csrfOK(r *http.Request) bool {
	got := r.Header.Get("X-CSRF-Token")
	if got == "" {
		got = r.PostFormValue("csrf")
	}
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

type sessionKey struct{}

func sessionFrom(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// page guards a GET page: no session sends the browser to the login form;
// a session without the role gets a 403 page.
func (d *Dashboard) page(need role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := d.sessions.fromRequest(r)
		if s == nil {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		if s.rank < need {
			d.errorPage(w, r, http.StatusForbidden, "Your role may not open this page.")
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	}
}

// write guards a form POST: a session, then its CSRF token, then the role.
// Every refusal is 403 and nothing is written.
func (d *Dashboard) write(need role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		s := d.sessions.fromRequest(r)
		if s == nil {
			d.writeRefused(w, r, http.StatusForbidden, "Sign in first.")
			return
		}
		if err := r.ParseForm(); err != nil {
			d.writeRefused(w, r, http.StatusBadRequest, "The form could not be read.")
			return
		}
		if !s.csrfOK(r) {
			d.log.WarnContext(r.Context(), "web_csrf_refused", "subject", s.subject, "path", r.URL.Path)
			d.writeRefused(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong: reload the page and try again.")
			return
		}
		if s.rank < need {
			d.log.WarnContext(r.Context(), "web_write_forbidden", "subject", s.subject, "role", s.role, "path", r.URL.Path)
			d.writeRefused(w, r, http.StatusForbidden, "Your role may not do this.")
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	}
}

// fromScript tells app.js's fetch calls (which send the CSRF header) from
// plain form posts, so each gets an answer it can use.
func fromScript(r *http.Request) bool { return r.Header.Get("X-CSRF-Token") != "" }

func (d *Dashboard) writeRefused(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if fromScript(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(msg))
		return
	}
	d.errorPage(w, r, status, msg)
}

// safeNext keeps the post-login redirect on this site.
func safeNext(next string) string {
	// Browsers drop tabs and newlines inside URLs, so "/\t/host" would
	// become "//host": anything unprintable or a space is refused outright.
	if next == "" || len(next) > 2048 || !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") ||
		strings.ContainsAny(next, "\\ ") || !printable(next) {
		return "/"
	}
	return next
}

func (d *Dashboard) loginForm(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, http.StatusOK, LoginPage(LoginView{
		Page: Page{Title: "Sign in"},
		Next: safeNext(r.URL.Query().Get("next")),
	}))
}

func (d *Dashboard) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		d.errorPage(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	next := safeNext(r.PostFormValue("next"))
	subject, roleName, ok := d.cfg.Authenticate(r.PostFormValue("token"))
	if !ok || parseRole(roleName) == roleNone {
		// The submitted token is never echoed back or logged.
		d.log.InfoContext(r.Context(), "web_login_refused")
		d.render(w, r, http.StatusUnauthorized, LoginPage(LoginView{
			Page:  Page{Title: "Sign in"},
			Error: "That token does not open the dashboard.",
			Next:  next,
		}))
		return
	}
	if old := d.sessions.fromRequest(r); old != nil {
		d.sessions.delete(old.id)
	}
	s := d.sessions.create(subject, roleName)
	http.SetCookie(w, &http.Cookie{
		Name:     cookieName,
		Value:    s.id,
		Path:     "/",
		HttpOnly: true,
		Secure:   r.TLS != nil,
		SameSite: http.SameSiteStrictMode,
		MaxAge:   int(d.cfg.SessionTTL / time.Second),
	})
	d.log.InfoContext(r.Context(), "web_login", "subject", subject, "role", roleName)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (d *Dashboard) logoutForm(w http.ResponseWriter, r *http.Request) {
	s := d.sessions.fromRequest(r)
	if s == nil {
		http.Redirect(w, r, "/login", http.StatusSeeOther)
		return
	}
	d.render(w, r, http.StatusOK, LogoutPage(Page{Title: "Sign out", User: s.user()}))
}

func (d *Dashboard) logout(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	d.sessions.delete(s.id)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: "/", MaxAge: -1,
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode,
	})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
