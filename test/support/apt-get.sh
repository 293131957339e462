#!/usr/bin/env bash
# apt-get for the tiers' installers, one at a time. Two test files may set up at once (the real-cluster tier's
# packages, a proxy image's .debs), and apt refuses a second process its lock at once ("Could not get lock
# /var/lib/apt/lists/lock"): certshare's callers queue on one lock file of their own, and whatever else holds apt's
# lock (another installer of the machine's) is waited for too.
set -euo pipefail
exec flock -w 1800 "${TMPDIR:-/tmp}/certshare-apt.lock" apt-get -o DPkg::Lock::Timeout=900 "$@"
