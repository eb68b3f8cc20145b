package handlers

import (
	"bytes"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"jobfence/internal/problem"
	"jobfence/jobs"
)

func TestUnmarshalRejects(t *testing.T) {
	cases := []struct {
		name, body, field string
	}{
		{"not JSON", `{"target":`, ""},
		{"array", `[{"target":"a/b"}]`, ""},
		{"null", `null`, ""},
		{"string", `"a/b"`, ""},
		{"unknown field", `{"target":"a/b","command":["/bin/true"],"comand":[]}`, "comand"},
		{"case variant", `{"Target":"a/b","command":["/bin/true"]}`, "Target"},
		{"duplicate", `{"target":"a/b","target":"c/d","command":["/bin/true"]}`, "target"},
		{"trailing", `{"target":"a/b","command":["/bin/true"]} {}`, ""},
		{"trailing garbage", `{"target":"a/b","command":["/bin/true"]}x`, ""},
		{"wrong type", `{"target":7,"command":["/bin/true"]}`, "target"},
		{"wrong nested type", `{"target":"a/b","command":["/bin/true"],"limits":{"pids":"64"}}`, "limits.pids"},
		{"wrong element type", `{"target":"a/b","command":["/bin/true",3]}`, "command[1]"},
		{"invalid utf8", "{\"target\":\"a/\xff\",\"command\":[\"/bin/true\"]}", ""},
		{"empty", ``, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var s jobs.Submission
			err := Unmarshal([]byte(c.body), &s)
			var me *problem.MalformedError
			if !errors.As(err, &me) {
				t.Fatalf("err = %v, want MalformedError", err)
			}
			if c.field != "" && me.Field != c.field {
				t.Errorf("field %q, want %q (%v)", me.Field, c.field, err)
			}
		})
	}
}

func TestUnmarshalAccepts(t *testing.T) {
	var s jobs.Submission
	if err := Unmarshal([]byte(" {\"target\":\"a/b\",\"command\":[\"/bin/true\"],\"limits\":{\"pids\":3}}\n"), &s); err != nil {
		t.Fatal(err)
	}
	if s.Target != "a/b" || *s.Limits.Pids != 3 {
		t.Fatalf("%+v", s)
	}
}

func TestDecodeJSONContentTypeAndSize(t *testing.T) {
	ok := `{"target":"a/b","command":["/bin/true"]}`
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "application/json;charset=UTF-8"} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(ok))
		r.Header.Set("Content-Type", ct)
		var s jobs.Submission
		if _, err := DecodeJSON(r, &s); err != nil {
			t.Errorf("%s: %v", ct, err)
		}
	}
	for _, ct := range []string{"", "text/plain", "application/json; charset=latin1", "application/x-www-form-urlencoded", "application/json; foo=bar"} {
		r := httptest.NewRequest("POST", "/", strings.NewReader(ok))
		if ct != "" {
			r.Header.Set("Content-Type", ct)
		}
		var s jobs.Submission
		if _, err := DecodeJSON(r, &s); !errors.Is(err, problem.ErrUnsupportedMediaType) {
			t.Errorf("%q: err = %v", ct, err)
		}
	}
	big := `{"target":"a/b","command":["/bin/true"],"operation":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	r := httptest.NewRequest("POST", "/", bytes.NewReader([]byte(big)))
	r.Header.Set("Content-Type", "application/json")
	var s jobs.Submission
	if _, err := DecodeJSON(r, &s); !errors.Is(err, problem.ErrTooLarge) {
		t.Errorf("big: err = %v", err)
	}
}

// FuzzUnmarshal: any input either decodes or is a MalformedError; nothing
// else escapes, and nothing panics.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{`{"target":"a/b","command":["/x"]}`, `{"limits":{"pids":1}}`, `[]`, `{"a":1}{`, "{\"\xff\":1}"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var s jobs.Submission
		err := Unmarshal(b, &s)
		var me *problem.MalformedError
		if err != nil && !errors.As(err, &me) {
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
	})
}
