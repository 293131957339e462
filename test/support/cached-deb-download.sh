# Sourced by test/prometheus/install.sh and test/proxies/install.sh: binaries taken from Debian's packages
# into a cache outside the clone. The packages are downloaded, not installed: no root needed, no service
# started, nothing outside the cache touched. Concurrent callers are serialised with a lock (only one
# downloads); progress goes to stderr, the cache directory is the only stdout line.
# The caller sets `out` (the cache directory), defines `complete` (true once $out holds what it needs) and
# `name` (for messages), then calls deb_cache_begin TOOL... (the commands it needs) and fetch_deb for each
# package, working in the current directory (a temporary one, removed on exit).

# Prints $out and exits when the cache is complete; otherwise takes the lock and moves to a work directory.
deb_cache_begin() {
  if complete; then echo "$out"; exit 0; fi
  local tool
  for tool in apt-get dpkg-deb "$@"; do
    command -v "$tool" >/dev/null || { echo "$name: $tool is required (Debian's packages)" >&2; exit 1; }
  done
  mkdir -p "$(dirname "$out")"
  if command -v flock >/dev/null; then
    exec 9>"$out.lock"
    flock 9
    if complete; then echo "$out"; exit 0; fi
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  cd "$work"
}

# apt-get download writes as _apt where it can; the work directory is ours, so let it write as root.
download_deb() { apt-get download -q -o APT::Sandbox::User=root "$@" >&2; }

# fetch_deb PACKAGE PINNED: the pinned version, else the candidate after a refresh of the package lists.
fetch_deb() {
  if ! download_deb "$1=$2"; then
    echo "$name: $1 $2 not offered; refreshing the package lists and taking the candidate" >&2
    "$(dirname "${BASH_SOURCE[0]}")/apt-get.sh" update -qq >&2 || true
    download_deb "$1"
  fi
}
