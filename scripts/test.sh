#!/usr/bin/env bash
# Runs Ferry's whole test suite. Installs what the tests need first (cached outside the
# clone, so later runs start at once): the tansu broker, the Kubernetes test bed, Chromium,
# helm, dockerfilelint and the Python example's venv. The installs run beside the build of
# the tests, and the time of every phase (each install, the build, each test binary) is
# printed at the end as `phase:` lines (docs/BENCHMARKS.md, "CI", keeps the measured figures).
set -euo pipefail
cd "$(dirname "$0")/.."
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
PHASES=()
phase() { PHASES+=("$(printf 'phase: %-34s %5d s' "$1" "$2")"); }
started=$SECONDS

# Runs the install scripts named in order, one after another, each logged with its time.
# Chromium and the test bed both use apt-get, whose lock forbids two at once: they share a
# chain. The npm installs are a chain of their own (the pip venv of the Python example too).
chain() {
  for name in "$@"; do
    local t0=$SECONDS rc=0
    # Lowest priority: the tansu build goes on while the first tests run, and tests with
    # readiness bounds must not lose the CPU to a compiler.
    nice -n 19 "scripts/install-$name.sh" > "$LOGS/$name.log" 2>&1 || rc=$?
    echo "$rc $((SECONDS - t0))" > "$LOGS/$name.done"
    [ "$rc" -eq 0 ] || return "$rc"
  done
}
chain chromium testbed &
apt_chain=$!
chain helm dockerfilelint python-example &
npm_chain=$!
chain tansu &
tansu_chain=$!

# Prints an install's log and phase; fails when it failed or never ran.
report_installs() {
  local failed=0 name rc secs
  for name in "$@"; do
    echo "--- install $name"
    cat "$LOGS/$name.log" 2>/dev/null || true
    if [ -f "$LOGS/$name.done" ]; then
      read -r rc secs < "$LOGS/$name.done"
      phase "install $name (beside the build)" "$secs"
      [ "$rc" -eq 0 ] || { echo "install $name failed (exit $rc)" >&2; failed=1; }
    else
      echo "install $name did not run (an earlier install of its chain failed)" >&2
      failed=1
    fi
  done
  return "$failed"
}

# Runs `cargo test` with the given arguments, streaming its output. Each binary's time is
# taken from cargo's `Running` lines as they stream by; the passed and failed counts of
# every `test result:` line are added to PASSED and FAILED. Returns cargo's exit code.
PASSED=0 FAILED=0
run_tests() {
  local current="" since=$SECONDS rc="" line what
  while IFS= read -r line; do
    # The last line carries cargo's exit code (the loop's own variable is empty after it).
    if [[ "$line" == __exit* ]]; then rc=${line#__exit }; continue; fi
    printf '%s\n' "$line"
    if [[ "$line" =~ ^test\ result:\ [a-zA-Z]+\.\ ([0-9]+)\ passed\;\ ([0-9]+)\ failed ]]; then
      PASSED=$((PASSED + BASH_REMATCH[1])) FAILED=$((FAILED + BASH_REMATCH[2]))
    fi
    if [[ "$line" =~ ^[[:space:]]+(Running|Doc-tests)[[:space:]]+(.*)$ ]]; then
      [ -z "$current" ] || phase "test $current" $((SECONDS - since))
      # "unittests src/lib.rs (target/debug/deps/ferry_kube-0a1b)" -> "ferry_kube src/lib.rs"
      what="${BASH_REMATCH[2]}"
      if [[ "$what" =~ ^(unittests[[:space:]]+)?([^ ]+)[[:space:]]+\(.*/([^/]+)-[0-9a-f]+\)$ ]]; then
        what="${BASH_REMATCH[3]} ${BASH_REMATCH[2]}"
      fi
      current="$what" since=$SECONDS
    fi
  done < <(cargo test "$@" 2>&1; echo "__exit $?")
  [ -z "$current" ] || phase "test $current" $((SECONDS - since))
  return "${rc:-1}"
}

# The tests are built once, in the dev profile, for every binary at once.
t0=$SECONDS
cargo test --workspace --no-run
phase "build tests (dev profile)" $((SECONDS - t0))

t0=$SECONDS
wait "$apt_chain" || true
wait "$npm_chain" || true
phase "waited for installs after build" $((SECONDS - t0))
report_installs chromium testbed helm dockerfilelint python-example || exit 1

# Two tests at a time within a binary: each starts brokers and API servers.
t0=$SECONDS
rc=0
run_tests --workspace --no-fail-fast -- --test-threads=2 --skip tansu || rc=$?
phase "tests without tansu" $((SECONDS - t0))

t0=$SECONDS
wait "$tansu_chain" || true
phase "waited for tansu after those tests" $((SECONDS - t0))
report_installs tansu || exit 1
t0=$SECONDS
# `--tests`: the doc tests ran above (none of them needs a broker).
run_tests --workspace --tests --no-fail-fast -- --test-threads=2 tansu || rc=$?
phase "tests on tansu" $((SECONDS - t0))
phase "total" $((SECONDS - started))
printf '%s\n' "${PHASES[@]}"
# The closing line counts every test of both runs.
echo "tests: $PASSED passed, $FAILED failed"
exit "$rc"
