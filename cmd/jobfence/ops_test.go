package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"jobfence/server"
)

// The operating flags reach the server config, and the logger built from
// them scrubs the dispatch token and credential values registered from the
// dispatcher's files.
func TestOperatingFlagsAndSecrets(t *testing.T) {
	var cfg server.Config
	dc := server.DefaultDispatchConfig()
	args := []string{"--tokens-file", "/t.json", "--tls-cert", "/c.pem", "--tls-key", "/k.pem", "--tls-ca", "/ca.pem",
		"--etcd-name", "n2", "--etcd-peer-url", "http://127.0.0.1:22380", "--etcd-client-url", "http://127.0.0.1:22379",
		"--etcd-initial-cluster", "n1=http://127.0.0.1:12380,n2=http://127.0.0.1:22380", "--etcd-initial-cluster-state", "existing",
		"--log-format", "json", "--log-level", "warn"}
	if err := parseServerArgs("server", args, &cfg, &dc); err != nil {
		t.Fatal(err)
	}
	if cfg.TLSCert != "/c.pem" || cfg.TLSKey != "/k.pem" || cfg.TLSCA != "/ca.pem" || cfg.EtcdName != "n2" ||
		cfg.EtcdPeerURL != "http://127.0.0.1:22380" || cfg.EtcdClientURL != "http://127.0.0.1:22379" ||
		!strings.HasPrefix(cfg.EtcdInitialCluster, "n1=") || cfg.EtcdClusterState != "existing" || cfg.Redactor == nil {
		t.Fatalf("flags not applied: %+v", cfg)
	}
	if err := parseServerArgs("server", []string{"--log-format", "xml"}, &server.Config{}, &dc); err == nil {
		t.Error("--log-format xml was accepted")
	}

	dir := t.TempDir()
	dc.DispatchTokenFile = filepath.Join(dir, "dispatch-token")
	dc.CredentialsFile = filepath.Join(dir, "credentials.json")
	const token, cred = "dispatch-token-0123456789abcdef", "credential-value-Qx7"
	if err := os.WriteFile(dc.DispatchTokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dc.CredentialsFile, []byte(`{"p": {"PASSWORD": "`+cred+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	registerDispatchSecrets(cfg.Redactor, dc)
	var out bytes.Buffer
	lg, _, err := newLogger(&out, "json", "info", cfg.Redactor)
	if err != nil {
		t.Fatal(err)
	}
	lg.Info("probe", "detail", "token "+token+" credential "+cred)
	if s := out.String(); strings.Contains(s, token) || strings.Contains(s, cred) || !strings.Contains(s, "[REDACTED]") {
		t.Fatalf("log output: %s", s)
	}
}
