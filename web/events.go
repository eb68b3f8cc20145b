package web

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"jobfence/internal/problem"
)

// eventData names what changed and nothing else: a page re-reads what it
// shows, so no field of a record can leak through the stream.
type eventData struct {
	Kind     string `json:"kind"`
	ID       string `json:"id"`
	Revision int64  `json:"revision"`
}

// eventsAuth accepts a Bearer token (for scripts) or a dashboard session.
// It returns the session when the stream rides on one, so the stream can end
// when that session does.
func (d *Dashboard) eventsAuth(r *http.Request) (*session, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		scheme, token, found := strings.Cut(h, " ")
		if !found || !strings.EqualFold(scheme, "Bearer") {
			return nil, problem.ErrUnauthenticated
		}
		_, roleName, ok := d.cfg.Authenticate(strings.TrimSpace(token))
		if !ok {
			return nil, problem.ErrUnauthenticated
		}
		if parseRole(roleName) < roleViewer {
			return nil, problem.ErrForbidden
		}
		return nil, nil
	}
	s := d.sessions.fromRequest(r)
	if s == nil {
		return nil, problem.ErrUnauthenticated
	}
	return s, nil
}

func (d *Dashboard) writeProblem(w http.ResponseWriter, r *http.Request, err error) {
	if w.Header().Get("X-Request-Id") == "" {
		w.Header().Set("X-Request-Id", uuid.NewString())
	}
	p, _ := problem.From(err)
	p.Instance = r.URL.Path
	p.RequestID = w.Header().Get("X-Request-Id")
	problem.Write(w, p, err)
}

// events streams read-model changes as Server-Sent Events: one event per
// change, a comment every KeepAlive. Each write gets its own deadline, so a
// stuck client is dropped without the server's WriteTimeout cutting every
// healthy stream at a fixed age.
func (d *Dashboard) events(w http.ResponseWriter, r *http.Request) {
	sess, err := d.eventsAuth(r)
	if err != nil {
		d.writeProblem(w, r, err)
		return
	}
	rc := http.NewResponseController(w)
	ch, unsubscribe := d.cfg.Store.Subscribe()
	defer unsubscribe()

	write := func(format string, args ...any) bool {
		if err := rc.SetWriteDeadline(d.now().Add(d.cfg.WriteTimeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
			return false
		}
		if _, err := fmt.Fprintf(w, format, args...); err != nil {
			return false
		}
		return rc.Flush() == nil
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if !write("retry: 3000\n: cursor %d\n\n", d.cfg.Store.Cursor().Revision) {
		return
	}
	keep := time.NewTicker(d.cfg.KeepAlive)
	defer keep.Stop()
	end := time.NewTimer(d.cfg.MaxStream)
	defer end.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-d.streams:
			return
		case <-end.C:
			return
		case <-keep.C:
			if sess != nil && d.sessions.get(sess.id) == nil {
				// Signed out or expired: the stream must not outlive the session.
				return
			}
			if !write(": keep-alive\n\n") {
				return
			}
		case c, ok := <-ch:
			if !ok {
				return
			}
			data, err := json.Marshal(eventData{Kind: c.Kind, ID: c.ID, Revision: c.Revision})
			if err != nil {
				return
			}
			if !write("event: %s\nid: %d\ndata: %s\n\n", sanitizeEventName(c.Kind), c.Revision, data) {
				return
			}
		}
	}
}

// sanitizeEventName keeps a kind from breaking the event framing.
func sanitizeEventName(k string) string {
	if k == "" || strings.ContainsAny(k, "\r\n:") {
		return "change"
	}
	return k
}
