package web

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"jobfence/internal/store"
	"jobfence/jobs"
)

func (d *Dashboard) pageFor(r *http.Request, title, nav string, live bool) Page {
	return Page{Title: title, Nav: nav, User: sessionFrom(r.Context()).user(), Live: live}
}

func (d *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	v := OverviewView{Page: d.pageFor(r, "Overview", "/", true)}
	now := d.now()
	if d.cfg.Leader != nil {
		if id, since, rev := d.cfg.Leader(); id != "" {
			v.Leader = LeaderView{Known: true, ID: id, Since: stamp(since, now), ElectionRevision: rev}
		}
	}
	cur := d.cfg.Store.Cursor()
	v.Replicas = append(v.Replicas, ReplicaView{ID: d.cfg.ReplicaID, Cursor: cur.Revision, Lag: cur.Lag, Self: true})
	if d.cfg.Replicas != nil {
		for _, rp := range d.cfg.Replicas() {
			if rp.ID == d.cfg.ReplicaID {
				continue
			}
			v.Replicas = append(v.Replicas, ReplicaView{ID: rp.ID, Cursor: rp.Cursor, Lag: rp.Lag,
				Unreachable: rp.Unreachable, Detail: rp.Detail})
		}
	}
	slices.SortFunc(v.Replicas, func(a, b ReplicaView) int { return cmp.Compare(a.ID, b.ID) })
	for i := range v.Replicas {
		v.Replicas[i].Leader = v.Leader.Known && v.Replicas[i].ID == v.Leader.ID
	}
	st := d.cfg.Store.Settings()
	v.AdmissionOpen, v.DispatchPaused = st.AdmissionOpen, st.DispatchPaused
	counts := d.cfg.Store.Counts()
	for _, s := range jobs.States {
		v.Counts = append(v.Counts, CountView{State: string(s), N: counts[s]})
	}
	global, per := d.cfg.Store.QuotaUse()
	v.QuotaGlobal = QuotaRow{Used: global, Limit: d.cfg.QuotaGlobal}
	for scope, n := range per {
		v.QuotaScopes = append(v.QuotaScopes, QuotaRow{Scope: scope, Used: n, Limit: d.cfg.QuotaPerScope})
	}
	slices.SortFunc(v.QuotaScopes, func(a, b QuotaRow) int { return cmp.Compare(a.Scope, b.Scope) })
	d.render(w, r, http.StatusOK, OverviewPage(v))
}

func (d *Dashboard) fences(w http.ResponseWriter, r *http.Request) {
	v := FencesView{Page: d.pageFor(r, "Fences", "/fences", true)}
	now := d.now()
	u := v.User
	fences := d.cfg.Store.Fences()
	slices.SortFunc(fences, func(a, b store.Fence) int { return cmp.Compare(a.Target, b.Target) })
	for _, f := range fences {
		j, err := d.cfg.Store.Get(r.Context(), f.JobID)
		if err != nil {
			// The job may have resolved between the two reads; the fence
			// row still shows what the read model held.
			j = nil
		}
		row := FenceRow{
			Target:       f.Display,
			Key:          f.Target,
			JobID:        f.JobID,
			State:        string(f.State),
			RefreshState: string(f.RefreshState),
			Since:        stamp(f.Since, now),
			Reason:       fenceReason(f, j),
		}
		if row.Target == "" {
			row.Target = f.Target
		}
		if u.CanOperate && forceReleasable(j) {
			row.Release = releaseView(j, u.CSRF)
		}
		v.Fences = append(v.Fences, row)
	}
	d.render(w, r, http.StatusOK, FencesPage(v))
}

