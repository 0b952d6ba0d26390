#!/usr/bin/env bash
# System packages the test suite drives for real: Debian's Chromium (dashboard browser tests).
# Installed when missing and we are root (as on the project's machines and in CI); otherwise
# says what to install.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
fc-list 2>/dev/null | grep -qi "inter" || need+=(fonts-inter)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
else
  echo "missing system packages: ${need[*]} (install them, e.g. sudo apt-get install ${need[*]})" >&2
fi
