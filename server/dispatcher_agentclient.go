package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"jobfence/agent"
)

// HTTPAgentClient is the dispatcher's AgentClient over the agents' HTTP API
// (agent.Client), presenting the server's dispatch token.
type HTTPAgentClient struct {
	c *agent.Client
}

// NewHTTPAgentClient reads the dispatch token from tokenFile (surrounding
// white space ignored). Per-call timeouts come from the caller's context.
func NewHTTPAgentClient(tokenFile string) (*HTTPAgentClient, error) {
	if tokenFile == "" {
		return nil, errors.New("dispatch-token-file is required to reach agents")
	}
	raw, err := os.ReadFile(tokenFile)
	if err != nil {
		return nil, fmt.Errorf("dispatch token: %w", err)
	}
	tok := strings.TrimSpace(string(raw))
	if len(tok) < 16 {
		return nil, errors.New("dispatch token: the file must hold a token of at least 16 characters")
	}
	return &HTTPAgentClient{c: &agent.Client{Token: tok, HTTP: &http.Client{
		// A dispatch goes to the address the agent registered and nowhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport: &http.Transport{
			Proxy:                 nil,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       90 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
		},
	}}}, nil
}

// Dispatch implements AgentClient.
func (h *HTTPAgentClient) Dispatch(ctx context.Context, address string, d AgentDispatch) error {
	j := d.Job
	if j == nil || j.Dispatch == nil {
		return errors.New("dispatch without an identity")
	}
	slug, err := h.c.Dispatch(ctx, address, agent.DispatchRequest{
		JobID: j.ID, DispatchRevision: j.Dispatch.DispatchRevision, InvocationID: j.Dispatch.InvocationID,
		Secret: d.Secret, AgentEpoch: j.Dispatch.AgentEpoch, Deadline: j.Dispatch.Deadline,
		Spec: j.Spec, Credentials: d.Credentials,
	})
	if err != nil {
		return err
	}
	if slug != "" {
		return &RefusalError{Type: slug, Status: agent.RefusalStatus[slug]}
	}
	return nil
}

// Tombstone implements AgentClient.
func (h *HTTPAgentClient) Tombstone(ctx context.Context, address, invocationID, epoch string) (string, error) {
	st, err := h.c.Tombstone(ctx, address, invocationID, epoch)
	if errors.Is(err, agent.ErrEpochMismatch) {
		return "", &RefusalError{Type: RefusalEpochMismatch, Status: agent.RefusalStatus[agent.RefusalEpochMismatch]}
	}
	return st, err
}
