#!/usr/bin/env bash
# Prints a directory whose bin/ holds nginx and haproxy: the binaries of Debian's `nginx` and `haproxy`
# packages (the proxies users run, and the ones the cluster tier's images are built from), taken once into a
# cache outside the clone with the libraries they need that this host lacks. The packages are downloaded,
# not installed: no root, no service started, nothing outside the cache touched. bin/ holds wrappers that
# exec the binary with those libraries on LD_LIBRARY_PATH (exec: the proxy keeps the wrapper's pid).
# CERTSHARE_PROXIES_BIN pointing at a directory with bin/nginx and bin/haproxy wins.
# Concurrent callers are serialised with a lock; progress goes to stderr, the directory is the only stdout line.
set -euo pipefail
if [[ -n "${CERTSHARE_PROXIES_BIN:-}" ]]; then echo "$CERTSHARE_PROXIES_BIN"; exit 0; fi
# The versions the tests were written against (Debian bookworm: HAProxy 2.6, nginx 1.22). A newer Debian build is fine.
pinned_haproxy="2.6.12-1+deb12u3"
pinned_nginx="1.22.1-9+deb12u7"
cache="${CERTSHARE_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/certshare}"
out="$cache/proxies-haproxy-${pinned_haproxy//[^A-Za-z0-9.]/_}-nginx-${pinned_nginx//[^A-Za-z0-9.]/_}"

complete() { [[ -x "$out/bin/haproxy" && -x "$out/bin/nginx" ]]; }
name="proxies/install.sh"
# shellcheck source=../support/cached-deb-download.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/cached-deb-download.sh"
deb_cache_begin apt-cache dpkg-query ldd
fetch_deb haproxy "$pinned_haproxy"
fetch_deb nginx "$pinned_nginx"
rm -rf "$out.tmp" && mkdir -p "$out.tmp/bin" "$out.tmp/root"
for deb in haproxy_*.deb nginx_*.deb; do dpkg-deb -x "$deb" "$out.tmp/root"; done

# The library packages they depend on that this host lacks, and theirs in turn.
libs="$out.tmp/root/usr/lib/x86_64-linux-gnu:$out.tmp/root/lib/x86_64-linux-gnu"
seen=" "
queue="$(dpkg-deb -f haproxy_*.deb Depends), $(dpkg-deb -f nginx_*.deb Depends)"
while [[ -n "$queue" ]]; do
  next=""
  for dep in $(tr ',' '\n' <<<"$queue" | sed -E 's/^\s*//; s/[ (:|].*//' | grep -E '^lib' | sort -u); do
    [[ "$seen" == *" $dep "* ]] && continue
    seen+="$dep "
    if [[ "$(dpkg-query -W -f='${Status}' "$dep" 2>/dev/null || true)" == "install ok installed" ]]; then continue; fi
    download_deb "$dep"
    deb="$(ls "${dep}"_*.deb)"
    dpkg-deb -x "$deb" "$out.tmp/root"
    next+="$(dpkg-deb -f "$deb" Depends), "
  done
  queue="$next"
done

for tool in haproxy nginx; do
  if LD_LIBRARY_PATH="$libs" ldd "$out.tmp/root/usr/sbin/$tool" | grep 'not found' >&2; then
    echo "proxies/install.sh: $tool still misses libraries (above)" >&2; exit 1
  fi
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s/root/usr/lib/x86_64-linux-gnu:%s/root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/root/usr/sbin/%s" "$@"\n' \
    "$out" "$out" "$out" "$tool" >"$out.tmp/bin/$tool"
  chmod 755 "$out.tmp/bin/$tool"
done
rm -rf "$out" && mv "$out.tmp" "$out"
"$out/bin/haproxy" -v | sed -n 1p >&2
"$out/bin/nginx" -v >&2
echo "$out"
