#!/usr/bin/env bash
# The test cluster's images (tests/cluster/images.py) are built with Debian's debootstrap and
# buildah, and tests/integration/test_cluster_images.py imports them with containerd's ctr.
# Installs whichever is missing with apt (sudo when not root).
set -euo pipefail
missing=()
command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
command -v buildah >/dev/null || missing+=(buildah)
command -v containerd >/dev/null || missing+=(containerd)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
