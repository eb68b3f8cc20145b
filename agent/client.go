package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

// ErrEpochMismatch is Tombstone's answer when the agent runs another epoch:
// nothing was recorded, and only the epoch sweep or the deadline apply.
var ErrEpochMismatch = errors.New("agent runs another epoch")

// Client is what the server uses to talk to agents. Its zero value is not
// usable: HTTP must be set (with a timeout), Token is the dispatch token.
type Client struct {
	HTTP  *http.Client
	Token string
}

func baseURL(addr string) string {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/")
}

func (c *Client) do(ctx context.Context, method, u string, body any) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, nil, err
	}
	return resp, b, nil
}

// refusalOf returns the slug when the answer is a typed refusal with its
// documented status, "" otherwise.
func refusalOf(resp *http.Response, body []byte) string {
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		return ""
	}
	var p Problem
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	slug, ok := strings.CutPrefix(p.Type, ProblemTypeBase)
	if !ok {
		return ""
	}
	if st, known := RefusalStatus[slug]; known && st == resp.StatusCode && p.Status == st {
		return slug
	}
	return ""
}

// Dispatch sends one dispatch. ("", nil): 202, enqueued exactly once.
// (slug, nil): a typed refusal; the invocation never executes. ("", err):
// anything else, and the outcome is unknown.
func (c *Client) Dispatch(ctx context.Context, addr string, req DispatchRequest) (string, error) {
	resp, body, err := c.do(ctx, http.MethodPost, baseURL(addr)+"/v1/dispatches", req)
	if err != nil {
		return "", fmt.Errorf("dispatch %s: %w", req.InvocationID, err)
	}
	if resp.StatusCode == http.StatusAccepted {
		return "", nil
	}
	if slug := refusalOf(resp, body); slug != "" {
		return slug, nil
	}
	return "", fmt.Errorf("dispatch %s: unexpected answer %d", req.InvocationID, resp.StatusCode)
}

// Status asks what the agent knows of an invocation.
func (c *Client) Status(ctx context.Context, addr, invocationID string) (string, error) {
	resp, body, err := c.do(ctx, http.MethodGet, baseURL(addr)+"/v1/invocations/"+url.PathEscape(invocationID), nil)
	if err != nil {
		return "", err
	}
	return decodeStatus(resp, body)
}

// Tombstone asks the agent to make sure an invocation never runs. It answers
// "tombstoned" when the agent had not received it (and now never will run
// it), the current status when it had, or ErrEpochMismatch.
func (c *Client) Tombstone(ctx context.Context, addr, invocationID, epoch string) (string, error) {
	resp, body, err := c.do(ctx, http.MethodPost, baseURL(addr)+"/v1/invocations/"+url.PathEscape(invocationID)+"/tombstone",
		TombstoneRequest{AgentEpoch: epoch})
	if err != nil {
		return "", err
	}
	if refusalOf(resp, body) == RefusalEpochMismatch {
		return "", ErrEpochMismatch
	}
	return decodeStatus(resp, body)
}

func decodeStatus(resp *http.Response, body []byte) (string, error) {
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("unexpected answer %d", resp.StatusCode)
	}
	var s InvocationStatus
	if err := json.Unmarshal(body, &s); err != nil {
		return "", fmt.Errorf("undecodable status: %w", err)
	}
	switch s.Status {
	case StatusUnknown, StatusQueued, StatusRunning, StatusReported, StatusTombstoned:
		return s.Status, nil
	}
	return "", fmt.Errorf("unknown status %q", s.Status)
}
