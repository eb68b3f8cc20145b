//go:build linux

package isolation

import (
	"strings"
	"testing"
)

// The layout decision, for mount tables this host does not have.
func TestDetectLayouts(t *testing.T) {
	pureV2 := []mountEntry{
		{root: "/", point: "/", fstype: "ext4"},
		{root: "/", point: "/sys/fs/cgroup", fstype: "cgroup2", superOpts: []string{"rw", "nsdelegate"}},
	}
	hybrid := []mountEntry{
		{root: "/", point: "/", fstype: "ext4"},
		{root: "/", point: "/sys/fs/cgroup", fstype: "tmpfs"},
		{root: "/", point: "/sys/fs/cgroup/memory", fstype: "cgroup", superOpts: []string{"rw", "memory"}},
		{root: "/", point: "/sys/fs/cgroup/pids", fstype: "cgroup", superOpts: []string{"rw", "pids"}},
		{root: "/", point: "/sys/fs/cgroup/unified", fstype: "cgroup2", superOpts: []string{"rw"}},
	}
	noV1 := hybrid[:2:2]
	noV1 = append(noV1, hybrid[4])
	ctrls := func(list string) func(string) ([]string, error) {
		return func(string) ([]string, error) { return strings.Fields(list), nil }
	}
	cases := []struct {
		name, root string
		mounts     []mountEntry
		ctrls      string
		mode       Mode
		v2Rel, mem string
		err        string
	}{
		{"pure v2 delegated", "/sys/fs/cgroup/system.slice/jobfence-agent.service/domains", pureV2, "cpu memory pids io", ModeV2,
			"/system.slice/jobfence-agent.service/domains", "", ""},
		{"hybrid", "/sys/fs/cgroup/unified/jobfence", hybrid, "hugetlb", ModeHybrid, "/jobfence", "/sys/fs/cgroup/memory/jobfence", ""},
		{"v2 without memory and no v1", "/sys/fs/cgroup/unified/jobfence", noV1, "hugetlb", "", "", "", "no v1 memory hierarchy"},
		{"pure v2 without pids", "/sys/fs/cgroup/jobfence", pureV2, "memory", "", "", "", "no v1 memory hierarchy"},
		{"not cgroup2", "/var/lib/jobfence", pureV2, "memory pids", "", "", "", "not on cgroup2"},
		{"v1 hierarchy", "/sys/fs/cgroup/memory/jobfence", hybrid, "hugetlb", "", "", "", "not on cgroup2"},
		{"mount itself", "/sys/fs/cgroup", pureV2, "memory pids", "", "", "", "the cgroup2 mount itself"},
	}
	for _, c := range cases {
		l, err := detectIn(c.root, c.mounts, ctrls(c.ctrls))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: want error containing %q, got %v", c.name, c.err, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if l.mode != c.mode || l.v2Rel != c.v2Rel || l.mem != c.mem {
			t.Errorf("%s: got mode %s rel %s mem %s", c.name, l.mode, l.v2Rel, l.mem)
		}
	}
}

func TestMembershipParsing(t *testing.T) {
	lines := strings.Split("12:pids:/jf/d.x\n4:memory:/jf/d.x\n3:cpu,cpuacct:/\n0::/jf/d.x", "\n")
	for _, m := range []membership{{Path: "/jf/d.x"}, {Controller: "memory", Path: "/jf/d.x"}, {Controller: "pids", Path: "/jf/d.x"}, {Controller: "cpu", Path: "/"}} {
		if !hasMembership(lines, m) {
			t.Errorf("missing %+v", m)
		}
	}
	for _, m := range []membership{{Path: "/jf"}, {Controller: "memory", Path: "/"}, {Controller: "blkio", Path: "/jf/d.x"}} {
		if hasMembership(lines, m) {
			t.Errorf("false membership %+v", m)
		}
	}
}
