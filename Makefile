# floodgate: thin, documented targets. CI runs `bash .ci/run`, which calls `make lint` and `make test`.
.PHONY: help test lint fmt bench bench-core

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

bench: bench-core ## every benchmark (a few minutes)

bench-core:      ## criterion micro-benchmarks of the bucket store beside governor, and bytes per active key
	$(CARGO) bench -p floodgate-bench --bench core --locked
	$(CARGO) bench -p floodgate-bench --bench memory --locked
