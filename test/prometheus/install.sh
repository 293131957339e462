#!/usr/bin/env bash
# Prints the directory holding promtool and prometheus (Prometheus' own rule engine, metrics linter and
# server), taken once from Debian's `prometheus` package into a cache outside the clone. The package is
# downloaded, not installed: no root, no service started, nothing outside the cache touched.
# CERTSHARE_PROMETHEUS_BIN pointing at a directory with both binaries wins.
# Concurrent callers are serialised with a lock; progress goes to stderr, the directory is the only stdout line.
set -euo pipefail
if [[ -n "${CERTSHARE_PROMETHEUS_BIN:-}" ]]; then echo "$CERTSHARE_PROMETHEUS_BIN"; exit 0; fi
# The version the rule tests were written against (Debian bookworm). A newer Debian build of it is fine.
pinned="2.42.0+ds-5+b6"
cache="${CERTSHARE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}"
out="$cache/prometheus-${pinned//[^A-Za-z0-9.]/_}"

complete() { [[ -x "$out/promtool" && -x "$out/prometheus" ]]; }
name="prometheus/install.sh"
# shellcheck source=../support/cached-deb-download.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/cached-deb-download.sh"
deb_cache_begin
fetch_deb prometheus "$pinned"
dpkg-deb -x prometheus_*.deb root
rm -rf "$out.tmp" && mkdir -p "$out.tmp"
cp root/usr/bin/promtool root/usr/bin/prometheus "$out.tmp/"
"$out.tmp/promtool" --version >&2
rm -rf "$out" && mv "$out.tmp" "$out"
echo "$out"
