#!/usr/bin/env bash
# Installs the Python example's dependencies (examples/python/requirements.txt, every
# version pinned) from PyPI into a venv in the Ferry cache; tests/python_example.rs runs the
# example with it. Idempotent: the venv keeps a copy of the requirements it was made from
# and is made anew only when they change.
#
# No Confluent-compatible registry installs here (Karapace is not on PyPI; Confluent's and
# Apicurio need Java): the test serves ferry_runtime::schema_registry::StandIn instead.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
VENV="$CACHE/python-example-venv"
REQ="examples/python/requirements.txt"
if [ -x "$VENV/bin/python" ] && cmp -s "$REQ" "$VENV/requirements.txt"; then
  echo "python-example: cached at $VENV"
  exit 0
fi
echo "python-example: making $VENV from $REQ"
# Made where it stays: a venv's scripts carry its absolute path.
rm -rf "$VENV"
mkdir -p "$CACHE"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --disable-pip-version-check --no-input -r "$REQ"
"$VENV/bin/python" -c 'import confluent_kafka, fastavro; print("python-example: confluent-kafka", confluent_kafka.version()[0], "librdkafka", confluent_kafka.libversion()[0])'
# The stamp last: a venv without it (an install cut short) is made again.
cp "$REQ" "$VENV/requirements.txt"
echo "python-example: installed at $VENV"
