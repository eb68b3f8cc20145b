// Package apitest checks every answer a test receives against openapi.yaml,
// so the contract is exercised by real traffic and not only by hand-written
// assertions. Wrap a client's transport with Transport and every response is
// validated (status, content type, body schema, X-Request-Id) as it arrives.
// TransportFor does the same against another document, such as the agent's
// agent/openapi.yaml.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"jobfence"
)

// contract is one document, loaded and validated once per test binary.
type contract struct {
	once   sync.Once
	doc    *openapi3.T
	router routers.Router
	err    error
}

// contracts maps a document's bytes to its loaded form, so the server's
// openapi.yaml and the agent's each load once however many tests use them.
var contracts sync.Map

// Load loads and validates the OpenAPI document spec once per test binary.
func Load(t testing.TB, spec []byte) (*openapi3.T, routers.Router) {
	t.Helper()
	v, _ := contracts.LoadOrStore(string(spec), &contract{})
	c := v.(*contract)
	c.once.Do(func() {
		loader := openapi3.NewLoader()
		c.doc, c.err = loader.LoadFromData(spec)
		if c.err != nil {
			return
		}
		if c.err = c.doc.Validate(context.Background()); c.err != nil {
			return
		}
		// Tests listen on random ports: match routes by path only.
		c.doc.Servers = nil
		c.router, c.err = legacy.NewRouter(c.doc)
	})
	if c.err != nil {
		t.Fatalf("openapi document %q: %v", title(spec), c.err)
	}
	return c.doc, c.router
}

// title names a document in a failure without printing all of it.
func title(spec []byte) string {
	for line := range strings.Lines(string(spec)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == "title" {
			return strings.TrimSpace(v)
		}
	}
	return "untitled"
}

// Doc loads and validates openapi.yaml once per test binary.
func Doc(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	return Load(t, jobfence.OpenAPI)
}

// Transport wraps base (nil = http.DefaultTransport) so every response is
// validated against openapi.yaml; a mismatch fails t.
func Transport(t testing.TB, base http.RoundTripper) http.RoundTripper {
	return TransportFor(t, jobfence.OpenAPI, base)
}

// TransportFor is Transport against another document, such as the agent's.
func TransportFor(t testing.TB, spec []byte, base http.RoundTripper) http.RoundTripper {
	t.Helper()
	d, r := Load(t, spec)
	if base == nil {
		base = http.DefaultTransport
	}
	return &validating{t: t, base: base, doc: d, router: r}
}

// Client is an http.Client whose every answer is validated.
func Client(t testing.TB) *http.Client {
	return &http.Client{Transport: Transport(t, nil)}
}

// ClientFor is Client against another document.
func ClientFor(t testing.TB, spec []byte) *http.Client {
	return &http.Client{Transport: TransportFor(t, spec, nil)}
}

type validating struct {
	t      testing.TB
	base   http.RoundTripper
	doc    *openapi3.T
	router routers.Router
}

func (v *validating) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := v.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if err := v.check(req, resp); err != nil {
		v.t.Errorf("%s %s -> %d does not match openapi.yaml: %v", req.Method, req.URL.Path, resp.StatusCode, err)
	}
	return resp, nil
}

func mediaType(h http.Header) string {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	return mt
}

// check validates resp and leaves its body readable for the caller.
func (v *validating) check(req *http.Request, resp *http.Response) error {
	if resp.Header.Get("X-Request-Id") == "" {
		return fmt.Errorf("no X-Request-Id")
	}
	mt := mediaType(resp.Header)
	if mt == "text/event-stream" {
		// A stream never ends by itself; its status and type are the contract.
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("event stream with status %d", resp.StatusCode)
		}
		return nil
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode >= 400 {
		if err := v.checkProblem(resp, body); err != nil {
			return err
		}
	}
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		// Unknown paths and unserved methods have no operation; their
		// answer must still be a problem, checked above.
		if resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed {
			if resp.StatusCode == http.StatusMethodNotAllowed && resp.Header.Get("Allow") == "" {
				return fmt.Errorf("405 without Allow")
			}
			return nil
		}
		return fmt.Errorf("no route in openapi.yaml: %w", err)
	}
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true,
		MultiError:            true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	}
	if mt != "application/json" && mt != "application/problem+json" {
		// YAML and Prometheus text have no JSON schema to check; their media
		// type must still be the documented one, and a documented string
		// schema (an enum, a length) still binds the text.
		opts.ExcludeResponseBody = true
		if err := checkText(route.Operation, resp, body); err != nil {
			return err
		}
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route, Options: opts,
		},
		Status:  resp.StatusCode,
		Header:  resp.Header,
		Options: opts,
	}
	in.SetBodyBytes(body)
	return openapi3filter.ValidateResponse(context.Background(), in)
}

// checkText holds a non-JSON answer to the media type and string schema
// documented for its status.
func checkText(op *openapi3.Operation, resp *http.Response, body []byte) error {
	if op == nil || op.Responses == nil {
		return nil
	}
	ref := op.Responses.Status(resp.StatusCode)
	if ref == nil {
		ref = op.Responses.Default()
	}
	if ref == nil || ref.Value == nil || len(ref.Value.Content) == 0 {
		return nil
	}
	ct := resp.Header.Get("Content-Type")
	media := ref.Value.Content.Get(ct)
	if media == nil {
		return fmt.Errorf("answer as %q, not a documented media type", ct)
	}
	if media.Schema == nil || media.Schema.Value == nil || !media.Schema.Value.Type.Is(openapi3.TypeString) {
		return nil
	}
	if err := media.Schema.Value.VisitJSON(string(body)); err != nil {
		return fmt.Errorf("text body: %w", err)
	}
	return nil
}

func (v *validating) checkProblem(resp *http.Response, body []byte) error {
	if mt := mediaType(resp.Header); mt != "application/problem+json" {
		return fmt.Errorf("error answer as %q, not application/problem+json", mt)
	}
	var p map[string]any
	if err := json.Unmarshal(body, &p); err != nil {
		return fmt.Errorf("problem body: %w", err)
	}
	if err := v.doc.Components.Schemas["Problem"].Value.VisitJSON(p); err != nil {
		return fmt.Errorf("problem body: %w", err)
	}
	if p["request_id"] != resp.Header.Get("X-Request-Id") {
		return fmt.Errorf("request_id %v differs from X-Request-Id %q", p["request_id"], resp.Header.Get("X-Request-Id"))
	}
	if st, _ := p["status"].(float64); int(st) != resp.StatusCode {
		return fmt.Errorf("problem status %v differs from %d", p["status"], resp.StatusCode)
	}
	return nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach base.
func (v *validating) CloseIdleConnections() {
	if c, ok := v.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
