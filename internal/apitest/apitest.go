// Package apitest checks every answer a test receives against openapi.yaml,
// so the contract is exercised by real traffic and not only by hand-written
// assertions. Wrap a client's transport with Transport and every response is
// validated (status, content type, body schema, X-Request-Id) as it arrives.
package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"jobfence"
)

var (
	loadOnce sync.Once
	doc      *openapi3.T
	router   routers.Router
	loadErr  error
)

// Doc loads and validates openapi.yaml once per test binary.
func Doc(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	loadOnce.Do(func() {
		loader := openapi3.NewLoader()
		doc, loadErr = loader.LoadFromData(jobfence.OpenAPI)
		if loadErr != nil {
			return
		}
		if loadErr = doc.Validate(context.Background()); loadErr != nil {
			return
		}
		// Tests listen on random ports: match routes by path only.
		doc.Servers = nil
		router, loadErr = legacy.NewRouter(doc)
	})
	if loadErr != nil {
		t.Fatalf("openapi.yaml: %v", loadErr)
	}
	return doc, router
}

// Transport wraps base (nil = http.DefaultTransport) so every response is
// validated against openapi.yaml; a mismatch fails t.
func Transport(t testing.TB, base http.RoundTripper) http.RoundTripper {
	d, r := Doc(t)
	if base == nil {
		base = http.DefaultTransport
	}
	return &validating{t: t, base: base, doc: d, router: r}
}

// Client is an http.Client whose every answer is validated.
func Client(t testing.TB) *http.Client {
	return &http.Client{Transport: Transport(t, nil)}
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
		// YAML and Prometheus text have no JSON schema to check.
		opts.ExcludeResponseBody = true
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
