#!/usr/bin/env bash
# Installs the tansu Kafka-protocol broker (0.6.0) used by the end-to-end tests.
# Idempotent and cached outside the clone: a second run returns at once.
# Why tansu: no Apache Kafka is installable on our machines (see docs/ARCHITECTURE.md, "Brokers").
set -euo pipefail
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
# The cache key names the build: a build made with other settings is not reused by mistake.
ROOT="$CACHE/tansu-0.6.0-sql-o1"
BIN="$ROOT/bin/tansu"
if [ -x "$BIN" ]; then
  echo "tansu: cached at $BIN"
  exit 0
fi
# A build stopped half-way leaves a partial root behind; cargo must not find its bookkeeping.
rm -rf "$ROOT.partial"
mkdir -p "$ROOT"
echo "tansu: building 0.6.0 from crates.io into $ROOT (about 8 minutes on 2 cores, once)"
# Without `dynostore` no storage engine is compiled and the broker fails at start (TESTBED.md).
# `libsql` adds the SQLite engine: the SASL test creates users, then restarts the broker
# with authentication required on the same store (the memory engine forgets them).
# The tests need a correct broker, not a fast one: opt-level 1 without debug info builds in
# about half the time of the release default (measured in docs/BENCHMARKS.md, "CI").
CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_LTO=false \
  cargo install tansu@0.6.0 --locked --features dynostore,libsql --root "$ROOT.partial"
mkdir -p "$ROOT/bin"
mv "$ROOT.partial/bin/tansu" "$BIN"
rm -rf "$ROOT.partial"
"$BIN" --version || true
echo "tansu: installed at $BIN"
