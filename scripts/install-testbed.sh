#!/usr/bin/env bash
# Installs the test bed's Kubernetes control plane: etcd (Debian) and kube-apiserver,
# kube-controller-manager and kube-scheduler v1.20.2 built offline from Debian's
# `kubernetes` source package. Idempotent; binaries are cached outside the clone,
# keyed by the source tarball's sha256, and checked after the build.
# The recipe and its pitfalls are measured in ../shared/TESTBED.md.
set -euo pipefail
CACHE="${FERRY_CACHE:-$HOME/.cache/ferry}"
K8S="$CACHE/k8s"
BIN="$K8S/bin"
step() { echo "testbed: [$1/5] $2"; }

need_apt=()
command -v etcd >/dev/null || need_apt+=(etcd-server)
[ -x /usr/lib/go-1.19/bin/go ] || need_apt+=(golang-1.19-go)
command -v rsync >/dev/null || need_apt+=(rsync)
command -v openssl >/dev/null || need_apt+=(openssl)
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_apt+=(golang-github-modern-go-reflect2-dev)

if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kube-scheduler" ] && [ ${#need_apt[@]} -eq 0 ]; then
  echo "testbed: cached in $BIN ($(cat "$K8S/source.sha256" 2>/dev/null | cut -c1-12))"
  exit 0
fi

step 1 "Debian packages: ${need_apt[*]:-none needed}"
if [ ${#need_apt[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq "${need_apt[@]}" >/dev/null
fi
# etcd-server's package starts a system service on some images; the harness runs its own.
command -v etcd >/dev/null || { echo "testbed: etcd missing after install" >&2; exit 1; }

if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/kube-scheduler" ]; then
  echo "testbed: Kubernetes binaries cached in $BIN"; exit 0
fi

step 2 "fetching Debian's kubernetes source package (34 MB)"
SRC="$K8S/src"
mkdir -p "$SRC/apt/lists/partial" "$SRC/apt/sources"
sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$SRC/apt/sources/debian-src.sources"
APT_OPTS=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$SRC/apt/sources" -o "Dir::State::Lists=$SRC/apt/lists")
TARBALL=$(ls "$SRC"/kubernetes_*.orig.tar.gz 2>/dev/null | head -1 || true)
if [ -z "$TARBALL" ]; then
  apt-get "${APT_OPTS[@]}" update -qq
  (cd "$SRC" && apt-get "${APT_OPTS[@]}" source --download-only kubernetes >/dev/null)
  TARBALL=$(ls "$SRC"/kubernetes_*.orig.tar.gz | head -1)
fi
SHA=$(sha256sum "$TARBALL" | cut -d' ' -f1)
echo "testbed: source $(basename "$TARBALL") sha256 ${SHA:0:12}"

step 3 "unpacking and applying the reflect2 1.0.2 fix (1.0.1 crashes under Go 1.19 on server-side apply)"
WORK="$K8S/build-$SHA"
if [ ! -f "$WORK/.patched" ]; then
  rm -rf "$WORK"; mkdir -p "$WORK"
  tar -xzf "$TARBALL" -C "$WORK" --strip-components=1
  rm -rf "$WORK/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$WORK/vendor/github.com/modern-go/reflect2"
  sed -i 's#github.com/modern-go/reflect2 v1.0.1#github.com/modern-go/reflect2 v1.0.2#' "$WORK/go.mod" "$WORK/vendor/modules.txt"
  touch "$WORK/.patched"
fi

step 4 "building kube-apiserver, kube-controller-manager, kube-scheduler (about 9 minutes cold on 2 cores)"
export PATH=/usr/lib/go-1.19/bin:$PATH GOPROXY=off GOFLAGS=-mod=vendor GOCACHE="$K8S/gocache"
for what in kube-apiserver kube-controller-manager kube-scheduler; do
  if [ ! -x "$WORK/_output/local/bin/linux/amd64/$what" ] && [ ! -x "$WORK/_output/bin/$what" ]; then
    echo "testbed:   building $what"
    (cd "$WORK" && make WHAT=cmd/$what 2>&1 | tail -5)
  fi
done

step 5 "checking and caching the binaries"
mkdir -p "$BIN"
for what in kube-apiserver kube-controller-manager kube-scheduler; do
  out=$(ls "$WORK"/_output/local/bin/linux/*/"$what" "$WORK"/_output/bin/"$what" 2>/dev/null | head -1 || true)
  [ -n "$out" ] || { echo "testbed: $what was not built (is rsync installed?)" >&2; exit 1; }
  "$out" --version | grep -q 'v1.20' || { echo "testbed: $what does not report v1.20" >&2; exit 1; }
  cp "$out" "$BIN/$what.tmp" && mv "$BIN/$what.tmp" "$BIN/$what"
done
echo "$SHA" > "$K8S/source.sha256"
rm -rf "$WORK"
echo "testbed: installed $(ls "$BIN" | tr '\n' ' ')in $BIN"
