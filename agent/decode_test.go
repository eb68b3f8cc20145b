package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The dispatch and tombstone bodies follow API.md's input rules: a case
// variant, a duplicate member, trailing data, a non-object, invalid UTF-8 or
// another media type is refused before anything is read from it.
func TestReadJSONIsStrict(t *testing.T) {
	cases := []struct {
		name, ct, body string
		status         int
	}{
		{"case variant", "application/json", `{"Agent_Epoch":"e1"}`, 400},
		{"duplicate member", "application/json", `{"agent_epoch":"e1","agent_epoch":"e2"}`, 400},
		{"unknown member", "application/json", `{"agent_epoch":"e1","x":1}`, 400},
		{"trailing data", "application/json", `{"agent_epoch":"e1"}{}`, 400},
		{"not an object", "application/json", `["e1"]`, 400},
		{"invalid utf-8", "application/json", "{\"agent_epoch\":\"e\xff\"}", 400},
		{"wrong type", "application/json", `{"agent_epoch":1}`, 400},
		{"media type", "text/plain", `{"agent_epoch":"e1"}`, 415},
		{"media type parameter", "application/json; profile=x", `{"agent_epoch":"e1"}`, 415},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/invocations/x/tombstone", strings.NewReader(c.body))
			r.Header.Set("Content-Type", c.ct)
			w := httptest.NewRecorder()
			var req TombstoneRequest
			tooLarge, err := readJSON(w, r, &req)
			if err == nil || tooLarge {
				t.Fatalf("accepted: %+v (too large %v)", req, tooLarge)
			}
			if w.Code != c.status || w.Header().Get("Content-Type") != "application/problem+json" {
				t.Fatalf("answer %d %s", w.Code, w.Header().Get("Content-Type"))
			}
		})
	}

	r := httptest.NewRequest(http.MethodPost, "/v1/invocations/x/tombstone", strings.NewReader(` {"agent_epoch":"e1"} `))
	r.Header.Set("Content-Type", "application/json; charset=UTF-8")
	var req TombstoneRequest
	if _, err := readJSON(httptest.NewRecorder(), r, &req); err != nil || req.AgentEpoch != "e1" {
		t.Fatalf("a valid body: %+v %v", req, err)
	}

	// The dispatcher encodes with encoding/json; its output must decode.
	want := DispatchRequest{JobID: "j1", InvocationID: "i1", Secret: "s", AgentEpoch: "e1", Credentials: map[string]string{"A": "b"}}
	want.Spec.Command = []string{"/bin/true"}
	raw, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	r = httptest.NewRequest(http.MethodPost, "/v1/dispatches", strings.NewReader(string(raw)))
	r.Header.Set("Content-Type", "application/json")
	var got DispatchRequest
	if _, err := readJSON(httptest.NewRecorder(), r, &got); err != nil {
		t.Fatalf("an encoded dispatch: %v", err)
	}
	if got.JobID != want.JobID || got.Credentials["A"] != "b" || got.Spec.Command[0] != "/bin/true" || !got.Deadline.Equal(want.Deadline) {
		t.Fatalf("decoded %+v", got)
	}
}

// An unknown path or a method a path does not serve is problem+json too,
// with Allow on a 405.
func TestUnknownRouteAndMethodAreProblems(t *testing.T) {
	ta := startAgent(t, nil)
	cases := []struct {
		method, path string
		status       int
		allow        string
	}{
		{http.MethodGet, "/v1/nothing", http.StatusNotFound, ""},
		{http.MethodGet, "/v1/dispatches", http.StatusMethodNotAllowed, "POST"},
		{http.MethodDelete, "/v1/invocations/i1", http.StatusMethodNotAllowed, "GET, HEAD"},
	}
	for _, c := range cases {
		r, err := http.NewRequest(c.method, ta.addr+c.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := ta.http.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		var p Problem
		derr := json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/problem+json" || derr != nil ||
			p.Status != c.status || p.RequestID == "" || resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d %s Allow=%q %+v %v", c.method, c.path, resp.StatusCode,
				resp.Header.Get("Content-Type"), resp.Header.Get("Allow"), p, derr)
		}
	}
	// Served routes still answer as before.
	resp, err := ta.http.Get(ta.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
}
