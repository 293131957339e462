#!/usr/bin/env bash
# Prints the directory holding etcd, kube-apiserver and kubectl, building them once from Go
# modules (through the module proxy) into a cache outside the clone. KUBEBUILDER_ASSETS wins.
# Concurrent callers (parallel test files) are serialised with a lock; only one builds.
# Progress goes to stderr; the directory is the only stdout line.
set -euo pipefail
if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then echo "$KUBEBUILDER_ASSETS"; exit 0; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$here/go.mod")"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$here/go.mod")"
cache="${CERTSHARE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}"
out="$cache/k8s-${k8s_version}-etcd-${etcd_version}"

# Version stamping, as the upstream release build does (hack/lib/version.sh): without it the binaries
# report v0.0.0-master+$Format:%H$ and `kubectl version` fails to parse it.
minor="${k8s_version#v*.}"; minor="${minor%%.*}"
vars=(gitVersion="$k8s_version" gitMajor=1 gitMinor="$minor" gitTreeState=clean buildDate=1970-01-01T00:00:00Z)
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  for v in "${vars[@]}"; do ldflags+=" -X $pkg.$v"; done
done
# The recipe stamp makes an old cache (other flags) rebuild; with a warm Go build cache that is a relink.
recipe="k8s=$k8s_version etcd=$etcd_version cgo=0 ldflags=$ldflags"

complete() { [[ -x "$out/kube-apiserver" && -x "$out/etcd" && -x "$out/kubectl" && "$(cat "$out/.recipe" 2>/dev/null)" == "$recipe" ]]; }
if complete; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: go is required to build the test control plane" >&2; exit 1; }
mkdir -p "$cache"
if command -v flock >/dev/null; then
  exec 9>"$out.lock"
  if ! flock -n 9; then
    echo "build.sh: waiting for another build of $out to finish" >&2
    flock 9
  fi
  if complete; then echo "$out"; exit 0; fi
fi

rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cd "$here"
# -trimpath and no debug info keep the binaries small; CGO off matches upstream release builds.
export CGO_ENABLED=0
flags=(-trimpath -buildvcs=false -ldflags "$ldflags")
start=$SECONDS
heartbeat=""
trap '[[ -n "$heartbeat" ]] && kill "$heartbeat" 2>/dev/null || true' EXIT
build() { # name package
  local t=$SECONDS
  echo "build.sh: building $1 (elapsed $((SECONDS - start))s)" >&2
  # A line a minute so that CI logs (and the test harness's stderr) show the build is alive.
  ( while sleep 60; do echo "build.sh: still building $1 ($((SECONDS - t))s)" >&2; done ) &
  heartbeat=$!
  go build "${flags[@]}" -o "$out.tmp/$1" "$2" >&2
  kill "$heartbeat" 2>/dev/null || true; wait "$heartbeat" 2>/dev/null || true; heartbeat=""
  echo "build.sh: built $1 in $((SECONDS - t))s" >&2
}
echo "build.sh: building kube-apiserver ${k8s_version}, kubectl and etcd ${etcd_version} into $out (first time only; tens of minutes on 2 cores)" >&2
build etcd go.etcd.io/etcd/server/v3
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
build kubectl k8s.io/kubernetes/cmd/kubectl
printf '%s\n' "$recipe" >"$out.tmp/.recipe"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "build.sh: done in $((SECONDS - start))s" >&2
echo "$out"
