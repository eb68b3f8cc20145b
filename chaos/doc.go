// Package chaos is jobfence's fault-injection suite. Its tests start a real
// cluster on 127.0.0.1 (three `jobfence server` replicas whose embedded etcd
// members form one etcd cluster, two `jobfence agent` processes on their own
// cgroup roots), run a workload of jobs that journal their own execution,
// inject one kind of fault (kill -9, SIGSTOP, a lossy proxy, replayed and
// forged result POSTs, a restart on the data dir, etcd out of space), and
// then check the invariants of DESIGN.md against three records: every
// client operation, every etcd revision seen by a watch from revision 1, and
// the fsynced exec journal.
//
// `go test ./chaos` runs each fault once; `-chaos.full` runs the matrix
// (20 seeded runs per fault) and the mutation runs, which use a binary built
// with -tags jobfence_mutation to show each checker catches the mechanism
// it guards being broken. docs/reliability.md holds the last matrix.
package chaos
