package store

import (
	"errors"
	"fmt"
	"slices"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"jobfence/jobs"
)

// Job records are encoded on every transition and decoded by every replica's
// watch for every change, and again for every record on a restart's list, so
// the codec is on the admission path twice. json v2 does both in about a
// third of encoding/json's time and allocations.
//
// The options keep the stored format what encoding/json wrote before: nil
// slices and maps as null, and a string that is not valid UTF-8 mangled to
// U+FFFD instead of failing the write. Records written either way decode to
// the same Job.
var (
	encodeOpts = json.JoinOptions(
		json.FormatNilSliceAsNull(true),
		json.FormatNilMapAsNull(true),
		jsontext.AllowInvalidUTF8(true),
	)
	decodeOpts = jsontext.AllowInvalidUTF8(true)
)

// decodeJob reads a record and fills what only etcd knows: the record's
// revision, and the revision of the transaction that appended the latest
// history entry (stored as 0, since it is known only after the commit; an
// earlier entry was filled when its successor read the record). The dispatch
// revision is markRunning's transaction revision, filled the same way.
func decodeJob(id string, value []byte, modRev int64) (*jobs.Job, error) {
	var j jobs.Job
	if err := json.Unmarshal(value, &j, decodeOpts); err != nil {
		return nil, fmt.Errorf("undecodable record: %w", err)
	}
	if j.ID != id {
		return nil, fmt.Errorf("record id %q under key %q", j.ID, id)
	}
	j.Revision = modRev
	for i := range j.History {
		if j.History[i].Revision == 0 {
			j.History[i].Revision = modRev
		}
	}
	if j.Dispatch != nil && j.Dispatch.DispatchRevision == 0 {
		j.Dispatch.DispatchRevision = modRev
	}
	if j.Result != nil && j.Result.Late == nil {
		j.Result.Late = []jobs.LateReport{}
	}
	if !slices.Contains(jobs.States, j.State) {
		return nil, fmt.Errorf("record has unknown state %q", j.State)
	}
	if !j.Resolved && (j.Target.Scope == "" || j.Target.Name == "") {
		return &j, errTargetless
	}
	return &j, nil
}

var errTargetless = errors.New("unresolved record without a target")

func encodeJob(j *jobs.Job) ([]byte, error) {
	c := *j
	c.BlockedReason = ""
	return json.Marshal(&c, encodeOpts)
}
