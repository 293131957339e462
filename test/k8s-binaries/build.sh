#!/usr/bin/env bash
# Prints the directory holding etcd, kube-apiserver and kubectl, and the node's kubelet,
# kube-controller-manager, kube-scheduler and kube-proxy (the real-cluster tier), building them once from Go
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

bins=(etcd kube-apiserver kubectl kubelet kube-controller-manager kube-scheduler kube-proxy)
purpose="the test control plane and node"
# shellcheck source=../support/cached-go-build.sh
source "$here/../support/cached-go-build.sh"
cached_build_begin "kube-apiserver ${k8s_version}, kubectl, the node components and etcd ${etcd_version}" "tens of minutes on 2 cores"
cached_build etcd go.etcd.io/etcd/server/v3
cached_build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver
cached_build kubectl k8s.io/kubernetes/cmd/kubectl
cached_build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler
cached_build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager
cached_build kube-proxy k8s.io/kubernetes/cmd/kube-proxy
cached_build kubelet k8s.io/kubernetes/cmd/kubelet
cached_build_end
