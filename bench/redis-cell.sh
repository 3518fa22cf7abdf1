#!/usr/bin/env bash
# Builds the redis-cell Redis module (GCRA as one native command, CL.THROTTLE) for the
# `redis+cell` baseline of `floodgate-bench load`, from crates.io only: cargo downloads the crate by
# name, its source is unpacked from cargo's registry cache into target/redis-cell/ and built there
# as its own package. Idempotent: once built, it only prints the path.
#
# Prints the path of libredis_cell.so on stdout and exits 0, or prints the reason on stderr and
# exits 1 (the harness then skips that baseline and says so).
set -euo pipefail

VERSION=0.2.2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/redis-cell
MODULE=$OUT/libredis_cell.so
STAMP=$OUT/version

fail() {
  echo "redis-cell $VERSION: $*" >&2
  exit 1
}

built() { [ -f "$MODULE" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$VERSION" ]; }

if built; then
  echo "$MODULE"
  exit 0
fi
command -v cargo >/dev/null 2>&1 || fail "cargo is not on PATH"
mkdir -p "$OUT" || fail "cannot create $OUT"
# Tests and make may run this at the same time: one builds, the others wait and reuse it.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$OUT/.lock"
  flock 9
  if built; then
    echo "$MODULE"
    exit 0
  fi
fi

# 1. Let cargo download the crate (and its dependencies) by name, through its usual registry.
FETCH=$OUT/fetch
mkdir -p "$FETCH/src"
cat >"$FETCH/Cargo.toml" <<EOF
[package]
name = "redis-cell-fetch"
version = "0.0.0"
edition = "2021"
publish = false

# Its own workspace: target/ lies inside floodgate's, which does not list it.
[workspace]

[dependencies]
redis-cell = "=$VERSION"
EOF
: >"$FETCH/src/lib.rs"
cargo fetch --manifest-path "$FETCH/Cargo.toml" >"$OUT/fetch.log" 2>&1 \
  || fail "cargo could not download it from crates.io (log: $OUT/fetch.log)"

# 2. Unpack its source from cargo's registry cache into target/.
CACHE=${CARGO_HOME:-$HOME/.cargo}/registry/cache
CRATE=$(find "$CACHE" -name "redis-cell-$VERSION.crate" -print -quit 2>/dev/null || true)
[ -n "$CRATE" ] || fail "cargo fetched it but redis-cell-$VERSION.crate is not under $CACHE"
rm -rf "$OUT/src"
mkdir -p "$OUT/src"
tar -xzf "$CRATE" -C "$OUT/src" || fail "cannot unpack $CRATE"
SRC=$OUT/src/redis-cell-$VERSION
printf '\n[workspace]\n' >>"$SRC/Cargo.toml"
# The crate ships no lock file: build with the versions the fetch resolved and downloaded.
cp "$FETCH/Cargo.lock" "$SRC/Cargo.lock"

# 3. Build it as its own package. The 2018 code builds with warnings on today's compiler, so
# flags such as -D warnings meant for floodgate must not reach it.
if ! (cd "$SRC" && env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS \
  CARGO_TARGET_DIR="$OUT/build" CARGO_INCREMENTAL=0 cargo build --release --offline) \
  >"$OUT/build.log" 2>&1; then
  fail "cargo build failed (log: $OUT/build.log)"
fi
[ -f "$OUT/build/release/libredis_cell.so" ] \
  || fail "the build gave no libredis_cell.so (log: $OUT/build.log)"
cp "$OUT/build/release/libredis_cell.so" "$MODULE.tmp"
mv "$MODULE.tmp" "$MODULE"
echo "$VERSION" >"$STAMP"
echo "$MODULE"
