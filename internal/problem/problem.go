// Package problem renders every jobfence API error as RFC 9457
// application/problem+json through one ordered table, so a status, a slug and
// the client-facing detail are decided in exactly one place. Only validation
// and transition errors carry detail to the client; anything the table does
// not know becomes "internal" and its text stays in the log.
package problem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/go-json-experiment/json"

	"jobfence/jobs"
)

// TypeBase prefixes every slug to form the problem's type URI.
const TypeBase = "https://jobfence.dev/problems/"

// ContentType is the media type of every problem answer.
const ContentType = "application/problem+json"

// Problem is the RFC 9457 body. Extension members of API.md are optional
// fields so one struct serves every slug.
type Problem struct {
	Type        string            `json:"type"`
	Title       string            `json:"title"`
	Status      int               `json:"status"`
	Detail      string            `json:"detail"`
	Instance    string            `json:"instance"`
	RequestID   string            `json:"request_id"`
	Errors      []jobs.FieldError `json:"errors,omitempty"`
	HolderJobID string            `json:"holder_job_id,omitempty"`
	Scope       string            `json:"scope,omitempty"`
	JobID       string            `json:"job_id,omitempty"`
	// Slug is the last segment of Type; kept out of the body.
	Slug string `json:"-"`
}

// Errors that exist only at the HTTP boundary. The domain's own errors live
// in package jobs and are mapped by the same table.
var (
	ErrUnauthenticated      = errors.New("missing or unknown bearer token")
	ErrForbidden            = errors.New("the token's role does not allow this")
	ErrNotFound             = errors.New("no such resource")
	ErrTooLarge             = errors.New("request body too large")
	ErrUnsupportedMediaType = errors.New("content type must be application/json")
	ErrNotReady             = errors.New("not ready")
)

// MalformedError is a body or header that could not be read as the expected
// JSON shape. Field is a JSON pointer or header name when one is known.
type MalformedError struct {
	Field  string
	Reason string
}

func (e *MalformedError) Error() string {
	if e.Field == "" {
		return "malformed: " + e.Reason
	}
	return fmt.Sprintf("malformed %s: %s", e.Field, e.Reason)
}

// MethodNotAllowedError carries the methods the route does serve.
type MethodNotAllowedError struct {
	Allow []string
}

func (e *MethodNotAllowedError) Error() string { return "method not allowed" }

// NotReadyError says what is not ready yet (a seam not wired, a read model
// still syncing).
type NotReadyError struct {
	What string
}

func (e *NotReadyError) Error() string { return e.What + " is not ready" }

func (e *NotReadyError) Is(target error) bool { return target == ErrNotReady }

// entry is one row of the table: the first row whose match accepts the
// error decides the answer.
type entry struct {
	slug   string
	status int
	title  string
	match  func(error) bool
	// detail returns the client-facing detail and fills extension members.
	detail func(err error, p *Problem) string
}

