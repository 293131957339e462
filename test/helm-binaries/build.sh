#!/usr/bin/env bash
# Prints the directory holding helm (charts/certshare: lint, template, and install against the test
# control plane), building it once from its Go module (through the module proxy, version pinned in
# go.mod/go.sum) into a cache outside the clone. CERTSHARE_HELM_BIN pointing at a directory with helm wins.
# Concurrent callers (parallel test files) are serialised with a lock; only one builds.
# Progress goes to stderr; the directory is the only stdout line.
set -euo pipefail
if [[ -n "${CERTSHARE_HELM_BIN:-}" ]]; then echo "$CERTSHARE_HELM_BIN"; exit 0; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
helm_version="$(awk '$1=="require" && $2=="helm.sh/helm/v4"{print $3; exit} $1=="helm.sh/helm/v4"{print $2; exit}' "$here/go.mod")"
[[ -n "$helm_version" ]] || { echo "build.sh: no helm.sh/helm/v4 version in $here/go.mod" >&2; exit 1; }
cache="${CERTSHARE_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}"
out="$cache/helm-${helm_version}"

# Version stamping, as helm's own release build does (its Makefile): without it `helm version` says v4.3.
ldflags="-s -w -X helm.sh/helm/v4/internal/version.version=${helm_version} -X helm.sh/helm/v4/internal/version.gitTreeState=clean"
# The recipe stamp makes an old cache (other flags) rebuild; with a warm Go build cache that is a relink.
recipe="helm=$helm_version cgo=0 ldflags=$ldflags"

bins=(helm)
purpose="helm for the chart tests"
# shellcheck source=../support/cached-go-build.sh
source "$here/../support/cached-go-build.sh"
cached_build_begin "helm ${helm_version}" "a few minutes on 2 cores"
cached_build helm helm.sh/helm/v4/cmd/helm
cached_build_end
