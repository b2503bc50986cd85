#!/bin/sh
# The browser tests drive Debian's Chromium through Playwright; no test tool
# downloads a browser of its own. Install the Debian packages if missing.
set -u
CHROMIUM="${LEASING_CHROMIUM:-/usr/bin/chromium}"
if [ -x "$CHROMIUM" ]; then exit 0; fi
if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" != "0" ]; then SUDO="sudo -n"; fi
    echo "Installing Debian's chromium and chromium-driver for the browser tests..." >&2
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
        || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q chromium chromium-driver >/dev/null; }
fi
if [ -x "$CHROMIUM" ]; then exit 0; fi
echo "Chromium is not installed at $CHROMIUM: install Debian's chromium and chromium-driver packages (apt-get install chromium chromium-driver), or set LEASING_CHROMIUM to a Chromium binary." >&2
exit 1
