// Package bench holds jobfence's measurements against the physical limits of
// the machine they run on. The program under cmd/jfbench starts real
// processes (a standalone etcd member, `jobfence server`, `jobfence agent`)
// and prints one `BENCH` line per figure; `make bench` runs it after the
// go test benchmarks of the store, the server and isolation and folds their
// figures into one table. Nothing here runs under `make test`.
package bench