func is(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func as[T error]() func(error) bool {
	return func(err error) bool {
		var t T
		return errors.As(err, &t)
	}
}

func fixed(s string) func(error, *Problem) string {
	return func(error, *Problem) string { return s }
}

// table is ordered: typed errors with extension members first, sentinels
// after, internal last.
var table = []entry{
	{"malformed", http.StatusBadRequest, "Malformed request", as[*MalformedError](),
		func(err error, _ *Problem) string {
			var e *MalformedError
			errors.As(err, &e)
			return e.Error()
		}},
	{"too-large", http.StatusRequestEntityTooLarge, "Request body too large", is(ErrTooLarge),
		fixed("the request body exceeds 1 MiB")},
	{"unsupported-media-type", http.StatusUnsupportedMediaType, "Unsupported media type", is(ErrUnsupportedMediaType),
		fixed("send the body as application/json")},
	{"invalid", http.StatusUnprocessableEntity, "Invalid request", as[*jobs.ValidationError](),
		func(err error, p *Problem) string {
			var e *jobs.ValidationError
			errors.As(err, &e)
			p.Errors = e.Errors
			return fmt.Sprintf("%d field(s) out of bounds", len(e.Errors))
		}},
	{"not-found", http.StatusNotFound, "Not found", func(err error) bool {
		return errors.Is(err, ErrNotFound) || errors.Is(err, jobs.ErrNotFound)
	}, fixed("no such resource")},
	{"method-not-allowed", http.StatusMethodNotAllowed, "Method not allowed", as[*MethodNotAllowedError](),
		fixed("this route does not serve that method; see the Allow header")},
	{"unauthenticated", http.StatusUnauthorized, "Unauthenticated", is(ErrUnauthenticated),
		fixed("send Authorization: Bearer <token>")},
	{"forbidden", http.StatusForbidden, "Forbidden", func(err error) bool {
		return errors.Is(err, ErrForbidden) || errors.Is(err, jobs.ErrForbidden)
	}, fixed("this token may not do that")},
	{"fence-held", http.StatusConflict, "Target is fenced", as[*jobs.FenceHeldError](),
		func(err error, p *Problem) string {
			var e *jobs.FenceHeldError
			errors.As(err, &e)
			p.HolderJobID = e.HolderJobID
			return e.Error()
		}},
	{"quota-exhausted", http.StatusTooManyRequests, "Quota exhausted", as[*jobs.QuotaExhaustedError](),
		func(err error, p *Problem) string {
			var e *jobs.QuotaExhaustedError
			errors.As(err, &e)
			p.Scope = e.Scope
			return e.Error()
		}},
	{"admission-closed", http.StatusServiceUnavailable, "Admission closed", is(jobs.ErrAdmissionClosed),
		fixed("an operator closed admission")},
	{"admission-fail-closed", http.StatusServiceUnavailable, "Admission fails closed", as[*jobs.FailClosedError](),
		func(err error, p *Problem) string {
			var e *jobs.FailClosedError
			errors.As(err, &e)
			p.JobID = e.JobID
			return e.Error() + "; an operator must force-release it"
		}},
	{"invalid-transition", http.StatusConflict, "Invalid transition", is(jobs.ErrInvalidTransition),
		fixed("the job's state does not allow this")},
	{"stale", http.StatusConflict, "Stale", is(jobs.ErrStale),
		fixed("the record changed or the identity does not match; nothing was written")},
	{"idempotency-mismatch", http.StatusUnprocessableEntity, "Idempotency-Key reused", is(jobs.ErrIdempotencyMismatch),
		fixed("this Idempotency-Key was used with a different body")},
	{"not-ready", http.StatusServiceUnavailable, "Not ready", is(ErrNotReady),
		func(err error, _ *Problem) string {
			var e *NotReadyError
			if errors.As(err, &e) {
				return e.Error()
			}
			return "not ready"
		}},
	{"not-ready", http.StatusServiceUnavailable, "Not the leader", is(jobs.ErrNotLeader),
		fixed("this replica is not the leader")},
}

var internalEntry = entry{"internal", http.StatusInternalServerError, "Internal error", nil,
	fixed("an internal error occurred; see the server log with this request_id")}

// Slugs lists every slug the table can produce, in table order, for tests
// and the OpenAPI contract.
func Slugs() []string {
	seen := map[string]bool{}
	var out []string
	for _, e := range append(table, internalEntry) {
		if !seen[e.slug] {
			seen[e.slug] = true
			out = append(out, e.slug)
		}
	}
	return out
}

// From classifies err. internal reports whether no row matched, so the
// caller logs the error text it must not send.
func From(err error) (p *Problem, internal bool) {
	e := internalEntry
	for _, row := range table {
		if row.match(err) {
			e = row
			break
		}
	}
	p = &Problem{Type: TypeBase + e.slug, Title: e.title, Status: e.status, Slug: e.slug}
	p.Detail = e.detail(err, p)
	return p, e.match == nil
}

// Write sends p. The caller has set X-Request-Id already; Allow is set for 405.
func Write(w http.ResponseWriter, p *Problem, err error) {
	var mna *MethodNotAllowedError
	if errors.As(err, &mna) {
		w.Header().Set("Allow", strings.Join(mna.Allow, ", "))
	}
	body, mErr := json.Marshal(p)
	if mErr != nil {
		body = []byte(`{"type":"` + TypeBase + `internal","title":"Internal error","status":500}`)
	}
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}
