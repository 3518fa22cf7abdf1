#!/usr/bin/env bash
# Builds the Java replay of the RESP conformance once: Maven copies Redisson and its
# dependencies (pom.xml) from Maven Central into target/resp-java/lib, javac compiles
# RespConformance.java into target/resp-java/classes. Idempotent: rebuilt only when pom.xml or
# the source changed.
#
# Prints target/resp-java on stdout and exits 0, or prints the reason on stderr and exits 1 (the
# conformance test then skips the Java client and says why).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/resp-java

fail() {
  echo "the Java client (Redisson): $*" >&2
  exit 1
}

for tool in java javac mvn; do
  command -v "$tool" >/dev/null 2>&1 || fail "$tool is not on PATH (a JDK 17+ and Maven are needed)"
done
STAMP=$(cat "$HERE/pom.xml" "$HERE/RespConformance.java" | sha256sum | cut -d' ' -f1)
if [ "$(cat "$OUT/stamp" 2>/dev/null)" = "$STAMP" ] && [ -f "$OUT/classes/RespConformance.class" ]; then
  echo "$OUT"
  exit 0
fi
rm -rf "$OUT/lib" "$OUT/classes"
mkdir -p "$OUT/lib" "$OUT/classes" || fail "cannot create $OUT"
if ! mvn -q -B -f "$HERE/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
  -DoutputDirectory="$OUT/lib" >"$OUT/maven.log" 2>&1; then
  fail "Maven could not fetch the jars (log: $OUT/maven.log)"
fi
if ! javac -nowarn -d "$OUT/classes" -cp "$OUT/lib/*" "$HERE/RespConformance.java" >"$OUT/javac.log" 2>&1; then
  fail "javac failed (log: $OUT/javac.log)"
fi
echo "$STAMP" >"$OUT/stamp"
echo "$OUT"