func (d *Dashboard) agents(w http.ResponseWriter, r *http.Request) {
	v := AgentsView{Page: d.pageFor(r, "Agents", "/agents", true)}
	now := d.now()
	byAgent := map[string][]SlotRow{}
	for _, s := range d.cfg.Store.Slots() {
		byAgent[s.AgentID] = append(byAgent[s.AgentID], SlotRow{
			AgentID:  s.AgentID,
			JobID:    s.JobID,
			State:    string(s.State),
			Since:    stamp(s.Since, now),
			Awaiting: s.Awaiting,
		})
	}
	agents := d.cfg.Store.Agents()
	slices.SortFunc(agents, func(a, b store.AgentView) int { return cmp.Compare(a.ID, b.ID) })
	for _, a := range agents {
		v.Agents = append(v.Agents, AgentRow{
			ID:                a.ID,
			Address:           a.Address,
			Epoch:             a.Epoch,
			LastHeartbeat:     stamp(a.LastHeartbeat, now),
			Live:              a.Live,
			IsolationMode:     a.Isolation.Mode,
			IsolationVerified: a.Isolation.Verified,
			IsolationDetail:   a.Isolation.Detail,
			Capacity:          a.Capacity,
			SlotsHeld:         a.SlotsHeld,
			Slots:             byAgent[a.ID],
		})
		delete(byAgent, a.ID)
	}
	for _, rows := range byAgent {
		v.Orphans = append(v.Orphans, rows...)
	}
	slices.SortFunc(v.Orphans, func(a, b SlotRow) int {
		return cmp.Or(cmp.Compare(a.AgentID, b.AgentID), cmp.Compare(a.JobID, b.JobID))
	})
	d.render(w, r, http.StatusOK, AgentsPage(v))
}

func (d *Dashboard) jobsList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := JobsView{
		Page:   d.pageFor(r, "Jobs", "/jobs", true),
		State:  q.Get("state"),
		Scope:  q.Get("scope"),
		Target: q.Get("target"),
	}
	for _, s := range jobs.States {
		v.States = append(v.States, string(s))
	}
	if v.State != "" && !slices.Contains(v.States, v.State) {
		d.errorPage(w, r, http.StatusBadRequest, "Unknown state filter: choose one from the list.")
		return
	}
	for _, s := range []string{v.Scope, v.Target, q.Get("page_token")} {
		if len(s) > 512 || !printable(s) {
			d.errorPage(w, r, http.StatusBadRequest, "A filter is too long or holds characters that cannot be printed.")
			return
		}
	}
	token := q.Get("page_token")
	list, next, err := d.cfg.Store.List(r.Context(), store.ListFilter{
		State:     jobs.State(v.State),
		Scope:     v.Scope,
		Target:    v.Target,
		Limit:     d.cfg.PageSize,
		PageToken: token,
	})
	if err != nil {
		var ve *jobs.ValidationError
		if errors.As(err, &ve) {
			d.errorPage(w, r, http.StatusBadRequest, "The filter or page token is not valid.")
			return
		}
		d.log.ErrorContext(r.Context(), "web_list_failed", "err", err.Error())
		d.errorPage(w, r, http.StatusInternalServerError, "The job list could not be read.")
		return
	}
	now := d.now()
	for _, j := range list {
		v.Jobs = append(v.Jobs, jobRow(j, now))
	}
	if next != "" {
		v.NextURL = jobsURL(v.State, v.Scope, v.Target, next)
	}
	if token != "" {
		v.FirstURL = jobsURL(v.State, v.Scope, v.Target, "")
	}
	d.render(w, r, http.StatusOK, JobsPage(v))
}

// loadJob reads the job named in the path, answering 404 for ids that are
// not UUIDs or not known.
func (d *Dashboard) loadJob(w http.ResponseWriter, r *http.Request) *jobs.Job {
	id := chi.URLParam(r, "id")
	if _, err := uuid.Parse(id); err != nil {
		d.errorPage(w, r, http.StatusNotFound, "There is no job with that id.")
		return nil
	}
	j, err := d.cfg.Store.Get(r.Context(), id)
	if errors.Is(err, jobs.ErrNotFound) {
		d.errorPage(w, r, http.StatusNotFound, "There is no job with that id.")
		return nil
	}
	if err != nil {
		d.log.ErrorContext(r.Context(), "web_get_failed", "job_id", id, "err", err.Error())
		d.errorPage(w, r, http.StatusInternalServerError, "The job could not be read.")
		return nil
	}
	return j
}

func (d *Dashboard) job(w http.ResponseWriter, r *http.Request) {
	j := d.loadJob(w, r)
	if j == nil {
		return
	}
	v := jobView(j, d.now())
	v.Page = d.pageFor(r, "Job "+j.ID, "/jobs", true)
	if v.User.CanOperate && forceReleasable(j) {
		v.Release = releaseView(j, v.User.CSRF)
	}
	d.render(w, r, http.StatusOK, JobPage(v))
}

