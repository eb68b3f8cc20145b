package server

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	var c Config
	c.TokensFile = "/x"
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" || c.DataDir != "./data" || c.QuotaGlobal != 10000 || c.QuotaPerScope != 1000 ||
		c.ElectionTTL != 5*time.Second || c.Prefix != "/jobfence" || c.ReadHeaderTimeout == 0 || c.ReplicaID == "" {
		t.Errorf("defaults %+v", c)
	}
}

// Validate names every problem at once.
func TestConfigValidateReportsEverything(t *testing.T) {
	c := Config{
		Listen:        "nonsense",
		Prefix:        "jobfence/",
		QuotaGlobal:   5,
		QuotaPerScope: 10,
		ElectionTTL:   100 * time.Millisecond,
		EtcdCert:      "/c.pem",
		ReplicaID:     "has space",
	}
	c.ApplyDefaults()
	c.Defaults.MemoryBytes = 1
	err := c.Validate()
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"tokens-file", "listen", "prefix", "quota-per-scope (10) exceeds", "election-ttl",
		"etcd-cert and etcd-key", "need etcd-endpoints", "replica id", "default memory"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q missing from:\n%v", want, err)
		}
	}
}
