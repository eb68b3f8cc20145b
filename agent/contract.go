package agent

import (
	_ "embed"
	"net/http"
)

// OpenAPI is agent/openapi.yaml, the contract of the agent's listener. It is
// served at /openapi.yaml and the agent's tests validate every answer they
// receive against these very bytes.
//
//go:embed openapi.yaml
var OpenAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/yaml")
	_, _ = w.Write(OpenAPI)
}
