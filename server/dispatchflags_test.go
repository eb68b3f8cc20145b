package server

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestDispatchFlagsAndValidate(t *testing.T) {
	c := DefaultDispatchConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	RegisterDispatchFlags(fs, &c)
	err := fs.Parse([]string{"--dispatch-interval", "250ms", "--dispatch-per-round", "4", "--credentials-file", "/c.json",
		"--refresh-retry", "1m", "--retention", "24h", "--dispatch-token-file", "/d"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Interval != 250*time.Millisecond || c.PerRound != 4 || c.CredentialsFile != "/c.json" ||
		c.RefreshRetry != time.Minute || c.Retention != 24*time.Hour || c.DispatchTokenFile != "/d" {
		t.Fatalf("parsed %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	d := DefaultDispatchConfig()
	if d.Interval != time.Second || d.PerRound != 16 || d.RefreshRetry != 300*time.Second || d.Retention != 168*time.Hour {
		t.Fatalf("defaults %+v", d)
	}
	bad := DispatchConfig{}
	err = bad.Validate()
	if err == nil {
		t.Fatal("the zero config validated")
	}
	for _, want := range []string{"dispatch-interval", "dispatch-per-round", "refresh-retry", "retention"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate does not report %s: %v", want, err)
		}
	}
}
