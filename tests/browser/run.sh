#!/usr/bin/env bash
# The web demo's browser test: installs Debian's Chromium if it is missing,
# installs playwright-core (npm ci; it never downloads a browser of its own),
# and runs demo.test.js against an already built server binary:
#
#   cargo build --release -p ordo-server --bin ordo
#   tests/browser/run.sh
#
# ORDO_BIN (default target/release/ordo) picks another binary; CHROMIUM_BIN another
# browser; ORDO_UPDATE_SCREENSHOTS=1 rewrites docs/demo-room-list.png,
# docs/demo-second-user.png and docs/demo-phone.png (otherwise the screenshots go to
# target/browser-test/). The test starts `ordo serve --demo` (auth on) itself, and a
# second server with --allow-origin for its cross-origin check.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

chromium_bin="${CHROMIUM_BIN:-/usr/bin/chromium}"
if [ ! -x "$chromium_bin" ]; then
    echo "tests/browser: installing Debian's chromium"
    apt_install chromium
fi
# The screenshots show Japanese names and emoji: without these fonts they are boxes.
# Only worth the download when the screenshots are kept.
if [ "${ORDO_UPDATE_SCREENSHOTS:-}" = "1" ] && ! fc-list :lang=ja 2>/dev/null | grep -q .; then
    echo "tests/browser: installing fonts for the screenshots"
    apt_install fonts-noto-cjk fonts-noto-color-emoji
fi

export ORDO_BIN="${ORDO_BIN:-$repo/target/release/ordo}"
if [ ! -x "$ORDO_BIN" ]; then
    echo "tests/browser: no server binary at $ORDO_BIN; build it first:" >&2
    echo "    cargo build --release -p ordo-server --bin ordo" >&2
    exit 1
fi

cd "$here"
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
node --test demo.test.js
