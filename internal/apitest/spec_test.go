package apitest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// other is a document unlike openapi.yaml, standing in for the agent's.
var other = []byte(`openapi: 3.1.0
info: {title: other, version: "1"}
paths:
  /ping:
    get:
      responses:
        "200":
          description: pong
          content:
            application/json:
              schema:
                type: object
                additionalProperties: false
                required: [pong]
                properties:
                  pong: {type: boolean}
  /text:
    get:
      responses:
        "200":
          description: fixed text
          content:
            text/plain:
              schema: {type: string, enum: ["ok\n"]}
components:
  schemas:
    Problem:
      type: object
      required: [type, status, request_id]
      properties:
        type: {type: string}
        status: {type: integer}
        request_id: {type: string}
`)

// TestTransportForOtherDocument checks answers against the document it was
// given, not openapi.yaml, including the media type and text of non-JSON
// answers.
func TestTransportForOtherDocument(t *testing.T) {
	cases := []struct {
		name, path, ctype, body string
		status                  int
		wantErr                 string
	}{
		{"conforming json", "/ping", "application/json", `{"pong":true}`, 200, ""},
		{"json off schema", "/ping", "application/json", `{"pong":"yes"}`, 200, "does not match"},
		{"path only in openapi.yaml", "/healthz", "application/json", `{"status":"ok"}`, 200, "no route"},
		{"conforming text", "/text", "text/plain; charset=utf-8", "ok\n", 200, ""},
		{"undocumented media type", "/text", "text/html", "ok\n", 200, "documented media type"},
		{"text off schema", "/text", "text/plain", "fine\n", 200, "text body"},
		{"undocumented status", "/ping", "application/problem+json", `{"type":"x","status":500,"request_id":"RID"}`, 500, "status is not supported"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Request-Id", "RID")
				w.Header().Set("Content-Type", c.ctype)
				w.WriteHeader(c.status)
				_, _ = w.Write([]byte(c.body))
			}))
			defer srv.Close()
			rec := &recorder{TB: t}
			client := &http.Client{Transport: TransportFor(rec, other, nil)}
			resp, err := client.Get(srv.URL + c.path)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			joined := strings.Join(rec.errors, "\n")
			switch {
			case c.wantErr == "" && len(rec.errors) != 0:
				t.Errorf("conforming answer reported: %s", joined)
			case c.wantErr != "" && !strings.Contains(joined, c.wantErr):
				t.Errorf("want a report containing %q, got %q", c.wantErr, joined)
			}
		})
	}
}

// Each document loads once, and the two do not share a router.
func TestLoadKeepsDocumentsApart(t *testing.T) {
	d1, _ := Load(t, other)
	d2, _ := Load(t, other)
	if d1 != d2 {
		t.Fatal("the same document loaded twice")
	}
	root, _ := Doc(t)
	if root == d1 || root.Info.Title == d1.Info.Title {
		t.Fatalf("openapi.yaml and the other document share %q", d1.Info.Title)
	}
}
