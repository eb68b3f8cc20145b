package tlsconfig

import (
	"crypto/tls"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"jobfence/internal/tlsconfig/tlstest"
)

// serveTLS starts an HTTPS server on 127.0.0.1 with the generated
// certificate and returns its address and a count of handled requests.
func serveTLS(t *testing.T, certFile, keyFile string) (string, *atomic.Int32) {
	t.Helper()
	cfg, err := Server(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int32
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			handled.Add(1)
			io.WriteString(w, "ok")
		}),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 5 * time.Second,
		// Handshake failures are what these tests provoke.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("ServeTLS: %v", err)
		}
	})
	return ln.Addr().String(), &handled
}

func client(cfg *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}, Timeout: 10 * time.Second}
}

func TestClientWithTheCATalksToTheServer(t *testing.T) {
	caFile, certFile, keyFile := tlstest.New(t)
	addr, handled := serveTLS(t, certFile, keyFile)
	cfg, err := Client(caFile)
	if err != nil {
		t.Fatal(err)
	}
	c := client(cfg)
	defer c.CloseIdleConnections()
	_, port, _ := net.SplitHostPort(addr)
	for _, host := range []string{"127.0.0.1", "localhost"} {
		resp, err := c.Get("https://" + net.JoinHostPort(host, port) + "/")
		if err != nil {
			t.Fatalf("%s: %v", host, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != "ok" {
			t.Errorf("%s: %d %q", host, resp.StatusCode, body)
		}
		if resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
			t.Errorf("%s: connection state %+v", host, resp.TLS)
		}
	}
	if n := handled.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2", n)
	}
}

func TestPlainHTTPToTheTLSListenerFails(t *testing.T) {
	_, certFile, keyFile := tlstest.New(t)
	addr, handled := serveTLS(t, certFile, keyFile)
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP answered %d, want 400 or an error", resp.StatusCode)
		}
	}
	if n := handled.Load(); n != 0 {
		t.Errorf("a plain HTTP request reached the handler %d times", n)
	}
}

func TestClientWithoutTheCAFailsVerification(t *testing.T) {
	_, certFile, keyFile := tlstest.New(t)
	otherCA, _, _ := tlstest.New(t)
	addr, handled := serveTLS(t, certFile, keyFile)

	system, err := Client("")
	if err != nil {
		t.Fatal(err)
	}
	if system.RootCAs != nil {
		t.Error("empty caFile did not leave the system pool in place")
	}
	other, err := Client(otherCA)
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*tls.Config{"system pool": system, "another CA": other} {
		c := client(cfg)
		resp, err := c.Get("https://" + addr + "/")
		c.CloseIdleConnections()
		if err == nil {
			resp.Body.Close()
			t.Errorf("%s: request succeeded", name)
			continue
		}
		var verr *tls.CertificateVerificationError
		if !errors.As(err, &verr) {
			t.Errorf("%s: want a certificate verification error, got %v", name, err)
		}
	}
	if n := handled.Load(); n != 0 {
		t.Errorf("an unverified client reached the handler %d times", n)
	}
}

func TestOldProtocolVersionsAreRefused(t *testing.T) {
	caFile, certFile, keyFile := tlstest.New(t)
	addr, _ := serveTLS(t, certFile, keyFile)
	cfg, err := Client(caFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MinVersion = tls.VersionTLS10
	cfg.MaxVersion = tls.VersionTLS11
	conn, err := tls.Dial("tcp", addr, cfg)
	if err == nil {
		conn.Close()
		t.Fatal("a TLS 1.1 handshake succeeded")
	}
}

func TestBadFilesAreReported(t *testing.T) {
	caFile, certFile, keyFile := tlstest.New(t)
	_, otherCert, otherKey := tlstest.New(t)
	notPEM := filepath.Join(t.TempDir(), "junk.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, fn := range map[string]func() error{
		"no files":       func() error { _, err := Server("", ""); return err },
		"mismatched key": func() error { _, err := Server(certFile, otherKey); return err },
		"missing cert":   func() error { _, err := Server(filepath.Join(t.TempDir(), "nope"), keyFile); return err },
		"CA not PEM":     func() error { _, err := Client(notPEM); return err },
		"CA missing":     func() error { _, err := Client(filepath.Join(t.TempDir(), "nope")); return err },
	} {
		if err := fn(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := Server(otherCert, otherKey); err != nil {
		t.Errorf("matching pair refused: %v", err)
	}
	if _, err := Client(caFile); err != nil {
		t.Errorf("generated CA refused: %v", err)
	}
	st, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}
	data, _ := os.ReadFile(keyFile)
	if !strings.Contains(string(data), "PRIVATE KEY") {
		t.Error("key file is not a PEM private key")
	}
}
