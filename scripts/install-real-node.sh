#!/usr/bin/env bash
# The test cluster's real node (tests/cluster/real_node.py) runs Debian's containerd and runc with
# the CNI plugins, and builds its pause and busybox images with gcc and umoci; iptables keeps its
# pods' traffic on the machine. Installs what is missing with apt (sudo when not root).
set -euo pipefail
missing=()
need() { command -v "$1" >/dev/null 2>&1 || [ -e "$1" ] || missing+=("$2"); }
need containerd containerd
need runc runc
need /usr/lib/cni/bridge containernetworking-plugins
need umoci umoci
need gcc gcc
need /usr/lib/x86_64-linux-gnu/libc.a libc6-dev
need iptables iptables
need ip iproute2
need setpriv util-linux
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
