package handlers

import (
	"net/http"
	"time"

	"jobfence/internal/store"
	"jobfence/jobs"
)

type fenceList struct {
	Fences []store.Fence `json:"fences"`
}

func (a *API) listFences(w http.ResponseWriter, r *http.Request) error {
	f := a.Store.Fences()
	if f == nil {
		f = []store.Fence{}
	}
	return WriteJSON(w, http.StatusOK, fenceList{Fences: f})
}

type agentList struct {
	Agents []store.AgentView `json:"agents"`
}

func (a *API) listAgents(w http.ResponseWriter, r *http.Request) error {
	ag := a.Store.Agents()
	if ag == nil {
		ag = []store.AgentView{}
	}
	return WriteJSON(w, http.StatusOK, agentList{Agents: ag})
}

type slotList struct {
	Slots []store.Slot `json:"slots"`
}

func (a *API) listSlots(w http.ResponseWriter, r *http.Request) error {
	s := a.Store.Slots()
	if s == nil {
		s = []store.Slot{}
	}
	return WriteJSON(w, http.StatusOK, slotList{Slots: s})
}

// Status is the body of GET /v1/status.
type Status struct {
	Leader    StatusLeader       `json:"leader"`
	Replica   StatusReplica      `json:"replica"`
	Admission StatusAdmission    `json:"admission"`
	Dispatch  StatusDispatch     `json:"dispatch"`
	Counts    map[jobs.State]int `json:"counts"`
	Quota     StatusQuota        `json:"quota"`
}

// StatusLeader is empty (id "") while no leader is known.
type StatusLeader struct {
	ID               string    `json:"id"`
	Since            time.Time `json:"since,omitzero"`
	ElectionRevision int64     `json:"election_revision"`
}

type StatusReplica struct {
	ID     string `json:"id"`
	Cursor int64  `json:"cursor"`
	Lag    int64  `json:"lag"`
}

type StatusAdmission struct {
	Open bool `json:"open"`
}

type StatusDispatch struct {
	Paused bool `json:"paused"`
}

// StatusQuota shows unresolved jobs counted against the quota.
type StatusQuota struct {
	Global   int            `json:"global"`
	PerScope map[string]int `json:"per_scope"`
}

// StatusSnapshot builds the status view; the dashboard shows the same.
func (a *API) StatusSnapshot() Status {
	li := a.LeaderInfo()
	cur := a.Store.Cursor()
	set := a.Store.Settings()
	counts := map[jobs.State]int{}
	for _, s := range jobs.States {
		counts[s] = 0
	}
	for s, n := range a.Store.Counts() {
		counts[s] = n
	}
	g, per := a.Store.QuotaUse()
	if per == nil {
		per = map[string]int{}
	}
	return Status{
		Leader:    StatusLeader{ID: li.ID, Since: li.Since.UTC(), ElectionRevision: li.ElectionRevision},
		Replica:   StatusReplica{ID: a.replicaID, Cursor: cur.Revision, Lag: cur.Lag},
		Admission: StatusAdmission{Open: set.AdmissionOpen},
		Dispatch:  StatusDispatch{Paused: set.DispatchPaused},
		Counts:    counts,
		Quota:     StatusQuota{Global: g, PerScope: per},
	}
}

func (a *API) status(w http.ResponseWriter, r *http.Request) error {
	return WriteJSON(w, http.StatusOK, a.StatusSnapshot())
}

type admissionSetting struct {
	Open *bool `json:"open"`
}

type dispatchSetting struct {
	Paused *bool `json:"paused"`
}

func (a *API) putAdmission(w http.ResponseWriter, r *http.Request) error {
	var body admissionSetting
	if _, err := DecodeJSON(r, &body); err != nil {
		return err
	}
	if body.Open == nil {
		return &jobs.ValidationError{Errors: []jobs.FieldError{{Field: "open", Problem: "required"}}}
	}
	if err := a.Store.SetAdmissionOpen(r.Context(), *body.Open); err != nil {
		return err
	}
	return WriteJSON(w, http.StatusOK, StatusAdmission{Open: a.Store.Settings().AdmissionOpen})
}

func (a *API) putDispatch(w http.ResponseWriter, r *http.Request) error {
	var body dispatchSetting
	if _, err := DecodeJSON(r, &body); err != nil {
		return err
	}
	if body.Paused == nil {
		return &jobs.ValidationError{Errors: []jobs.FieldError{{Field: "paused", Problem: "required"}}}
	}
	if err := a.Store.SetDispatchPaused(r.Context(), *body.Paused); err != nil {
		return err
	}
	return WriteJSON(w, http.StatusOK, StatusDispatch{Paused: a.Store.Settings().DispatchPaused})
}
