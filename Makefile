# jobfence — the two commands that must always work: `make run` and `make test`.
GO        ?= go
BIN       := bin/jobfence
DATA_DIR  ?= ./data
LISTEN    ?= 127.0.0.1:8080

.PHONY: run build test bench chaos generate check-generated vet clean

build:
	$(GO) build -o $(BIN) ./cmd/jobfence

# Server on embedded etcd plus a local agent (run as root: the agent creates
# worker cgroups), with a generated tokens file; prints the dashboard address,
# the tokens and a curl line that submits a job which reaches COMMITTED.
run: build
	$(BIN) dev --listen $(LISTEN) --data-dir $(DATA_DIR)

# Every test. Tests that need root and cgroups run here (CI runs as root).
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 14m ./...

# Benchmarks print figures; nothing in `make test` is asserted by a timer.
# The go test benchmarks (admission, store, isolation) run three times and
# jfbench (bench/cmd/jfbench: real server, agent and etcd processes) repeats
# its own figures three times; it prints one BENCH line per figure (medians)
# and one table. docs/performance.md says what each figure means.
BENCH_GOTEST := bin/bench-gotest.txt
bench: build
	$(GO) build -o bin/jfbench ./bench/cmd/jfbench
	$(GO) test -run '^$$' -bench '^Benchmark(AdmissionAttempts|AdmitVsRawTxn|Admission|DomainLifecycle)$$' \
		-benchtime 1x -count 3 -timeout 20m ./internal/store/ ./server/ ./isolation/ >$(BENCH_GOTEST) 2>&1 || \
		{ cat $(BENCH_GOTEST); exit 1; }
	@grep -E '^(Benchmark|BENCH )' $(BENCH_GOTEST)
	bin/jfbench -bin $(BIN) -gotest-output $(BENCH_GOTEST)

# The fault-injection matrix: every fault under 20 seeds, then each mutation
# build, with the table written to docs/reliability.md. SEED=n replays one
# seed of every fault (FAULT=F3 narrows it to one); the short subset (each
# fault once) runs inside `make test`.
SEED  ?=
FAULT ?=
chaos:
	$(GO) test -count=1 -timeout 120m -v -run '^TestChaos$$' ./chaos/ \
		$(if $(SEED),-chaos.seed=$(SEED),-chaos.full -chaos.doc=$(CURDIR)/docs/reliability.md) \
		$(if $(FAULT),-chaos.fault=$(FAULT))

generate:
	$(GO) run github.com/a-h/templ/cmd/templ generate

check-generated:
	@if ls web/*.templ >/dev/null 2>&1; then \
		$(GO) run github.com/a-h/templ/cmd/templ generate >/dev/null && \
		git diff --exit-code -- web || { echo "generated templ code is stale: run make generate and commit"; exit 1; }; \
	fi

clean:
	rm -rf bin
