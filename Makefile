# jobfence — the two commands that must always work: `make run` and `make test`.
GO        ?= go
BIN       := bin/jobfence
DATA_DIR  ?= ./data
LISTEN    ?= 127.0.0.1:8080

.PHONY: run build test bench generate check-generated vet clean

build:
	$(GO) build -o $(BIN) ./cmd/jobfence

# Server on embedded etcd (plus a local agent once one is available), with a
# generated tokens file; prints the dashboard address, the tokens and a curl line.
run: build
	$(BIN) dev --listen $(LISTEN) --data-dir $(DATA_DIR)

# Every test. Tests that need root and cgroups run here (CI runs as root).
test:
	$(GO) vet ./...
	$(GO) test -count=1 -timeout 14m ./...

# Benchmarks print figures; nothing in `make test` is asserted by a timer.
bench: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -count 1 -timeout 30m ./...

generate:
	$(GO) run github.com/a-h/templ/cmd/templ generate

check-generated:
	@if ls web/*.templ >/dev/null 2>&1; then \
		$(GO) run github.com/a-h/templ/cmd/templ generate >/dev/null && \
		git diff --exit-code -- web || { echo "generated templ code is stale: run make generate and commit"; exit 1; }; \
	fi

clean:
	rm -rf bin
