# Sourced by test/{k8s,tailscale,helm}-binaries/build.sh: binaries built once from
# Go modules into a cache outside the clone, keyed by a recipe stamp; concurrent callers serialised
# with a lock (only one builds); progress on stderr, the directory as the only stdout line.
# The caller sets `here` (the module), `out` (the cache directory), `recipe`, `bins` (array), `ldflags`
# and `purpose` (what the binaries are for, for the "go is required" message), then calls
# cached_build_begin "<what is built>" "<how long it takes>", cached_build NAME PACKAGE for each binary,
# cached_build_end.

cached_build_complete() {
  local bin
  for bin in "${bins[@]}"; do [[ -x "$out/$bin" ]] || return 1; done
  [[ "$(cat "$out/.recipe" 2>/dev/null)" == "$recipe" ]]
}

# Prints $out and exits when the cache is complete; otherwise takes the lock and prepares $out.tmp.
cached_build_begin() {
  if cached_build_complete; then echo "$out"; exit 0; fi
  # The Go toolchain's usual place, for a caller whose PATH lacks it (a clean environment, as CI may give).
  command -v go >/dev/null || { [[ -x /usr/local/go/bin/go ]] && PATH="/usr/local/go/bin:$PATH"; }
  command -v go >/dev/null || { echo "build.sh: go is required to build $purpose" >&2; exit 1; }
  mkdir -p "$(dirname "$out")"
  if command -v flock >/dev/null; then
    exec 9>"$out.lock"
    if ! flock -n 9; then
      echo "build.sh: waiting for another build of $out to finish" >&2
      flock 9
    fi
    if cached_build_complete; then echo "$out"; exit 0; fi
  fi
  rm -rf "$out.tmp" && mkdir -p "$out.tmp"
  cd "$here"
  # -trimpath and no debug info keep the binaries small; CGO off matches upstream release builds.
  export CGO_ENABLED=0
  build_flags=(-trimpath -buildvcs=false -ldflags "$ldflags")
  build_start=$SECONDS
  heartbeat=""
  trap '[[ -n "$heartbeat" ]] && kill "$heartbeat" 2>/dev/null || true' EXIT
  echo "build.sh: building $1 into $out (first time only; $2)" >&2
}

cached_build() { # name package
  local t=$SECONDS
  echo "build.sh: building $1 (elapsed $((SECONDS - build_start))s)" >&2
  # A line a minute so that CI logs (and the test harness's stderr) show the build is alive. fd 9 (the
  # lock) is closed in it: a heartbeat still sleeping after a failed build must not hold the lock.
  ( exec 9>&-; while sleep 60; do echo "build.sh: still building $1 ($((SECONDS - t))s)" >&2; done ) &
  heartbeat=$!
  go build "${build_flags[@]}" -o "$out.tmp/$1" "$2" >&2
  kill "$heartbeat" 2>/dev/null || true; wait "$heartbeat" 2>/dev/null || true; heartbeat=""
  echo "build.sh: built $1 in $((SECONDS - t))s" >&2
}

cached_build_end() {
  printf '%s\n' "$recipe" >"$out.tmp/.recipe"
  rm -rf "$out" && mv "$out.tmp" "$out"
  echo "build.sh: done in $((SECONDS - build_start))s" >&2
  echo "$out"
}
