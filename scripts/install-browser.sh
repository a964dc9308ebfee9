#!/usr/bin/env bash
# The browser of the end-to-end tests (tests/e2e, driven by Playwright's Python package): Debian's
# Chromium at /usr/bin/chromium. Idempotent: installs only when it is missing. Never use
# `playwright install`, which downloads a browser build of its own.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
echo "installing Chromium from Debian's packages"
sudo=""
if [ "$(id -u)" != 0 ]; then sudo=sudo; fi
$sudo apt-get update -qq
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
/usr/bin/chromium --version
