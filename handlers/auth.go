package handlers

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/go-json-experiment/json"

	"jobfence/internal/problem"
)

// Role is what a token may do. viewer < submitter < operator nest; agent is
// separate and only reaches the agent endpoints.
type Role string

const (
	RoleViewer    Role = "viewer"
	RoleSubmitter Role = "submitter"
	RoleOperator  Role = "operator"
	RoleAgent     Role = "agent"
)

var roleRank = map[Role]int{RoleViewer: 1, RoleSubmitter: 2, RoleOperator: 3}

// Valid reports whether r is one of the four roles.
func (r Role) Valid() bool { return r == RoleAgent || roleRank[r] > 0 }

// Principal is an authenticated caller. Subject is the actor recorded in
// history; the token itself is never kept past the comparison.
type Principal struct {
	Subject string
	Role    Role
}

// Allows reports whether p may act where need is required.
func (p Principal) Allows(need Role) bool {
	if need == RoleAgent || p.Role == RoleAgent {
		return p.Role == need
	}
	return roleRank[p.Role] >= roleRank[need]
}

// TokenEntry is one element of the tokens file.
type TokenEntry struct {
	Subject string `json:"subject"`
	Role    Role   `json:"role"`
	Token   string `json:"token"`
}

type tokenHash struct {
	sum       [sha256.Size]byte
	principal Principal
}

// Auth checks bearer tokens. Only SHA-256 sums of the tokens are held.
type Auth struct {
	entries []tokenHash
}

// minTokenLen keeps guessable tokens out of the file.
const minTokenLen = 16

// NewAuth validates entries (every problem at once) and keeps their sums.
func NewAuth(entries []TokenEntry) (*Auth, error) {
	var problems []string
	a := &Auth{}
	seen := map[[sha256.Size]byte]bool{}
	for i, e := range entries {
		if strings.TrimSpace(e.Subject) == "" {
			problems = append(problems, fmt.Sprintf("entry %d: subject is empty", i))
		}
		if !e.Role.Valid() {
			problems = append(problems, fmt.Sprintf("entry %d: role %q is not viewer, submitter, operator or agent", i, e.Role))
		}
		if len(e.Token) < minTokenLen {
			problems = append(problems, fmt.Sprintf("entry %d: token shorter than %d characters", i, minTokenLen))
		}
		sum := sha256.Sum256([]byte(e.Token))
		if seen[sum] {
			problems = append(problems, fmt.Sprintf("entry %d: token repeats an earlier entry", i))
		}
		seen[sum] = true
		a.entries = append(a.entries, tokenHash{sum: sum, principal: Principal{Subject: e.Subject, Role: e.Role}})
	}
	if len(problems) > 0 {
		return nil, errors.New("tokens: " + strings.Join(problems, "; "))
	}
	return a, nil
}

// LoadTokens reads a tokens file: a JSON array of {subject, role, token}.
func LoadTokens(path string) (*Auth, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokens file: %w", err)
	}
	var entries []TokenEntry
	if err := json.Unmarshal(raw, &entries, json.RejectUnknownMembers(true)); err != nil {
		// The decoder's message may quote file content, which holds tokens.
		return nil, fmt.Errorf("tokens file %s: not a JSON array of {subject, role, token}", path)
	}
	return NewAuth(entries)
}

// Authenticate finds the principal of token. Every entry is compared, in
// constant time over equal-length sums, so the answer's timing says nothing
// about which entry (if any) matched.
func (a *Auth) Authenticate(token string) (Principal, bool) {
	if a == nil || token == "" {
		return Principal{}, false
	}
	sum := sha256.Sum256([]byte(token))
	var found Principal
	ok := 0
	for _, e := range a.entries {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found = e.principal
			ok = 1
		}
	}
	return found, ok == 1
}

// FromRequest authenticates the Authorization header.
func (a *Auth) FromRequest(r *http.Request) (Principal, error) {
	h := r.Header.Get("Authorization")
	scheme, token, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return Principal{}, problem.ErrUnauthenticated
	}
	p, ok := a.Authenticate(strings.TrimSpace(token))
	if !ok {
		return Principal{}, problem.ErrUnauthenticated
	}
	return p, nil
}
