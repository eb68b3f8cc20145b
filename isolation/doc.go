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
//     parked at its exec stop, before any instruction of the command runs.
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
//	start    fork and exec the command itself from one locked OS thread
//	         (the spawner), with UseCgroupFD, PidFD, Pdeathsig=SIGKILL,
//	         Setsid, PTRACE_TRACEME, exactly the job's environment (the
//	         credentials reach the command's environment, never argv) and
//	         only fds 0-2; every descriptor of the agent from 3 up is marked
//	         close-on-exec first. The spawner thread carries
//	         no-new-privileges, which the worker inherits. A failed fork or
//	         exec (or chdir) means the command never ran
//	park     the kernel stops the traced worker right after execve, before
//	         its first instruction. There the spawner (its tracer) writes
//	         it into the v1 memory and pids cgroup.procs (hybrid), sets its
//	         RLIMIT_CORE to 0, checks its membership in /proc/<pid>/cgroup,
//	         reads every limit back, and detaches with signal 0 (the exec's
//	         SIGTRAP is dropped). A failed check kills it still parked: the
//	         command provably never ran
//	wait     poll the pidfd until the worker exits or the ladder starts
//	ladder   SIGTERM+SIGCONT to every member (pidfd pinned, membership
//	         rechecked), the grace on cgroup.events, cgroup.kill, then
//	         populated 0 within the reap bound
//	reap     the worker's pidfd must be readable once the domain is empty
//	         (otherwise it escaped its cgroup: a breach, no proof); wait it
//	remove   rmdir the v1 twins, then the v2 directory, children first
//
// The reap proof is the exact worker reaped and the domain seen empty with no
// breach.
//
// The command is not started through a shim process: a second Go program
// per job (this binary's "worker") cost tens of milliseconds of runtime and
// package initialisation, several times the whole rest of the lifecycle.
// The park gives the same guarantees from outside: limits in place and
// membership checked before the command runs, and the same hardening. The
// "worker" command remains only as the preflight's canary. Parking needs
// ptrace: a kernel with Yama ptrace_scope 3 (or a seccomp policy denying
// ptrace) makes the preflight fail, and the agent refuses every dispatch. Waiting for empty uses poll(POLLPRI) on cgroup.events, which wakes
// at once; inotify on the same file is late by several milliseconds.
//
// # Startup sweep
//
// Open takes an flock on the v2 root (one agent per root), kills and removes
// every domain left by earlier processes, and only then picks the new epoch.
// A new epoch therefore proves that nothing of an earlier one still runs.
package isolation
