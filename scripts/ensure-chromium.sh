#!/bin/sh
# Make sure Debian's chromium and chromium-driver are installed: tests/ui/test_ui.py drives the /ui
# page in a real headless browser through Selenium. CI starts from a fresh Debian machine as root,
# so install them from the distribution's packages when missing (no browser download of its own).
set -eu
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "ensure-chromium: chromium/chromedriver missing; run as root or install the chromium and chromium-driver packages" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
command -v chromium >/dev/null && command -v chromedriver >/dev/null
