package handlers

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"jobfence/internal/problem"
)

// MaxBodyBytes bounds every request body.
const MaxBodyBytes = 1 << 20

// limitBody caps every body before any handler reads it, so a handler that
// forgets cannot be made to buffer more.
func limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
		}
		next.ServeHTTP(w, r)
	})
}

// CheckContentType accepts application/json with at most a utf-8 charset.
func CheckContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return problem.ErrUnsupportedMediaType
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return problem.ErrUnsupportedMediaType
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return problem.ErrUnsupportedMediaType
		}
	}
	return nil
}

// DecodeJSON reads the request body strictly into v (a pointer to a struct):
// the body must be one JSON object sent as application/json, at most
// MaxBodyBytes, with no unknown, duplicate or case-variant member, valid
// UTF-8, values of the declared JSON types and nothing after it. It returns
// the body bytes for hashing.
func DecodeJSON(r *http.Request, v any) ([]byte, error) {
	if err := CheckContentType(r); err != nil {
		return nil, err
	}
	if r.Body == nil {
		return nil, &problem.MalformedError{Reason: "the body is empty"}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) || len(body) > MaxBodyBytes {
		return nil, problem.ErrTooLarge
	}
	if err != nil {
		return nil, &problem.MalformedError{Reason: "the body could not be read"}
	}
	if err := Unmarshal(body, v); err != nil {
		return nil, err
	}
	return body, nil
}

// Unmarshal applies DecodeJSON's rules to body; exported for the fuzz test
// and for callers that already hold the bytes.
func Unmarshal(body []byte, v any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return &problem.MalformedError{Reason: "the body is empty"}
	}
	if trimmed[0] != '{' {
		return &problem.MalformedError{Reason: "the body must be one JSON object"}
	}
	if !utf8.Valid(body) {
		return &problem.MalformedError{Reason: "invalid UTF-8"}
	}
	// go-json-experiment rejects duplicate names and invalid UTF-8 by
	// default, and matches names case-sensitively, so a case variant is an
	// unknown member. Unmarshal on the bytes also rejects anything after the
	// object, without a stream decoder's buffer per request; a body it
	// refuses is decoded again as a stream, only to say precisely why.
	if json.Unmarshal(body, v, json.RejectUnknownMembers(true)) == nil {
		return nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv.Elem().SetZero() // the stream decode must not merge into a partial fill
	}
	dec := jsontext.NewDecoder(bytes.NewReader(body))
	if err := json.UnmarshalDecode(dec, v, json.RejectUnknownMembers(true)); err != nil {
		return malformed(err)
	}
	if _, err := dec.ReadToken(); err != io.EOF {
		return &problem.MalformedError{Reason: "data after the JSON object"}
	}
	return nil
}

// malformed names the field the decoder stopped at without echoing the
// submitted value (it may be a secret).
func malformed(err error) error {
	var se *json.SemanticError
	if errors.As(err, &se) {
		field := fieldName(se.JSONPointer)
		switch {
		case errors.Is(se.Err, json.ErrUnknownName):
			return &problem.MalformedError{Field: field, Reason: "unknown field"}
		case se.JSONKind != 0 && se.GoType != nil:
			return &problem.MalformedError{Field: field, Reason: "a JSON " + kindName(se.JSONKind) + " is not the expected type"}
		default:
			return &problem.MalformedError{Field: field, Reason: "unexpected value"}
		}
	}
	var sy *jsontext.SyntacticError
	if errors.As(err, &sy) {
		field := fieldName(sy.JSONPointer)
		switch {
		case errors.Is(sy.Err, jsontext.ErrDuplicateName):
			return &problem.MalformedError{Field: field, Reason: "duplicate field"}
		default:
			return &problem.MalformedError{Field: field, Reason: "invalid JSON syntax"}
		}
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		return &problem.MalformedError{Reason: "truncated JSON"}
	}
	return &problem.MalformedError{Reason: "invalid JSON"}
}

// fieldName spells a JSON pointer the way validation errors name fields
// (/limits/pids -> limits.pids, /command/0 -> command[0]).
func fieldName(p jsontext.Pointer) string {
	var b strings.Builder
	for tok := range p.Tokens() {
		if _, err := strconv.Atoi(tok); err == nil && b.Len() > 0 {
			b.WriteString("[" + tok + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tok)
	}
	return b.String()
}

func kindName(k jsontext.Kind) string {
	switch k {
	case 'n':
		return "null"
	case 'f', 't':
		return "boolean"
	case '"':
		return "string"
	case '0':
		return "number"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "value"
}
