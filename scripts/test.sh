#!/usr/bin/env bash
# Runs Ferry's whole test suite. Installs what the tests need first (cached outside the
# clone, so later runs start at once): the tansu broker and the Kubernetes test bed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-tansu.sh
scripts/install-testbed.sh
scripts/install-helm.sh
scripts/install-dockerfilelint.sh
scripts/install-chromium.sh
# Two test binaries at a time at most: each starts brokers and API servers.
cargo test --workspace --no-fail-fast -- --test-threads=2
