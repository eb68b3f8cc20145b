package store

import (
	"fmt"
	"slices"
	"time"
	"unique"

	"github.com/go-json-experiment/json"

	"jobfence/jobs"
)

// jobEntry is what the read model keeps of every job: enough to filter and
// count, list pages and pick retention candidates. The full record stays in
// memory only while the job is active (unresolved or holding a slot); a
// resolved record changes only by a late report or its removal, so it is
// read from etcd when a page or a Get asks for it. A replica keeping many
// retained jobs then holds about a tenth of what decoded records would take,
// and its memory follows the working set.
type jobEntry struct {
	State     jobs.State // interned constant
	Scope     string     // interned: one copy per scope
	Target    string     // normalized scope/name, as jobs.Target.Key
	AgentID   string     // the dispatch's agent, interned; "" if never dispatched
	UpdatedAt int64      // unix nanoseconds
	Revision  int64      // the record's ModRevision
	Resolved  bool
	Removable bool // jobs.Removable: resolved and holding no slot
}

func summarize(j *jobs.Job) jobEntry {
	e := jobEntry{
		State: j.State, Scope: j.Target.Scope, Target: j.Target.Key(),
		UpdatedAt: j.UpdatedAt.UnixNano(), Revision: j.Revision,
		Resolved: j.Resolved, Removable: jobs.Removable(j),
	}
	if j.Dispatch != nil {
		e.AgentID = unique.Make(j.Dispatch.AgentID).Value()
	}
	return e
}

// summaryRecord is the part of a stored record a summary needs. Reading
// only these members is about three times faster than decoding the record,
// and a restart reads every retained record.
type summaryRecord struct {
	ID        string      `json:"id"`
	State     jobs.State  `json:"state"`
	Resolved  bool        `json:"resolved"`
	Target    jobs.Target `json:"target"`
	UpdatedAt time.Time   `json:"updated_at"`
	Slot      struct {
		Held bool `json:"held"`
	} `json:"slot"`
	Dispatch *struct {
		AgentID string `json:"agent_id"`
	} `json:"dispatch"`
}

// summarizeRecord summarizes a stored record that is resolved and holds no
// slot, whose whole record the view does not keep (ok true). For an active
// record it answers ok false and the caller decodes it whole. The members
// it reads are checked as decodeJob checks them; the rest of a resolved
// record is checked when a Get or a page reads it.
func summarizeRecord(id string, value []byte, modRev int64) (jobEntry, bool, error) {
	var r summaryRecord
	if err := json.Unmarshal(value, &r, decodeOpts); err != nil {
		return jobEntry{}, false, fmt.Errorf("undecodable record: %w", err)
	}
	if !r.Resolved || r.Slot.Held {
		return jobEntry{}, false, nil
	}
	if r.ID != id {
		return jobEntry{}, false, fmt.Errorf("record id %q under key %q", r.ID, id)
	}
	if !slices.Contains(jobs.States, r.State) {
		return jobEntry{}, false, fmt.Errorf("record has unknown state %q", r.State)
	}
	e := jobEntry{
		State: unique.Make(r.State).Value(), Scope: unique.Make(r.Target.Scope).Value(), Target: r.Target.Key(),
		UpdatedAt: r.UpdatedAt.UnixNano(), Revision: modRev, Resolved: true, Removable: true,
	}
	if r.Dispatch != nil {
		e.AgentID = unique.Make(r.Dispatch.AgentID).Value()
	}
	return e, true, nil
}

func (e jobEntry) updated() time.Time { return time.Unix(0, e.UpdatedAt) }
