#!/usr/bin/env bash
# Debian's Chromium for the report's browser test (tests/test_report_browser.py drives /usr/bin/chromium
# over the DevTools protocol). Idempotent; as root it installs, otherwise it says what to install.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-chromium: chromium missing; run as root or: apt-get install chromium (the browser test skips)" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends chromium >/dev/null \
  || { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
echo "install-chromium: $(chromium --version 2>/dev/null)" >&2
