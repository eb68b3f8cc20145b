package server

import (
	"context"
	"crypto/tls"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"jobfence/internal/metrics"
	"jobfence/internal/tlsconfig"
	"jobfence/internal/tlsconfig/tlstest"
	"jobfence/jobs"
)

// Must-show 5: with a CA the test generates, the server's and the agent's
// listeners speak only TLS (plain HTTP gets no answer of theirs), the agent
// registers and reports over HTTPS with --tls-ca, and the server dispatches
// to the agent's HTTPS listener, so a job runs to COMMITTED.
func testTLSEndToEnd(t *testing.T, bin string) {
	ca, cert, key := tlstest.New(t)
	clientTLS, err := tlsconfig.Client(ca)
	if err != nil {
		t.Fatal(err)
	}
	o := newOps(t, bin, clientTLS)
	srv := o.startServer("tls1", nil,
		"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca)
	if !strings.HasPrefix(srv.base, "https://") {
		t.Fatalf("server base %s: the listener is not TLS", srv.base)
	}
	agentAddr := freeAddr(t)
	o.startAgent("agent-tls", srv.base, agentAddr, srv.base,
		"--tls-cert", cert, "--tls-key", key, "--tls-ca", ca)
	agentBase := o.agents(srv.base)[0].Address
	if !strings.HasPrefix(agentBase, "https://") {
		t.Fatalf("agent advertises %s, want https", agentBase)
	}

	plain := &http.Client{Timeout: 10 * time.Second}
	untrusting := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}}
	for name, base := range map[string]string{"server": srv.base, "agent": agentBase} {
		httpURL := "http://" + strings.TrimPrefix(base, "https://") + "/healthz"
		if resp, err := plain.Get(httpURL); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				t.Errorf("%s answered plain HTTP with 200", name)
			}
		}
		// Without the CA the certificate is not trusted.
		if resp, err := untrusting.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			t.Errorf("%s: a client without the CA connected", name)
		}
		if st, _ := o.callAt(base, "GET", "/healthz", "", nil); st != http.StatusOK {
			t.Errorf("%s over TLS with the CA: %d", name, st)
		}
	}

	id := o.submit(srv.base, opsJob("tls/job", "exit 0"))
	j := o.waitState(srv.base, id, jobs.Committed)
	if j.Result == nil || j.Result.Code != jobs.CodeExitCommitted || j.Dispatch == nil || j.Dispatch.AgentID != "agent-tls" {
		t.Fatalf("job over TLS: result %+v dispatch %+v", j.Result, j.Dispatch)
	}
}

// The dispatcher's agent client reaches a TLS agent only once UseTLS gave it
// the CA (--tls-ca): before, the generated certificate is not trusted and the
// send's outcome is unknown, never enqueued.
func TestAgentClientUseTLS(t *testing.T) {
	ca, cert, key := tlstest.New(t)
	listenTLS, err := tlsconfig.Server(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int32
	agentSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+opsDispatchToken && r.URL.Path == "/v1/dispatches" {
			got.Add(1)
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	agentSrv.TLS = listenTLS
	// The untrusted handshake below is expected; keep its complaint out of the output.
	agentSrv.Config.ErrorLog = log.New(io.Discard, "", 0)
	agentSrv.StartTLS()
	defer agentSrv.Close()

	tokenFile := filepath.Join(t.TempDir(), "dispatch-token")
	if err := os.WriteFile(tokenFile, []byte(opsDispatchToken), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewHTTPAgentClient(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	d := AgentDispatch{Secret: "00112233445566778899aabbccddeeff", Job: &jobs.Job{
		ID:       "01930000-0000-7000-8000-000000000001",
		Dispatch: &jobs.Dispatch{InvocationID: "inv-1", AgentEpoch: "e1", DispatchRevision: 7, Deadline: time.Now().Add(time.Minute)},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = c.Dispatch(ctx, agentSrv.URL, d)
	if err == nil || DispatchClassification(err) != metrics.DispatchUnknown || got.Load() != 0 {
		t.Fatalf("without the CA: err %v, %d received", err, got.Load())
	}
	clientTLS, err := tlsconfig.Client(ca)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{agentTLS: clientTLS}
	c.UseTLS(s.AgentTLS())
	if err := c.Dispatch(ctx, agentSrv.URL, d); err != nil || got.Load() != 1 {
		t.Fatalf("with the CA: err %v, %d received", err, got.Load())
	}
}
