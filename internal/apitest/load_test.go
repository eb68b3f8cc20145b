package apitest

import "testing"

func TestDocLoads(t *testing.T) {
	d, _ := Doc(t)
	if d.OpenAPI != "3.1.0" {
		t.Fatalf("openapi version %q", d.OpenAPI)
	}
	if len(d.Paths.Map()) < 15 {
		t.Fatalf("only %d paths", len(d.Paths.Map()))
	}
}
