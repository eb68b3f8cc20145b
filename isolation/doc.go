// Package isolation runs one command as a worker domain: a process tree
// confined to its own cgroups, supervised through a pidfd, stopped by a kill
// ladder, and reported on only after every process of the tree is gone. It
// knows nothing about jobs: it takes argv, environment, limits and times and
// answers what happened to the process tree.
//
// # Layouts
//
// Two cgroup layouts are accepted, both found from the configured root:
//
//   - pure cgroup v2 (production, usually under systemd with Delegate=yes):
//     the root's cgroup2 hierarchy offers the memory and pids controllers; a
//     domain gets memory.max, memory.swap.max=0, memory.oom.group=1 and
//     pids.max, and the worker is born inside it (CLONE_INTO_CGROUP).
//   - hybrid (v1 memory and pids hierarchies beside a cgroup2 mount without
//     those controllers): the cgroup2 directory is the tracking hierarchy
//     (cgroup.procs, cgroup.events, cgroup.kill) and the worker is born in
//     it; the limits live in v1 memory and pids directories of the same
//     relative path, which the agent writes the worker into while it is
//     still parked in the shim, before anything of the command runs.
//
// Under systemd, run the agent with Delegate=yes (or Delegate=memory pids)
// and point the root below its own cgroup, for example
// /sys/fs/cgroup/system.slice/jobfence-agent.service/domains: the agent then
// moves itself into a "supervisor" leaf beside the root, because a cgroup
// that holds processes cannot hand controllers to its children.
//
// Anything else is refused: Report.Verified is false with a reason, and Run
// returns ErrUnverified. There is no unisolated fallback.
//
// # Domain lifecycle
//
//	create   mkdir v2 <root>/d.<epoch>.<name>; hybrid: mkdir the v1 twins;
//	         write the limits and read every one back
//	start    the shim (this binary's "worker" command) from one locked OS
//	         thread, with UseCgroupFD, PidFD, Pdeathsig=SIGKILL, Setsid, an
//	         empty environment and only fds 0-4
//	attach   hybrid: the shim's pid into v1 memory and pids cgroup.procs
//	frame    argv, environment (credentials included), directory and the
//	         expected membership travel over fd 3, never argv; the shim
//	         checks its own cgroups and limits, sets no-new-privileges and
//	         RLIMIT_CORE 0, marks every fd from 3 close-on-exec, re-arms
//	         PDEATHSIG on the thread that will exec, and execs. A failure
//	         before exec is written to fd 4 (close-on-exec), so silence on
//	         fd 4 means the command was launched
//	wait     poll the pidfd until the worker exits or the ladder starts
//	ladder   SIGTERM+SIGCONT to every member (pidfd pinned, membership
//	         rechecked), the grace on cgroup.events, cgroup.kill, then
//	         populated 0 within the reap bound
//	reap     the worker's pidfd must be readable once the domain is empty
//	         (otherwise it escaped its cgroup: a breach, no proof); wait it
//	remove   rmdir the v1 twins, then the v2 directory, children first
//
// The reap proof is the exact worker reaped and the domain seen empty with no
// breach. Waiting for empty uses poll(POLLPRI) on cgroup.events, which wakes
// at once; inotify on the same file is late by several milliseconds.
//
// # Startup sweep
//
// Open takes an flock on the v2 root (one agent per root), kills and removes
// every domain left by earlier processes, and only then picks the new epoch.
// A new epoch therefore proves that nothing of an earlier one still runs.
package isolation
