#!/usr/bin/env bash
# Installs Debian's Chromium and ChromeDriver for the dashboard's browser test
# (tests/dashboard.rs). Idempotent; needs root (apt-get), as CI has.
set -euo pipefail
if [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]; then
    echo "chromium: installed ($(/usr/bin/chromium --version 2>/dev/null | head -1))"
    exit 0
fi
echo "chromium: installing Debian's chromium and chromium-driver (apt-get)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends chromium chromium-driver > /dev/null
echo "chromium: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
