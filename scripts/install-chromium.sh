#!/usr/bin/env bash
# Headless Chromium for tests/report/test_html.py (opens the HTML report, takes a screenshot).
#
#   /usr/bin/chromium                  Debian's `chromium` package, installed with apt-get (as root)
#   $DCGM_BRIDGE_CACHE/bin/chromium    symlink to it: what tests/conftest.py's require_binary() looks for
#
# Idempotent: when Chromium runs already, nothing is fetched and only the symlink is checked. Not root,
# or no apt-get: says what to do and fails, so `make servers` (and CI) stop here.
set -euo pipefail

CACHE="${DCGM_BRIDGE_CACHE:-$HOME/.cache/dcgm-bridge}"
BIN="${DCGM_BRIDGE_CHROMIUM:-/usr/bin/chromium}"
log() { printf 'install-chromium: %s\n' "$*" >&2; }

link() {
    mkdir -p "$CACHE/bin"
    if [ "$(readlink "$CACHE/bin/chromium" 2>/dev/null || true)" != "$BIN" ]; then
        ln -sfn "$BIN" "$CACHE/bin/chromium"
    fi
}

if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    link
    log "present: $("$BIN" --version 2>/dev/null | head -1)"
    exit 0
fi
if ! command -v apt-get >/dev/null; then
    log "apt-get is needed (Debian or Ubuntu); install Chromium by hand and set DCGM_BRIDGE_CHROMIUM"
    exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
    log "run as root (or: sudo apt-get update && sudo apt-get install -y chromium fonts-dejavu-core)"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log "apt-get update"
apt-get update -q >/dev/null
log "apt-get install chromium"
apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core >/dev/null
"$BIN" --version >/dev/null 2>&1 || {
    log "$BIN does not run after the install"
    exit 1
}
link
log "installed: $("$BIN" --version 2>/dev/null | head -1)"
