#!/usr/bin/env bash
# Prints the directory holding etcd, kube-apiserver and kubectl, building them once from Go
# modules (through the module proxy) into a cache outside the clone. KUBEBUILDER_ASSETS wins.
set -euo pipefail
if [[ -n "${KUBEBUILDER_ASSETS:-}" ]]; then echo "$KUBEBUILDER_ASSETS"; exit 0; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$here/go.mod")"
etcd_version="$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$here/go.mod")"
out="${CERTSHARE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}/k8s-${k8s_version}-etcd-${etcd_version}"
if [[ -x "$out/kube-apiserver" && -x "$out/etcd" && -x "$out/kubectl" ]]; then echo "$out"; exit 0; fi
command -v go >/dev/null || { echo "build.sh: go is required to build the test control plane" >&2; exit 1; }
mkdir -p "$out.tmp"
cd "$here"
# -trimpath and no debug info keep the binaries small; CGO off matches upstream release builds.
export CGO_ENABLED=0
flags=(-trimpath -ldflags "-s -w")
echo "building kube-apiserver ${k8s_version}, kubectl and etcd ${etcd_version} into $out (first time only; slow)" >&2
go build "${flags[@]}" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3 >&2
go build "${flags[@]}" -o "$out.tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver >&2
go build "${flags[@]}" -o "$out.tmp/kubectl" k8s.io/kubernetes/cmd/kubectl >&2
rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out"
