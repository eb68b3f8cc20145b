package store

import "testing"

func TestKeysRoundTrip(t *testing.T) {
	k := keys{prefix: "/jf"}
	cases := []struct {
		key  string
		want parsed
	}{
		{k.job("019385c2-0000-7000-8000-000000000001"), parsed{kind: kindJob, id: "019385c2-0000-7000-8000-000000000001"}},
		{k.fence("ware house/idx/a%b"), parsed{kind: kindFence, target: "ware house/idx/a%b"}},
		{k.quotaGlobal(17), parsed{kind: kindQuotaGlobal, index: 17}},
		{k.quotaScope("a/b c", 3), parsed{kind: kindQuotaScope, scope: "a/b c", index: 3}},
		{k.slot("agent/1", "j1"), parsed{kind: kindSlot, agent: "agent/1", id: "j1"}},
		{k.agent("agent 1"), parsed{kind: kindAgent, id: "agent 1"}},
		{k.replica("replica a/1"), parsed{kind: kindReplica, id: "replica a/1"}},
		{k.settingAdmission(), parsed{kind: kindSettingAdmission}},
		{k.settingDispatch(), parsed{kind: kindSettingDispatch}},
		{k.election() + "/694d7a1b2c3d", parsed{kind: kindElection}},
	}
	for _, c := range cases {
		got, err := k.parse(c.key)
		if err != nil {
			t.Fatalf("parse(%q): %v", c.key, err)
		}
		if got != c.want {
			t.Fatalf("parse(%q) = %+v, want %+v", c.key, got, c.want)
		}
	}
	idem := k.idem("alice", "key-1")
	if p, err := k.parse(idem); err != nil || p.kind != kindIdem || len(p.id) != 64 {
		t.Fatalf("idem key %q parsed %+v %v", idem, p, err)
	}
	if k.idem("alice", "key-1") == k.idem("bob", "key-1") {
		t.Fatal("idempotency keys of two subjects collide")
	}
	for _, bad := range []string{"/other/jobs/x", "/jf/jobs/", "/jf/quota/global/x", "/jf/quota/scope/s/-1", "/jf/unknown", "/jf/replicas/", "/jf/replicas/a/b"} {
		if p, err := k.parse(bad); err == nil {
			t.Fatalf("parse(%q) accepted: %+v", bad, p)
		}
	}
	g, s, err := parseQuotaToken(quotaToken(9999, 42))
	if err != nil || g != 9999 || s != 42 {
		t.Fatalf("quota token round trip: %d %d %v", g, s, err)
	}
}
