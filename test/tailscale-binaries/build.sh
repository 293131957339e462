#!/usr/bin/env bash
# Prints the directory holding tailscaled, tailscale (the CLI), containerboot (the entrypoint of Tailscale's
# container image, for the real-cluster tier) and tsenv (Tailscale's test control
# server + the pebble ACME server, ./tsenv), building them once from Go modules (through the module
# proxy, versions pinned in go.mod/go.sum) into a cache outside the clone. CERTSHARE_TAILSCALE_BIN wins.
# Concurrent callers (parallel test files) are serialised with a lock; only one builds.
# Progress goes to stderr; the directory is the only stdout line.
set -euo pipefail
if [[ -n "${CERTSHARE_TAILSCALE_BIN:-}" ]]; then echo "$CERTSHARE_TAILSCALE_BIN"; exit 0; fi
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ts_version="$(awk '$1=="tailscale.com"{print $2; exit}' "$here/go.mod")"
pebble_version="$(awk '$1=="github.com/letsencrypt/pebble/v2"{print $2; exit}' "$here/go.mod")"
cache="${CERTSHARE_TAILSCALE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}"
out="$cache/tailscale-${ts_version}-pebble-${pebble_version}"

# Without the stamps tailscaled reports `-ERR-BuildInfo` as its version (Tailscale-Version header).
short="${ts_version#v}"
ldflags="-s -w -X tailscale.com/version.longStamp=${short}-certshare-test -X tailscale.com/version.shortStamp=${short}"
# The recipe stamp makes an old cache (other flags, other tsenv source) rebuild; with a warm Go build
# cache that is a relink.
tsenv_sum="$(cat "$here/go.mod" "$here/go.sum" "$here"/tsenv/*.go | sha256sum | cut -c1-16)"
recipe="tailscale=$ts_version pebble=$pebble_version tsenv=$tsenv_sum cgo=0 ldflags=$ldflags"

bins=(tailscaled tailscale containerboot tsenv)
purpose="tailscaled for the tests"
# shellcheck source=../support/cached-go-build.sh
source "$here/../support/cached-go-build.sh"
cached_build_begin "tailscaled ${ts_version}, tailscale and tsenv (pebble ${pebble_version})" "about 4 minutes on 2 cores"
cached_build tailscaled tailscale.com/cmd/tailscaled
cached_build tailscale tailscale.com/cmd/tailscale
cached_build containerboot tailscale.com/cmd/containerboot
cached_build tsenv ./tsenv
cached_build_end
