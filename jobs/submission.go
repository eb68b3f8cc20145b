package jobs

// Submission is the body of POST /v1/jobs as decoded (strictly) by handlers.
// Pointer fields distinguish "omitted" (take the default) from an explicit
// value, because explicit zeros are out of bounds.
type Submission struct {
	Target      string             `json:"target"`
	Operation   string             `json:"operation,omitempty"`
	Command     []string           `json:"command"`
	Env         map[string]string  `json:"env,omitempty"`
	Credentials string             `json:"credentials,omitempty"`
	WorkingDir  string             `json:"working_dir,omitempty"`
	Limits      *SubmissionLimits  `json:"limits,omitempty"`
	Outcome     *SubmissionOutcome `json:"outcome,omitempty"`
	Refresh     *Refresh           `json:"refresh,omitempty"`
	Labels      map[string]string  `json:"labels,omitempty"`
}

// SubmissionLimits is Limits with omitted fields told apart from zeros.
type SubmissionLimits struct {
	MemoryBytes     *int64 `json:"memory_bytes,omitempty"`
	Pids            *int64 `json:"pids,omitempty"`
	DeadlineSeconds *int64 `json:"deadline_seconds,omitempty"`
}

// SubmissionOutcome is Outcome with omitted sets told apart from empty ones.
type SubmissionOutcome struct {
	CommittedExitCodes    []int `json:"committed_exit_codes,omitempty"`
	NotCommittedExitCodes []int `json:"not_committed_exit_codes,omitempty"`
}

// Defaults are the server-side values for omitted fields and the upper bounds
// that depend on server configuration.
type Defaults struct {
	MemoryBytes     int64 // default memory limit
	MaxMemoryBytes  int64 // the server's maximum
	Pids            int64
	DeadlineSeconds int64
}
