package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"jobfence/agent"
	"jobfence/isolation"
)

// runDoctor runs the isolation preflight on this host and says what it
// found. Exit status 0 only when isolation is verified.
func runDoctor(args []string) int {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	root := fs.String("cgroup-root", os.Getenv("JOBFENCE_CGROUP_ROOT"), "cgroup2 directory under which worker domains live (default: autodetect)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	out := os.Stdout
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		fmt.Fprintf(out, "kernel:       %s\n", unix.ByteSliceToString(uts.Release[:]))
	}
	fmt.Fprintf(out, "running as:   uid %d\n", os.Geteuid())
	fmt.Fprintln(out, "cgroup mounts:")
	for _, m := range isolation.CgroupMounts() {
		fmt.Fprintf(out, "  %s\n", m)
	}
	if *root == "" {
		if def, err := isolation.DefaultRoot(); err == nil {
			fmt.Fprintf(out, "cgroup root:  %s (autodetected)\n", def)
		}
	} else {
		fmt.Fprintf(out, "cgroup root:  %s\n", *root)
	}
	r := isolation.Preflight(isolation.Config{Root: *root})
	fmt.Fprintf(out, "layout:       %s\n", r.Mode)
	if r.Root != "" {
		fmt.Fprintf(out, "domains in:   %s\n", r.Root)
	}
	if r.V1Memory != "" {
		fmt.Fprintf(out, "v1 memory:    %s\n", r.V1Memory)
		fmt.Fprintf(out, "v1 pids:      %s\n", r.V1Pids)
	}
	if len(r.Controllers) > 0 {
		fmt.Fprintf(out, "cgroup2 controllers: %s\n", strings.Join(r.Controllers, " "))
	}
	if r.Verified {
		fmt.Fprintf(out, "isolation:    verified\ndetail:       %s\n", r.Detail)
		return 0
	}
	fmt.Fprintf(out, "isolation:    UNVERIFIED\nreason:       %s\n", r.Detail)
	fmt.Fprintf(out, "every dispatch to an agent on this root would be refused with %q: %s\n", agent.RefusalIsolationUnverified, r.Detail)
	return 1
}
