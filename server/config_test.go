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

// The backend quota belongs to the embedded member: a negative one, or one
// next to an external cluster, is refused.
func TestEtcdQuotaBackendBytesValidation(t *testing.T) {
	base := func() Config {
		c := Config{TokensFile: "/t.json", EtcdQuotaBackendBytes: 8 << 20}
		c.ApplyDefaults()
		return c
	}
	ok := base()
	if err := ok.Validate(); err != nil {
		t.Fatalf("an 8 MiB quota on the embedded member: %v", err)
	}
	neg := base()
	neg.EtcdQuotaBackendBytes = -1
	if err := neg.Validate(); err == nil || !strings.Contains(err.Error(), "must not be negative") {
		t.Errorf("negative quota: %v", err)
	}
	ext := base()
	ext.EtcdEndpoints = []string{"http://127.0.0.1:2379"}
	if err := ext.Validate(); err == nil || !strings.Contains(err.Error(), "etcd-quota-backend-bytes configures the embedded member") {
		t.Errorf("quota with etcd-endpoints: %v", err)
	}
}

// Other replicas must be able to call the advertised URL: a wildcard listen
// host is no address to call, and TLS on the listener means https.
func TestAdvertiseURL(t *testing.T) {
	cases := []struct {
		configured, bound string
		tls               bool
		want              string
	}{
		{"", "127.0.0.1:8080", false, "http://127.0.0.1:8080"},
		{"", "0.0.0.0:8080", false, "http://127.0.0.1:8080"},
		{"", "[::]:9000", true, "https://127.0.0.1:9000"},
		{"", ":7000", false, "http://127.0.0.1:7000"},
		{"", "10.0.0.1:8080", true, "https://10.0.0.1:8080"},
		{"", "[fd00::1]:8080", false, "http://[fd00::1]:8080"},
		{"https://n1.example:8443/", "0.0.0.0:8080", false, "https://n1.example:8443"},
	}
	for _, c := range cases {
		if got := advertiseURL(c.configured, c.bound, c.tls); got != c.want {
			t.Errorf("advertiseURL(%q, %q, %v) = %q, want %q", c.configured, c.bound, c.tls, got, c.want)
		}
	}
	for raw, want := range map[string]string{
		"10.0.0.1:8080":              "not a URL",
		"ftp://10.0.0.1":             "http:// or https://",
		"http://":                    "no host",
		"http://10.0.0.1:8080/api":   "base URL",
		"http://u:p@10.0.0.1:8080":   "base URL",
		"http://10.0.0.1:8080/?a=b":  "base URL",
		"https://n1.example:8443/#x": "base URL",
	} {
		c := Config{TokensFile: "/t.json", AdvertiseURL: raw}
		c.ApplyDefaults()
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), "advertise-url") || !strings.Contains(err.Error(), want) {
			t.Errorf("advertise-url %q: %v", raw, err)
		}
	}
	ok := Config{TokensFile: "/t.json", AdvertiseURL: "https://n1.example:8443/"}
	ok.ApplyDefaults()
	if err := ok.Validate(); err != nil {
		t.Errorf("a base URL refused: %v", err)
	}
}
