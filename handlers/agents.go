package handlers

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"

	"jobfence/jobs"
)

// Bounds of the agent-facing bodies.
const (
	maxAgentIDBytes   = 128
	maxEpochBytes     = 128
	maxAddressBytes   = 2048
	maxCapacity       = 4096
	maxModeBytes      = 64
	maxIsoDetailBytes = 1024
	maxSecretBytes    = 128
	maxSignalBytes    = 32
	maxDetailBytes    = 1024
)

// putAgent is the heartbeat and registration: the record is replaced, and a
// new epoch for a known id is what lets the epoch sweep release the slots of
// the process that is gone.
func (a *API) putAgent(w http.ResponseWriter, r *http.Request) error {
	id := chi.URLParam(r, "id")
	var reg jobs.AgentRegistration
	if _, err := DecodeJSON(r, &reg); err != nil {
		return err
	}
	if err := validateRegistration(id, reg); err != nil {
		return err
	}
	agent, err := a.Store.PutAgent(r.Context(), id, reg)
	if err != nil {
		return err
	}
	return WriteJSON(w, http.StatusOK, agent)
}

func validateRegistration(id string, reg jobs.AgentRegistration) error {
	ve := &jobs.ValidationError{}
	if !validAgentID(id) {
		ve.Add("id", "must be 1-128 characters of A-Z a-z 0-9 . _ : -")
	}
	if !validAgentAddress(reg.Address) {
		ve.Add("address", "must be an http or https URL with a host and no path, query or credentials, at most 2048 bytes")
	}
	if n := len(reg.Epoch); n < 1 || n > maxEpochBytes || !printableASCII(reg.Epoch) {
		ve.Add("epoch", "must be 1-128 printable ASCII characters")
	}
	if reg.Capacity < 1 || reg.Capacity > maxCapacity {
		ve.Add("capacity", "must be 1-4096")
	}
	if n := len(reg.Isolation.Mode); n > maxModeBytes || !jobs.Printable(reg.Isolation.Mode) {
		ve.Add("isolation.mode", "must be at most 64 bytes of printable UTF-8")
	}
	if n := len(reg.Isolation.Detail); n > maxIsoDetailBytes || !jobs.Printable(reg.Isolation.Detail) {
		ve.Add("isolation.detail", "must be at most 1024 bytes of printable UTF-8")
	}
	return ve.Err()
}

func validAgentID(id string) bool {
	if len(id) < 1 || len(id) > maxAgentIDBytes {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// validAgentAddress accepts the base URL the server dispatches to
// ("http://10.0.0.7:7070"); paths are the API's, not the agent's to choose.
func validAgentAddress(s string) bool {
	if len(s) < 1 || len(s) > maxAddressBytes || !printableASCII(s) {
		return false
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return false
	}
	return u.User == nil && (u.Path == "" || u.Path == "/") && u.RawQuery == "" && u.Fragment == "" && !u.ForceQuery
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

type resultAnswer struct {
	Applied bool `json:"applied"`
}

// postResult applies an agent's report. The secret is compared (as a hash,
// in constant time) by the store's transition before the state or identity
// is looked at, so a wrong secret changes nothing, not even a slot proof.
// A repeat of an applied envelope answers like the first; an envelope for
// another dispatch identity is 409 stale, which ends the agent's retries.
func (a *API) postResult(w http.ResponseWriter, r *http.Request) error {
	id, err := jobID(r)
	if err != nil {
		return err
	}
	var env jobs.ResultEnvelope
	if _, err := DecodeJSON(r, &env); err != nil {
		return err
	}
	if err := validateEnvelope(env); err != nil {
		return err
	}
	job, applied, err := a.Store.CompleteWithResult(r.Context(), id, env)
	if err != nil {
		a.Logger.WarnContext(r.Context(), "result_rejected",
			"request_id", w.Header().Get("X-Request-Id"), "job_id", id,
			"invocation_id", env.InvocationID, "dispatch_revision", env.DispatchRevision, "err", err.Error())
		return err
	}
	a.Logger.InfoContext(r.Context(), "result_accepted",
		"request_id", w.Header().Get("X-Request-Id"), "job_id", id, "invocation_id", env.InvocationID,
		"code", string(env.Code), "proof", string(env.Proof), "state", string(job.State), "changed", applied)
	return WriteJSON(w, http.StatusOK, resultAnswer{Applied: true})
}

var agentCodes = map[jobs.ResultCode]bool{
	jobs.CodeExitCommitted: true, jobs.CodeExitNotCommitted: true, jobs.CodeExitUnclassified: true,
	jobs.CodeKilledSignal: true, jobs.CodeKilledOOM: true, jobs.CodeKilledDeadline: true,
	jobs.CodePreInvocationRejected: true, jobs.CodeNeverLaunched: true,
}

var agentPhases = map[jobs.Phase]bool{
	jobs.PhasePreInvocationRejected: true, jobs.PhaseNativeReturn: true, jobs.PhaseIndeterminateAfterLaunch: true,
}

// agentProofs are the proofs an agent can hold; the others are the
// server's (NOT_ENQUEUED, AGENT_EPOCH_REPLACED) or an operator's.
var agentProofs = map[jobs.Proof]bool{
	jobs.ProofNone: true, jobs.ProofChildReaped: true, jobs.ProofNeverLaunched: true,
}

// validateEnvelope checks bounds only; it never compares the secret, so
// its answer says nothing about whether a guessed secret was right.
func validateEnvelope(env jobs.ResultEnvelope) error {
	ve := &jobs.ValidationError{}
	if env.DispatchRevision < 1 {
		ve.Add("dispatch_revision", "must be at least 1")
	}
	if u, err := uuid.Parse(env.InvocationID); err != nil || u.String() != strings.ToLower(env.InvocationID) {
		ve.Add("invocation_id", "must be a UUID")
	}
	if n := len(env.AgentEpoch); n < 1 || n > maxEpochBytes || !printableASCII(env.AgentEpoch) {
		ve.Add("agent_epoch", "must be 1-128 printable ASCII characters")
	}
	if n := len(env.Secret); n < 1 || n > maxSecretBytes || !printableASCII(env.Secret) {
		ve.Add("secret", "must be 1-128 printable ASCII characters")
	}
	if !agentCodes[env.Code] {
		ve.Add("code", "must be a result code an agent reports")
	}
	if !agentPhases[env.Phase] {
		ve.Add("phase", "must be PRE_INVOCATION_REJECTED, NATIVE_RETURN or INDETERMINATE_AFTER_LAUNCH")
	}
	if env.ExitCode != nil && (*env.ExitCode < 0 || *env.ExitCode > jobs.MaxExitCode) {
		ve.Add("exit_code", "must be 0-255")
	}
	if n := len(env.Signal); n > maxSignalBytes || !printableASCII(env.Signal) {
		ve.Add("signal", "must be at most 32 printable ASCII characters")
	}
	if n := len(env.Detail); n > maxDetailBytes || !jobs.Printable(env.Detail) {
		ve.Add("detail", "must be at most 1024 bytes of printable UTF-8")
	}
	if !agentProofs[env.Proof] {
		ve.Add("proof", "must be NONE, CHILD_REAPED or NEVER_LAUNCHED")
	}
	return ve.Err()
}
