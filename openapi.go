// Package jobfence holds the HTTP contract, openapi.yaml, so the server can
// serve it and tests can validate against the very bytes that ship.
package jobfence

import _ "embed"

// OpenAPI is openapi.yaml.
//
//go:embed openapi.yaml
var OpenAPI []byte
