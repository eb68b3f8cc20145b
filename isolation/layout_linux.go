package isolation

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

type mountEntry struct {
	root, point, fstype string
	superOpts           []string
}

// layout is where a host's domains live.
type layout struct {
	mode Mode
	// v2 is the root directory under the cgroup2 mount; v2Rel the same path
	// as /proc/<pid>/cgroup spells it.
	v2, v2Rel string
	v2Mount   string
	// Hybrid only: the v1 twins of the root and their /proc spelling.
	mem, memRel   string
	pids, pidsRel string
	controllers   []string
}

func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || len(fields) < sep+4 || len(fields) < 5 {
			continue
		}
		out = append(out, mountEntry{
			root:      unescapeMount(fields[3]),
			point:     unescapeMount(fields[4]),
			fstype:    fields[sep+1],
			superOpts: strings.Split(fields[sep+3], ","),
		})
	}
	return out, sc.Err()
}

// unescapeMount undoes the octal escapes mountinfo uses for spaces and tabs.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for _, c := range s[i+1 : i+4] {
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + byte(c-'0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func under(path, dir string) bool {
	return path == dir || dir == "/" || strings.HasPrefix(path, dir+"/")
}

// mountOf finds the mount that holds path (the longest mount point prefix;
// later entries shadow earlier ones).
func mountOf(mounts []mountEntry, path string) (mountEntry, bool) {
	best, found := mountEntry{}, false
	for _, m := range mounts {
		if under(path, m.point) && (!found || len(m.point) >= len(best.point)) {
			best, found = m, true
		}
	}
	return best, found
}

