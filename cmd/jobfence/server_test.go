package main

import (
	"testing"

	"jobfence/server"
)

// A JOBFENCE_<FLAG> variable sets a flag; the command line wins over it.
func TestServerFlagsFromEnv(t *testing.T) {
	t.Setenv("JOBFENCE_QUOTA_PER_SCOPE", "7")
	t.Setenv("JOBFENCE_LISTEN", "127.0.0.1:9999")
	t.Setenv("JOBFENCE_ETCD_ENDPOINTS", "http://127.0.0.1:1,http://127.0.0.1:2")
	t.Setenv("JOBFENCE_ELECTION_TTL", "3s")
	t.Setenv("JOBFENCE_DISPATCH_INTERVAL", "250ms")
	var cfg server.Config
	dc := server.DefaultDispatchConfig()
	if err := parseServerArgs("server", []string{"--listen", "127.0.0.1:7777", "--tokens-file", "/t.json"}, &cfg, &dc); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:7777" {
		t.Errorf("flag did not win: listen %q", cfg.Listen)
	}
	if cfg.QuotaPerScope != 7 || cfg.ElectionTTL.String() != "3s" || len(cfg.EtcdEndpoints) != 2 || cfg.TokensFile != "/t.json" {
		t.Errorf("env not applied: %+v", cfg)
	}
	if dc.Interval.String() != "250ms" {
		t.Errorf("dispatch flag from env: %s", dc.Interval)
	}
	t.Setenv("JOBFENCE_QUOTA_GLOBAL", "many")
	if err := parseServerArgs("server", nil, &server.Config{}, &dc); err == nil {
		t.Error("a bad JOBFENCE_QUOTA_GLOBAL was accepted")
	}
}

func TestDevTokensAreGeneratedOnceWithMode0600(t *testing.T) {
	dir := t.TempDir()
	path, first, err := devTokens(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 4 {
		t.Fatalf("%d tokens", len(first))
	}
	roles := map[string]bool{}
	for _, e := range first {
		roles[string(e.Role)] = true
		if len(e.Token) < 32 {
			t.Errorf("short token for %s", e.Role)
		}
	}
	if len(roles) != 4 {
		t.Errorf("roles %v", roles)
	}
	assertMode0600(t, path)
	_, again, err := devTokens(dir)
	if err != nil {
		t.Fatal(err)
	}
	for i := range first {
		if again[i].Token != first[i].Token {
			t.Errorf("token %d regenerated", i)
		}
	}
}
