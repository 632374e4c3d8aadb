#!/usr/bin/env bash
# Installs dockerfilelint 1.8.0 (from the npm registry) into the Ferry cache; tests/ship.rs
# lints the Dockerfile with it (no Docker engine here to build the image).
set -euo pipefail
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
DIR="$CACHE/dockerfilelint-1.8.0"
if [ -x "$DIR/node_modules/.bin/dockerfilelint" ]; then
  echo "dockerfilelint: cached at $DIR"
  exit 0
fi
echo "dockerfilelint: installing 1.8.0 from the npm registry"
mkdir -p "$DIR"
npm install --silent --no-audit --no-fund --prefix "$DIR" dockerfilelint@1.8.0
echo "dockerfilelint: installed at $DIR"
