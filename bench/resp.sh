#!/usr/bin/env bash
# CL.THROTTLE side by side: floodgate's Redis front (one node, release build) and redis-server
# with the redis-cell 0.2.2 module, driven by the same client (redis-benchmark), in the same run:
# one key space of 100,000 keys, unpipelined and pipelined. Prints a markdown table of requests
# per second and latency percentiles; the raw CSV goes to target/bench-resp/.
#
# Usage: bench/resp.sh [REQUESTS (default 200000)] [CLIENTS (default 50)]
# Needs redis-server and redis-benchmark (Debian's redis-server and redis-tools) and a release
# floodgate-node (make bench-resp builds it).
set -euo pipefail

REQUESTS=${1:-200000}
CLIENTS=${2:-50}
KEYS=100000
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/bench-resp
NODE=$TARGET/release/floodgate-node
mkdir -p "$OUT"

command -v redis-server >/dev/null || { echo "redis-server is missing" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "redis-benchmark is missing" >&2; exit 1; }
[ -x "$NODE" ] || { echo "$NODE is missing: cargo build --release -p floodgate-node" >&2; exit 1; }
MODULE=$(bash "$ROOT/bench/redis-cell.sh")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CELL_PORT=$(free_port)
GATE_PORT=$(free_port)
QUIC_PORT=$(free_port)

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

redis-server --port "$CELL_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --loadmodule "$MODULE" >"$OUT/redis.log" 2>&1 &
pids+=($!)
"$NODE" --data-dir "$OUT/node" --listen "127.0.0.1:$QUIC_PORT" --admin off \
  --resp-listen "127.0.0.1:$GATE_PORT" ${NODE_FLAGS:-} >"$OUT/node.log" 2>&1 &
pids+=($!)

# Both answer PING before the runs (bounded: 100 tries, 0.1 s apart).
for port in "$CELL_PORT" "$GATE_PORT"; do
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && break
    sleep 0.1
  done
  [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] || { echo "port $port never answered" >&2; exit 1; }
done

echo "| server | pipeline | requests/s | p50 ms | p99 ms | max ms |"
echo "| --- | --- | --- | --- | --- | --- |"
for pipeline in 1 16; do
  for server in redis-cell floodgate; do
    port=$CELL_PORT
    [ "$server" = floodgate ] && port=$GATE_PORT
    csv=$OUT/$server-P$pipeline.csv
    # max_burst 1000 per 60 s: most calls are allowed, as in a healthy service.
    redis-benchmark -h 127.0.0.1 -p "$port" -n "$REQUESTS" -c "$CLIENTS" -P "$pipeline" \
      -r "$KEYS" --csv CL.THROTTLE "key:__rand_int__" 1000 1000 60 >"$csv" 2>"$OUT/$server-P$pipeline.err"
    # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    tail -n 1 "$csv" | tr -d '"' | awk -F, -v s="$server" -v p="$pipeline" \
      '{ printf "| %s | %s | %.0f | %s | %s | %s |\n", s, p, $2, $5, $7, $8 }'
  done
done
echo
echo "($REQUESTS requests, $CLIENTS connections, $KEYS keys; raw output in $OUT)"
