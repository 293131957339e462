#!/usr/bin/env bash
# Installs the Debian packages the real-cluster tier runs on (test/cluster/cluster.ts): containerd, runc,
# the CNI plugins, iptables and conntrack (kube-proxy), dnsmasq (the cluster's DNS), busybox-static (the
# sandbox image). Needs root and Debian's package archive; does nothing when every tool is present.
# None of them starts by itself (no systemd here; the harness starts containerd with its own config).
# Versions: whatever Debian 12 (bookworm) serves; cluster.ts checks the containerd and runc it finds.
set -euo pipefail
need=()
declare -A tools=(
  [containerd]=containerd [runc]=runc [iptables]=iptables [conntrack]=conntrack
  [dnsmasq]=dnsmasq-base [busybox]=busybox-static [nsenter]=util-linux [ip]=iproute2
)
for tool in "${!tools[@]}"; do command -v "$tool" >/dev/null || need+=("${tools[$tool]}"); done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || need+=(containernetworking-plugins)
# busybox-static replaces the dynamic busybox binary: check it is the static one.
if command -v busybox >/dev/null && ldd "$(command -v busybox)" >/dev/null 2>&1; then need+=(busybox-static); fi
if ((${#need[@]} == 0)); then exit 0; fi
if [[ "$(id -u)" != 0 ]]; then
  echo "cluster/install.sh: the real-cluster tier needs these Debian packages, and root to install them: ${need[*]}" >&2
  exit 1
fi
echo "cluster/install.sh: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt_get="$(dirname "${BASH_SOURCE[0]}")/../support/apt-get.sh"
"$apt_get" update -qq >&2
"$apt_get" install -y -qq --no-install-recommends "${need[@]}" >&2
