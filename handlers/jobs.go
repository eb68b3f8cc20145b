package handlers

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/go-json-experiment/json"
	"github.com/google/uuid"

	"jobfence/internal/problem"
	"jobfence/internal/store"
	"jobfence/jobs"
)

// publicJob is the Job as every read returns it: the dispatch secret's hash
// and the store's bookkeeping never leave the server.
func publicJob(j *jobs.Job) *jobs.Job {
	c := j.Public()
	c.QuotaToken = ""
	if c.History == nil {
		c.History = []jobs.HistoryEntry{}
	}
	return c
}

// jobID extracts the path id; anything that is not a UUID is simply not a
// job, so it answers 404 like an unknown one.
func jobID(r *http.Request) (string, error) {
	raw := chi.URLParam(r, "id")
	// uuid.Parse also takes braced and urn: forms; only the plain 36-character
	// spelling names a job.
	id, err := uuid.Parse(raw)
	if err != nil || len(raw) != 36 {
		return "", problem.ErrNotFound
	}
	return id.String(), nil
}

// idempotencyKey reads the optional header: 1-128 printable ASCII characters.
func idempotencyKey(r *http.Request) (string, error) {
	vals, present := r.Header["Idempotency-Key"]
	if !present {
		return "", nil
	}
	bad := &problem.MalformedError{Field: "Idempotency-Key", Reason: "must be 1-128 printable ASCII characters"}
	if len(vals) != 1 || len(vals[0]) < 1 || len(vals[0]) > 128 {
		return "", bad
	}
	for i := 0; i < len(vals[0]); i++ {
		if c := vals[0][i]; c < 0x20 || c > 0x7e {
			return "", bad
		}
	}
	return vals[0], nil
}

func (a *API) admitJob(w http.ResponseWriter, r *http.Request) error {
	p, _ := PrincipalFrom(r.Context())
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	var sub jobs.Submission
	if _, err := DecodeJSON(r, &sub); err != nil {
		return err
	}
	target, spec, err := sub.Validate(a.Defaults)
	if err != nil {
		return err
	}
	var bodyHash string
	if key != "" {
		// The hash is over the decoded submission re-encoded
		// deterministically, so whitespace and member order do not make
		// "the same body" differ.
		canon, err := json.Marshal(&sub, json.Deterministic(true))
		if err != nil {
			return err
		}
		sum := sha256.Sum256(canon)
		bodyHash = hex.EncodeToString(sum[:])
	}
	job, created, err := a.Store.Admit(r.Context(), store.AdmitInput{
		Target:         target,
		Operation:      sub.Operation,
		Spec:           spec,
		Actor:          p.Subject,
		IdempotencyKey: key,
		BodyHash:       bodyHash,
	})
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		w.Header().Set("Location", "/v1/jobs/"+job.ID)
	}
	return WriteJSON(w, status, publicJob(job))
}

func (a *API) getJob(w http.ResponseWriter, r *http.Request) error {
	id, err := jobID(r)
	if err != nil {
		return err
	}
	job, err := a.Store.Get(r.Context(), id)
	if err != nil {
		return err
	}
	return WriteJSON(w, http.StatusOK, publicJob(job))
}

type jobList struct {
	Jobs          []*jobs.Job `json:"jobs"`
	NextPageToken string      `json:"next_page_token"`
}

// listFilter reads the query. Unknown parameters are rejected like unknown
// body fields, so a typo does not silently widen the list.
func listFilter(r *http.Request) (store.ListFilter, error) {
	f := store.ListFilter{Limit: 100}
	verr := &jobs.ValidationError{}
	q := r.URL.Query()
	for name, vals := range q {
		if len(vals) != 1 {
			return f, &problem.MalformedError{Field: name, Reason: "give the parameter once"}
		}
		v := vals[0]
		switch name {
		case "state":
			ok := false
			for _, s := range jobs.States {
				if string(s) == v {
					ok = true
				}
			}
			if !ok {
				verr.Add("state", "must be PENDING, RUNNING, COMMITTED, NOT_COMMITTED or UNKNOWN")
			}
			f.State = jobs.State(v)
		case "scope":
			f.Scope = strings.ToLower(strings.TrimSpace(v))
		case "target":
			t, err := jobs.ParseTarget(v)
			if err != nil {
				verr.Add("target", "must be scope/name")
			}
			f.Target = t.Key()
		case "resolved":
			b, err := strconv.ParseBool(v)
			if err != nil || (v != "true" && v != "false") {
				verr.Add("resolved", "must be true or false")
			}
			f.Resolved = &b
		case "agent_id":
			f.AgentID = v
		case "limit":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 500 {
				verr.Add("limit", "must be an integer from 1 to 500")
			}
			f.Limit = n
		case "page_token":
			f.PageToken = v
		default:
			return f, &problem.MalformedError{Field: name, Reason: "unknown query parameter"}
		}
	}
	return f, verr.Err()
}

func (a *API) listJobs(w http.ResponseWriter, r *http.Request) error {
	f, err := listFilter(r)
	if err != nil {
		return err
	}
	list, next, err := a.Store.List(r.Context(), f)
	if err != nil {
		return err
	}
	out := jobList{Jobs: make([]*jobs.Job, 0, len(list)), NextPageToken: next}
	for _, j := range list {
		out.Jobs = append(out.Jobs, publicJob(j))
	}
	return WriteJSON(w, http.StatusOK, out)
}

func (a *API) cancelJob(w http.ResponseWriter, r *http.Request) error {
	p, _ := PrincipalFrom(r.Context())
	id, err := jobID(r)
	if err != nil {
		return err
	}
	job, err := a.Store.Cancel(r.Context(), id, p.Subject)
	if err != nil {
		return err
	}
	return WriteJSON(w, http.StatusOK, publicJob(job))
}

// forceReleaseBody is the body of POST /v1/jobs/{id}/force-release.
type forceReleaseBody struct {
	Note *string `json:"note"`
}

func (a *API) forceRelease(w http.ResponseWriter, r *http.Request) error {
	p, _ := PrincipalFrom(r.Context())
	id, err := jobID(r)
	if err != nil {
		return err
	}
	var body forceReleaseBody
	if _, err := DecodeJSON(r, &body); err != nil {
		return err
	}
	if body.Note == nil {
		return &jobs.ValidationError{Errors: []jobs.FieldError{{Field: "note", Problem: "required"}}}
	}
	if err := jobs.ValidateNote(*body.Note); err != nil {
		return &jobs.ValidationError{Errors: []jobs.FieldError{{Field: "note", Problem: err.Error()}}}
	}
	job, err := a.Store.ForceRelease(r.Context(), id, p.Subject, *body.Note)
	if err != nil {
		return err
	}
	return WriteJSON(w, http.StatusOK, publicJob(job))
}
