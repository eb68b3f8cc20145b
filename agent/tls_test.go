package agent

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"jobfence/internal/apitest"
	"jobfence/jobs"
)

// testCA makes a CA and a 127.0.0.1 server certificate signed by it.
func testCA(t *testing.T) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "jobfence test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "agent"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// The dispatch listener over TLS: plain HTTP gets nowhere, a client that
// trusts the CA dispatches and the job runs.
func TestDispatchOverTLS(t *testing.T) {
	pool, cert := testCA(t)
	ta := startAgent(t, func(c *Config) {
		c.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
	})
	reg := ta.fs.firstRegistration(t)
	if !strings.HasPrefix(reg.Address, "https://127.0.0.1:") {
		t.Fatalf("advertised %s", reg.Address)
	}
	plain := "http://" + strings.TrimPrefix(reg.Address, "https://")
	if resp, err := http.Get(plain + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP reached the TLS listener")
		}
	}
	untrusting := &Client{HTTP: &http.Client{Timeout: 10 * time.Second}, Token: dispatchToken}
	if _, err := untrusting.Status(t.Context(), reg.Address, "x"); err == nil {
		t.Fatal("a client without the CA trusted the listener")
	}
	// Over TLS too, every answer is held to agent/openapi.yaml.
	trusting := apitest.TransportFor(t, OpenAPI, &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}})
	c := &Client{HTTP: &http.Client{Timeout: 30 * time.Second, Transport: trusting}, Token: dispatchToken}
	req := ta.dispatch(exe(t), "helper", "exit", "0")
	if slug, err := c.Dispatch(t.Context(), reg.Address, req); slug != "" || err != nil {
		t.Fatalf("dispatch over TLS: %q %v", slug, err)
	}
	checkEnvelope(t, req, ta.fs.reportFor(t, req.JobID), jobs.CodeExitCommitted, jobs.PhaseNativeReturn, jobs.ProofChildReaped)
	c.HTTP.CloseIdleConnections()
	untrusting.HTTP.CloseIdleConnections()
}
