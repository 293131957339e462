#!/usr/bin/env bash
# Prints the directory holding k8s-operator, Tailscale's Kubernetes operator (tailscale.com/cmd/k8s-operator), building
# it once from Go modules (through the module proxy, versions pinned in go.mod/go.sum: Tailscale's own for the
# operator) into a cache outside the clone, keyed by version. The same Tailscale version as tailscaled's
# (test/tailscale-binaries/go.mod), checked here. Its CRDs beside it (crds/). CERTSHARE_TAILSCALE_OPERATOR_BIN wins.
# Concurrent callers are serialised with a lock; only one builds. Progress on stderr, the directory the only stdout line.
set -euo pipefail
if [[ -n "${CERTSHARE_TAILSCALE_OPERATOR_BIN:-}" ]]; then echo "$CERTSHARE_TAILSCALE_OPERATOR_BIN"; exit 0; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ts_version="$(awk '$1=="require" && $2=="tailscale.com"{print $3; exit}' "$here/go.mod")"
tailscaled_version="$(awk '$1=="tailscale.com"{print $2; exit}' "$here/../tailscale-binaries/go.mod")"
if [[ "$ts_version" != "$tailscaled_version" ]]; then
  echo "build.sh: the operator's Tailscale ($ts_version) is not tailscaled's ($tailscaled_version): change both go.mod files" >&2
  exit 1
fi
cache="${CERTSHARE_TAILSCALE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}"
out="$cache/tailscale-operator-${ts_version}"
ldflags="-s -w"
recipe="crds tailscale=$ts_version sum=$(cat "$here/go.mod" "$here/go.sum" | sha256sum | cut -c1-16) cgo=0 ldflags=$ldflags"
bins=(k8s-operator)
purpose="Tailscale's Kubernetes operator for the tests"
# shellcheck source=../support/cached-go-build.sh
source "$here/../support/cached-go-build.sh"
cached_build_begin "Tailscale's Kubernetes operator ${ts_version}" "about 4 minutes on 2 cores"
cached_build k8s-operator tailscale.com/cmd/k8s-operator
# The operator's CRDs, as its Helm chart installs them, from the same module.
mkdir -p "$out.tmp/crds" && cp "$(go list -m -f '{{.Dir}}' tailscale.com)"/cmd/k8s-operator/deploy/crds/*.yaml "$out.tmp/crds/"
cached_build_end
