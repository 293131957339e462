#!/usr/bin/env bash
# Prints the directory holding tailscaled, tailscale (the CLI) and tsenv (Tailscale's test control
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

complete() { [[ -x "$out/tailscaled" && -x "$out/tailscale" && -x "$out/tsenv" && "$(cat "$out/.recipe" 2>/dev/null)" == "$recipe" ]]; }
if complete; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: go is required to build tailscaled for the tests" >&2; exit 1; }
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
export CGO_ENABLED=0
flags=(-trimpath -buildvcs=false -ldflags "$ldflags")
start=$SECONDS
heartbeat=""
trap '[[ -n "$heartbeat" ]] && kill "$heartbeat" 2>/dev/null || true' EXIT
build() { # name package
  local t=$SECONDS
  echo "build.sh: building $1 (elapsed $((SECONDS - start))s)" >&2
  # A line a minute so that CI logs (and the test harness's stderr) show the build is alive.
  # fd 9 (the lock) closed in it: a sleeping heartbeat must not hold the lock after a failed build.
  ( exec 9>&-; while sleep 60; do echo "build.sh: still building $1 ($((SECONDS - t))s)" >&2; done ) &
  heartbeat=$!
  go build "${flags[@]}" -o "$out.tmp/$1" "$2" >&2
  kill "$heartbeat" 2>/dev/null || true; wait "$heartbeat" 2>/dev/null || true; heartbeat=""
  echo "build.sh: built $1 in $((SECONDS - t))s" >&2
}
echo "build.sh: building tailscaled ${ts_version}, tailscale and tsenv (pebble ${pebble_version}) into $out (first time only; minutes on 2 cores)" >&2
build tailscaled tailscale.com/cmd/tailscaled
build tailscale tailscale.com/cmd/tailscale
build tsenv ./tsenv
printf '%s\n' "$recipe" >"$out.tmp/.recipe"
rm -rf "$out" && mv "$out.tmp" "$out"
echo "build.sh: done in $((SECONDS - start))s" >&2
echo "$out"
