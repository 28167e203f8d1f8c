#!/usr/bin/env bash
# The browser tests (tests/ui) drive Debian's Chromium; Playwright downloads no browser.
# Installs it with apt when it is missing (sudo when not root); $CHROMIUM may point elsewhere.
set -euo pipefail
if [ -n "${CHROMIUM:-}" ] || [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