func (d *Dashboard) releaseForm(w http.ResponseWriter, r *http.Request) {
	j := d.loadJob(w, r)
	if j == nil {
		return
	}
	if !forceReleasable(j) {
		d.errorPage(w, r, http.StatusConflict, "This job cannot be force-released: only an unresolved UNKNOWN job, or one whose refresh FAILED, can be.")
		return
	}
	u := sessionFrom(r.Context()).user()
	d.render(w, r, http.StatusOK, ReleasePage(ReleasePageView{
		Page:    Page{Title: "Force release", Nav: "/fences", User: u},
		Release: *releaseView(j, u.CSRF),
	}))
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// validNote applies the API's bounds for a force-release note.
func validNote(note string) string {
	switch {
	case note == "":
		return "A note is required: say why the release is safe."
	case len(note) > 1024:
		return "The note is longer than 1024 bytes."
	case !printable(note):
		return "The note holds characters that cannot be printed."
	}
	return ""
}

func (d *Dashboard) forceRelease(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	id := chi.URLParam(r, "id")
	if _, err := uuid.Parse(id); err != nil {
		d.writeRefused(w, r, http.StatusNotFound, "There is no job with that id.")
		return
	}
	note := r.PostFormValue("note")
	if problem := validNote(note); problem != "" {
		if fromScript(r) {
			d.writeRefused(w, r, http.StatusUnprocessableEntity, problem)
			return
		}
		j := d.loadJob(w, r)
		if j == nil {
			return
		}
		d.render(w, r, http.StatusUnprocessableEntity, ReleasePage(ReleasePageView{
			Page:    Page{Title: "Force release", Nav: "/fences", User: s.user()},
			Release: *releaseView(j, s.csrf),
			Error:   problem,
		}))
		return
	}
	j, err := d.cfg.Store.ForceRelease(r.Context(), id, s.subject, note)
	switch {
	case errors.Is(err, jobs.ErrNotFound):
		d.writeRefused(w, r, http.StatusNotFound, "There is no job with that id.")
		return
	case errors.Is(err, jobs.ErrInvalidTransition):
		d.writeRefused(w, r, http.StatusConflict, "This job cannot be force-released in its current state.")
		return
	case errors.Is(err, jobs.ErrStale):
		d.writeRefused(w, r, http.StatusConflict, "The job changed while you were looking: reload and check it again.")
		return
	case err != nil:
		d.log.ErrorContext(r.Context(), "web_force_release_failed", "job_id", id, "err", err.Error())
		d.writeRefused(w, r, http.StatusInternalServerError, "The release could not be written.")
		return
	}
	d.log.InfoContext(r.Context(), "web_force_release", "job_id", j.ID, "actor", s.subject, "revision", j.Revision)
	if fromScript(r) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("Released " + j.Target.Key() + " (job " + j.ID + ")."))
		return
	}
	http.Redirect(w, r, "/jobs/"+j.ID, http.StatusSeeOther)
}

func (d *Dashboard) setAdmission(w http.ResponseWriter, r *http.Request) {
	d.setSwitch(w, r, "open", "admission_open", d.cfg.Store.SetAdmissionOpen)
}

func (d *Dashboard) setDispatch(w http.ResponseWriter, r *http.Request) {
	d.setSwitch(w, r, "paused", "dispatch_paused", d.cfg.Store.SetDispatchPaused)
}

func (d *Dashboard) setSwitch(w http.ResponseWriter, r *http.Request, field, attr string, set func(context.Context, bool) error) {
	val, err := strconv.ParseBool(r.PostFormValue(field))
	if err != nil {
		d.writeRefused(w, r, http.StatusUnprocessableEntity, "The switch value must be true or false.")
		return
	}
	if err := set(r.Context(), val); err != nil {
		d.log.ErrorContext(r.Context(), "web_setting_failed", "setting", attr, "err", err.Error())
		d.writeRefused(w, r, http.StatusInternalServerError, "The setting could not be written.")
		return
	}
	d.log.InfoContext(r.Context(), "web_setting_changed", "setting", attr, "value", val, "actor", sessionFrom(r.Context()).subject)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}
