# floodgate: thin, documented targets. CI runs `bash .ci/run`, which calls `make lint` and `make test`.
.PHONY: help test lint fmt bench bench-core bench-load run

CARGO ?= cargo

help:            ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

test:            ## every test in the workspace (unit, property, concurrency, CLI); no sleeps, no timing asserts
	$(CARGO) test --workspace --lib --bins --tests --examples --locked
	$(CARGO) test --workspace --doc --locked
	@# The core must stay pure: no tokio, no sockets.
	@! $(CARGO) tree -p floodgate -e normal --locked | grep -E 'tokio|quinn|mio' || (echo "the core depends on a runtime" && false)

lint:            ## rustfmt check and clippy with -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt:             ## format the code
	$(CARGO) fmt --all

run:             ## build in release, start one node with development certificates in .run/node (Ctrl-C stops it)
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-client
	@echo "floodgate node on 127.0.0.1:7100 (admin: http://127.0.0.1:9100/metrics). In another shell:"
	@echo "  ./target/release/floodgate check --node 127.0.0.1:7100 --ca .run/node/ca.pem user:42 --limit 10/s --count 12"
	./target/release/floodgate-node --data-dir .run/node --listen 127.0.0.1:7100 --admin 127.0.0.1:9100

bench: bench-core bench-load ## every benchmark (several minutes)

bench-core:      ## criterion micro-benchmarks of the bucket store beside governor, and bytes per active key
	$(CARGO) bench -p floodgate-bench --bench core --locked
	$(CARGO) bench -p floodgate-bench --bench memory --locked

bench-load:      ## floodgate beside Redis + Lua, same workloads, one run: markdown table, target/bench/{report.json,latency.svg}
	@command -v redis-server >/dev/null || (apt-get install -y redis-server >/dev/null 2>&1 || echo "redis-server missing and not installable: the Redis baseline will be skipped")
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-bench
	./target/release/floodgate-bench load --out target/bench
