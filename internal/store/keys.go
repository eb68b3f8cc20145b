package store

// Key schema. This file is the only place a key is spelled.
//
//	<prefix>/
//	├── jobs/<job id>                       job record (JSON jobs.Job; Revision and
//	│                                       history revisions come from etcd)
//	├── fences/<escaped normalized target>  value: job id of the unresolved holder
//	├── quota/
//	│   ├── global/<i>                      value: job id; i in [0, QuotaGlobal)
//	│   └── scope/<escaped scope>/<i>       value: job id; i in [0, QuotaPerScope)
//	├── slots/<escaped agent id>/<job id>   value: job id; a possibly-live worker
//	├── agents/<escaped agent id>           agent record (JSON jobs.Agent)
//	├── replicas/<escaped replica id>       value: JSON ReplicaInfo; written once per
//	│                                       lease, gone with it (a stopped replica
//	│                                       revokes it; a dead one's expires)
//	├── idem/<sha256(subject NUL key)>      value: JSON idemRecord {job_id, body_hash}
//	├── settings/
//	│   ├── admission                       value: JSON {"open": bool}; absent = open
//	│   └── dispatch                        value: JSON {"paused": bool}; absent = running
//	└── election/                           concurrency.Election prefix (leases)
//
// Escaping is url.PathEscape, so a target or scope never adds a path level.

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// keyKind names the family a key belongs to.
type keyKind int

const (
	kindUnknown keyKind = iota
	kindJob
	kindFence
	kindQuotaGlobal
	kindQuotaScope
	kindSlot
	kindAgent
	kindIdem
	kindSettingAdmission
	kindSettingDispatch
	kindElection
	kindReplica
)

// keys builds and parses keys under one prefix.
type keys struct{ prefix string }

func (k keys) root() string               { return k.prefix + "/" }
func (k keys) job(id string) string       { return k.prefix + "/jobs/" + id }
func (k keys) jobsPrefix() string         { return k.prefix + "/jobs/" }
func (k keys) fence(target string) string { return k.prefix + "/fences/" + url.PathEscape(target) }
func (k keys) quotaGlobal(i int) string   { return k.prefix + "/quota/global/" + strconv.Itoa(i) }
func (k keys) quotaGlobalPrefix() string  { return k.prefix + "/quota/global/" }
func (k keys) quotaScope(s string, i int) string {
	return k.quotaScopePrefix(s) + strconv.Itoa(i)
}
func (k keys) quotaScopePrefix(s string) string {
	return k.prefix + "/quota/scope/" + url.PathEscape(s) + "/"
}
func (k keys) slot(agent, job string) string {
	return k.prefix + "/slots/" + url.PathEscape(agent) + "/" + job
}
func (k keys) agent(id string) string   { return k.prefix + "/agents/" + url.PathEscape(id) }
func (k keys) replica(id string) string { return k.prefix + "/replicas/" + url.PathEscape(id) }
func (k keys) replicasPrefix() string   { return k.prefix + "/replicas/" }
func (k keys) settingAdmission() string { return k.prefix + "/settings/admission" }
func (k keys) settingDispatch() string  { return k.prefix + "/settings/dispatch" }
func (k keys) election() string         { return k.prefix + "/election" }
func (k keys) idem(subject, key string) string {
	sum := sha256.Sum256([]byte(subject + "\x00" + key))
	return k.prefix + "/idem/" + hex.EncodeToString(sum[:])
}

// parsed is a key split into its family and parts.
type parsed struct {
	kind   keyKind
	id     string // job id, agent id, replica id, idem hash
	target string // fence: normalized target
	scope  string // scope quota token
	index  int    // quota token index
	agent  string // slot
}

// parse is the inverse of the builders above.
func (k keys) parse(key string) (parsed, error) {
	rest, ok := strings.CutPrefix(key, k.prefix+"/")
	if !ok {
		return parsed{}, fmt.Errorf("key %q outside prefix", key)
	}
	parts := strings.Split(rest, "/")
	bad := func() (parsed, error) { return parsed{}, fmt.Errorf("unrecognized key %q", key) }
	unesc := func(s string) (string, bool) {
		u, err := url.PathUnescape(s)
		return u, err == nil && u != ""
	}
	switch {
	case parts[0] == "jobs" && len(parts) == 2 && parts[1] != "":
		return parsed{kind: kindJob, id: parts[1]}, nil
	case parts[0] == "fences" && len(parts) == 2:
		t, ok := unesc(parts[1])
		if !ok {
			return bad()
		}
		return parsed{kind: kindFence, target: t}, nil
	case parts[0] == "quota" && len(parts) == 3 && parts[1] == "global":
		i, err := strconv.Atoi(parts[2])
		if err != nil || i < 0 {
			return bad()
		}
		return parsed{kind: kindQuotaGlobal, index: i}, nil
	case parts[0] == "quota" && len(parts) == 4 && parts[1] == "scope":
		s, ok := unesc(parts[2])
		i, err := strconv.Atoi(parts[3])
		if !ok || err != nil || i < 0 {
			return bad()
		}
		return parsed{kind: kindQuotaScope, scope: s, index: i}, nil
	case parts[0] == "slots" && len(parts) == 3 && parts[2] != "":
		a, ok := unesc(parts[1])
		if !ok {
			return bad()
		}
		return parsed{kind: kindSlot, agent: a, id: parts[2]}, nil
	case parts[0] == "agents" && len(parts) == 2:
		a, ok := unesc(parts[1])
		if !ok {
			return bad()
		}
		return parsed{kind: kindAgent, id: a}, nil
	case parts[0] == "replicas" && len(parts) == 2:
		id, ok := unesc(parts[1])
		if !ok {
			return bad()
		}
		return parsed{kind: kindReplica, id: id}, nil
	case parts[0] == "idem" && len(parts) == 2 && parts[1] != "":
		return parsed{kind: kindIdem, id: parts[1]}, nil
	case rest == "settings/admission":
		return parsed{kind: kindSettingAdmission}, nil
	case rest == "settings/dispatch":
		return parsed{kind: kindSettingDispatch}, nil
	case parts[0] == "election":
		return parsed{kind: kindElection}, nil
	}
	return bad()
}

// idemRecord is the value of an idempotency key.
type idemRecord struct {
	JobID    string `json:"job_id"`
	BodyHash string `json:"body_hash"`
}

// quotaToken is how a job records the two quota units it holds.
func quotaToken(global, scope int) string { return fmt.Sprintf("g%d/s%d", global, scope) }

func parseQuotaToken(s string) (global, scope int, err error) {
	if _, err := fmt.Sscanf(s, "g%d/s%d", &global, &scope); err != nil {
		return 0, 0, fmt.Errorf("quota token %q: %w", s, err)
	}
	return global, scope, nil
}