func isCgroup2(path string) bool {
	var st unix.Statfs_t
	return unix.Statfs(path, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
}

// DefaultRoot picks the root when none is configured: the cgroup2 mount at
// /sys/fs/cgroup (pure v2) or at /sys/fs/cgroup/unified (hybrid).
func DefaultRoot() (string, error) {
	switch {
	case isCgroup2("/sys/fs/cgroup"):
		return "/sys/fs/cgroup/jobfence", nil
	case isCgroup2("/sys/fs/cgroup/unified"):
		return "/sys/fs/cgroup/unified/jobfence", nil
	}
	return "", errors.New("no cgroup2 mount at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

// detect works out the layout for root without changing anything.
func detect(root string) (*layout, error) {
	if root == "" {
		r, err := DefaultRoot()
		if err != nil {
			return nil, err
		}
		root = r
	}
	if !filepath.IsAbs(root) || filepath.Clean(root) != root {
		return nil, fmt.Errorf("cgroup root %q is not an absolute clean path", root)
	}
	mounts, err := readMountinfo()
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	return detectIn(root, mounts, func(dir string) ([]string, error) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		return strings.Fields(string(b)), err
	})
}

// detectIn decides the layout from a mount table and a way to read a cgroup2
// directory's controllers.
func detectIn(root string, mounts []mountEntry, controllers func(dir string) ([]string, error)) (*layout, error) {
	m, ok := mountOf(mounts, root)
	if !ok {
		return nil, fmt.Errorf("no mount holds %s", root)
	}
	if m.fstype != "cgroup2" {
		return nil, fmt.Errorf("%s is on %s (mounted at %s), not on cgroup2", root, m.fstype, m.point)
	}
	if root == m.point {
		return nil, fmt.Errorf("%s is the cgroup2 mount itself; give a directory below it", root)
	}
	rel := filepath.Join(m.root, strings.TrimPrefix(root, m.point))
	l := &layout{v2: root, v2Rel: rel, v2Mount: m.point}
	ctrl, err := controllers(m.point)
	if err != nil {
		return nil, fmt.Errorf("read cgroup.controllers of %s: %w", m.point, err)
	}
	l.controllers = ctrl
	if slices.Contains(l.controllers, "memory") && slices.Contains(l.controllers, "pids") {
		l.mode = ModeV2
		return l, nil
	}
	v1 := func(ctrl string) (string, error) {
		for _, mm := range mounts {
			if mm.fstype == "cgroup" && slices.Contains(mm.superOpts, ctrl) {
				if !under(rel, mm.root) {
					return "", fmt.Errorf("v1 %s hierarchy at %s is rooted at %s, outside %s", ctrl, mm.point, mm.root, rel)
				}
				return filepath.Join(mm.point, strings.TrimPrefix(rel, mm.root)), nil
			}
		}
		return "", fmt.Errorf("cgroup2 at %s offers [%s], not both memory and pids, and no v1 %s hierarchy is mounted", m.point, strings.Join(l.controllers, " "), ctrl)
	}
	if l.mem, err = v1("memory"); err != nil {
		return nil, err
	}
	if l.pids, err = v1("pids"); err != nil {
		return nil, err
	}
	l.memRel, l.pidsRel = rel, rel
	l.mode = ModeHybrid
	return l, nil
}

// ensureBase creates the root directories and, on pure v2, delegates memory
// and pids down to the domains.
func (l *layout) ensureBase() error {
	dirs := []string{l.v2}
	if l.mode == ModeHybrid {
		dirs = append(dirs, l.mem, l.pids)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	if l.mode != ModeV2 {
		return nil
	}
	// A cgroup gets a controller only when every ancestor enables it in
	// cgroup.subtree_control, and a non-root cgroup with processes in it
	// cannot enable any (no internal processes). Under systemd delegation the
	// agent sits in the parent of the root: it moves itself into a leaf first.
	if err := l.leaveParent(); err != nil {
		return err
	}
	rel, _ := filepath.Rel(l.v2Mount, l.v2)
	cur := l.v2Mount
	for _, part := range append([]string{""}, strings.Split(rel, "/")...) {
		cur = filepath.Join(cur, part)
		if err := enableControllers(cur); err != nil {
			return err
		}
	}
	return nil
}

func (l *layout) leaveParent() error {
	own, err := ownCgroup2()
	if err != nil {
		return err
	}
	parentRel := filepath.Dir(l.v2Rel)
	if own != parentRel || parentRel == "/" {
		return nil
	}
	leaf := filepath.Join(filepath.Dir(l.v2), "supervisor")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create supervisor leaf: %w", err)
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte("0"), 0); err != nil {
		return fmt.Errorf("move the agent into %s: %w", leaf, err)
	}
	return nil
}

func enableControllers(dir string) error {
	cur, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("read subtree_control of %s: %w", dir, err)
	}
	have := strings.Fields(string(cur))
	if slices.Contains(have, "memory") && slices.Contains(have, "pids") {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids"), 0); err != nil {
		return fmt.Errorf("enable memory and pids in %s: %w", dir, err)
	}
	return nil
}

func ownCgroup2() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup2 line in /proc/self/cgroup")
}

// swapActive reports whether any swap device is on: then a memory limit
// without a swap limit would not bound the domain.
func swapActive() bool {
	b, err := os.ReadFile("/proc/swaps")
	if err != nil {
		return true
	}
	return len(strings.Split(strings.TrimSpace(string(b)), "\n")) > 1
}

// CgroupMounts describes every cgroup and cgroup2 mount of this host, one
// "mount point: type [controllers]" line each, for the doctor.
func CgroupMounts() []string {
	mounts, err := readMountinfo()
	if err != nil {
		return []string{"mountinfo unreadable: " + err.Error()}
	}
	var out []string
	for _, m := range mounts {
		switch m.fstype {
		case "cgroup":
			var ctrls []string
			for _, o := range m.superOpts {
				if o != "rw" && o != "ro" {
					ctrls = append(ctrls, o)
				}
			}
			out = append(out, fmt.Sprintf("%s: cgroup v1 [%s]", m.point, strings.Join(ctrls, " ")))
		case "cgroup2":
			ctrl, _ := os.ReadFile(filepath.Join(m.point, "cgroup.controllers"))
			out = append(out, fmt.Sprintf("%s: cgroup2 [%s]", m.point, strings.TrimSpace(string(ctrl))))
		}
	}
	return out
}
