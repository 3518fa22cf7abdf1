#!/usr/bin/env bash
# Builds one of the Go peers `floodgate-bench load` measures floodgate against, from the Go module
# proxy only, with `go install` at a pinned version into target/PEER/bin. Idempotent: once built,
# it only prints the path.
#
#   bash bench/go-peer.sh gubernator       # Gubernator v2.13.0 (3 nodes on loopback in the bench)
#   bash bench/go-peer.sh envoy-ratelimit  # envoyproxy/ratelimit, the RLS service Envoy users run
#
# Prints the binary's path on stdout and exits 0, or prints the reason on stderr and exits 1 (the
# harness then skips that peer and says so). Only `make bench-load` and `make bench-peers` run
# it: CI never builds the peers.
set -euo pipefail

PEER=${1:-}
case "$PEER" in
  gubernator)
    PACKAGE=github.com/gubernator-io/gubernator/v2/cmd/gubernator
    VERSION=v2.13.0
    BINARY=gubernator
    ;;
  envoy-ratelimit)
    # The module has no tagged release newer than v1.4.0 (2019); this is the commit the proxy
    # served as latest on 2026-12-02.
    PACKAGE=github.com/envoyproxy/ratelimit/src/service_cmd
    VERSION=v1.4.1-0.20260122083618-3fb702589d36
    BINARY=service_cmd
    ;;
  *)
    echo "usage: $0 gubernator|envoy-ratelimit" >&2
    exit 2
    ;;
esac

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/$PEER
BIN=$OUT/bin/$BINARY
STAMP=$OUT/version

fail() {
  echo "$PEER $VERSION: $*" >&2
  exit 1
}

built() { [ -x "$BIN" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ]; }

if built; then
  echo "$BIN"
  exit 0
fi
command -v go >/dev/null 2>&1 || fail "go is not on PATH"
mkdir -p "$OUT" || fail "cannot create $OUT"
# Two runs at once: one builds, the other waits and reuses it.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$OUT/.lock"
  flock 9
  if built; then
    echo "$BIN"
    exit 0
  fi
fi
# The machine's own Go: a toolchain line in the module must not make go fetch another.
if ! GOBIN="$OUT/bin" GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
  go install "$PACKAGE@$VERSION" >"$OUT/build.log" 2>&1; then
  fail "go install failed (log: $OUT/build.log)"
fi
[ -x "$BIN" ] || fail "go install gave no $BINARY (log: $OUT/build.log)"
echo "$VERSION" >"$STAMP"
echo "$BIN"
