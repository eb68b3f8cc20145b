package server

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"testing"
	"time"

	"jobfence/internal/etcdtest"
	"jobfence/internal/tlsconfig/tlstest"
)

// A replica serving TLS advertises https by default, and the others verify
// it with their --tls-ca: with the CA its cursor shows, without it the
// replica is unreachable (an unverified peer is never believed).
func TestReplicaCursorOverTLS(t *testing.T) {
	caFile, certFile, keyFile := tlstest.New(t)
	var prefix string
	a := startAPI(t, func(c *Config) { prefix = c.Prefix; c.ReplicaID = "replica-a"; c.TLSCA = caFile })
	noCA := startAPI(t, func(c *Config) { c.Prefix = prefix; c.ReplicaID = "replica-c" })

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{
		Listener: ln, EtcdEndpoints: []string{etcdtest.Endpoint()}, Prefix: prefix,
		TokensFile: writeAPITokens(t, t.TempDir()), ElectionTTL: 2 * time.Second, ReplicaID: "replica-b",
		TLSCert: certFile, TLSKey: keyFile,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("TLS replica: %v", err)
		}
	})
	<-b.Started()
	want := "https://" + b.Addr()
	pollUntil(t, "the TLS replica registers its https address", func() bool {
		for _, r := range a.srv.Store().Replicas() {
			if r.ID == "replica-b" {
				if r.URL != want {
					t.Fatalf("registered %q, want %q", r.URL, want)
				}
				return true
			}
		}
		return false
	})
	pollUntil(t, "A, trusting the CA, shows B's cursor", func() bool {
		n, err := strconv.ParseInt(cursorIn(overviewRows(t, a.base)["replica-b"], "replica-b"), 10, 64)
		return err == nil && n > 0
	})
	pollUntil(t, "C, without the CA, shows B unreachable", func() bool {
		return regexp.MustCompile(`unreachable`).MatchString(overviewRows(t, noCA.base)["replica-b"])
	})
}
