package handlers

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRolesNest(t *testing.T) {
	cases := []struct {
		have, need Role
		ok         bool
	}{
		{RoleViewer, RoleViewer, true},
		{RoleViewer, RoleSubmitter, false},
		{RoleSubmitter, RoleViewer, true},
		{RoleSubmitter, RoleOperator, false},
		{RoleOperator, RoleSubmitter, true},
		{RoleOperator, RoleAgent, false},
		{RoleAgent, RoleAgent, true},
		{RoleAgent, RoleViewer, false},
		{RoleAgent, RoleOperator, false},
	}
	for _, c := range cases {
		if got := (Principal{Role: c.have}).Allows(c.need); got != c.ok {
			t.Errorf("%s allows %s = %v, want %v", c.have, c.need, got, c.ok)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	a, err := NewAuth([]TokenEntry{
		{Subject: "alice", Role: RoleOperator, Token: "alice-token-0123456789"},
		{Subject: "bob", Role: RoleViewer, Token: "bob-token-0123456789ab"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := a.Authenticate("bob-token-0123456789ab"); !ok || p.Subject != "bob" || p.Role != RoleViewer {
		t.Fatalf("bob: %+v %v", p, ok)
	}
	for _, bad := range []string{"", "bob-token-0123456789a", "bob-token-0123456789abc", "BOB-TOKEN-0123456789AB"} {
		if _, ok := a.Authenticate(bad); ok {
			t.Errorf("token %q authenticated", bad)
		}
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Basic alice-token-0123456789")
	if _, err := a.FromRequest(r); err == nil {
		t.Error("a Basic header authenticated")
	}
	r.Header.Set("Authorization", "Bearer alice-token-0123456789")
	if p, err := a.FromRequest(r); err != nil || p.Subject != "alice" {
		t.Errorf("bearer: %+v %v", p, err)
	}
}

func TestNewAuthReportsEveryProblem(t *testing.T) {
	_, err := NewAuth([]TokenEntry{
		{Subject: "", Role: "admin", Token: "short"},
		{Subject: "x", Role: RoleAgent, Token: "same-token-0123456789"},
		{Subject: "y", Role: RoleAgent, Token: "same-token-0123456789"},
	})
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"subject is empty", `role "admin"`, "shorter than", "repeats"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestLoadTokensDoesNotEchoContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	secret := "super-secret-token-value-123"
	if err := os.WriteFile(path, []byte(`[{"subject":"a","role":"viewer","token":"`+secret+`","extra":1}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadTokens(path)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("err = %v", err)
	}
}
