package agent

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"jobfence/internal/logging"
)

// A received dispatch's secret and credential values are registered before
// anything logs, so a record naming them shows neither; the secret set stays
// bounded while credential values stay hidden.
func TestReceivedSecretsAreRedacted(t *testing.T) {
	r := logging.NewRedactor()
	var out bytes.Buffer
	lg, _ := logging.New(logging.Config{Format: logging.FormatJSON, Writer: &out}, r)
	a := &Agent{cfg: Config{Secrets: r}}
	req := &DispatchRequest{Secret: "0123456789abcdef0123456789abcdef", Credentials: map[string]string{"DB": "hunter2-credential"}}
	a.learnSecrets(req)
	lg.Info("probe", "detail", "secret "+req.Secret+" and "+req.Credentials["DB"])
	if s := out.String(); strings.Contains(s, req.Secret) || strings.Contains(s, "hunter2-credential") || !strings.Contains(s, logging.Redacted) {
		t.Fatalf("log output: %s", s)
	}
	for i := range recentSecrets {
		a.learnSecrets(&DispatchRequest{Secret: fmt.Sprintf("%032x", i+1), Credentials: map[string]string{"DB": "hunter2-credential"}})
	}
	if n := r.Len(); n != recentSecrets+1 {
		t.Fatalf("redactor holds %d values, want %d secrets and one credential", n, recentSecrets+1)
	}
	out.Reset()
	lg.Info("probe", "detail", req.Secret+" "+req.Credentials["DB"])
	if s := out.String(); !strings.Contains(s, req.Secret) || strings.Contains(s, "hunter2-credential") {
		t.Fatalf("after %d newer secrets the oldest should be dropped and the credential kept: %s", recentSecrets, s)
	}
}
