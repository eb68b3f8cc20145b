package jobs

import "time"

// ResultEnvelope is the body of POST /v1/jobs/{id}/result: what an agent
// reports about one invocation. The identity fields must echo the dispatch
// exactly; Secret is compared (as a hash) before anything else.
type ResultEnvelope struct {
	DispatchRevision      int64      `json:"dispatch_revision"`
	InvocationID          string     `json:"invocation_id"`
	AgentEpoch            string     `json:"agent_epoch"`
	Secret                string     `json:"secret"`
	Code                  ResultCode `json:"code"`
	Phase                 Phase      `json:"phase"`
	ExitCode              *int       `json:"exit_code,omitempty"`
	Signal                string     `json:"signal,omitempty"`
	Detail                string     `json:"detail,omitempty"`
	Proof                 Proof      `json:"proof"`
	ExternalStateAdvanced bool       `json:"external_state_advanced,omitempty"`
}

// Isolation is an agent's isolation report.
type Isolation struct {
	Mode     string `json:"mode"`
	Verified bool   `json:"verified"`
	Detail   string `json:"detail"`
}

// AgentRegistration is the body of PUT /v1/agents/{id}.
type AgentRegistration struct {
	Address   string    `json:"address"`
	Epoch     string    `json:"epoch"`
	Capacity  int       `json:"capacity"`
	Isolation Isolation `json:"isolation"`
}

// Agent is the stored agent record (refreshed by heartbeats). A missing or
// stale record proves nothing about the slots the agent holds.
type Agent struct {
	ID            string    `json:"id"`
	Address       string    `json:"address"`
	Epoch         string    `json:"epoch"`
	Capacity      int       `json:"capacity"`
	Isolation     Isolation `json:"isolation"`
	LastHeartbeat time.Time `json:"last_heartbeat"`
	// PreviousEpochs are epochs this id announced before; a slot held under one
	// of them is released with AGENT_EPOCH_REPLACED by the epoch sweep.
	RegisteredAt time.Time `json:"registered_at"`
}
