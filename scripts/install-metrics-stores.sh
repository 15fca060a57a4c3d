#!/usr/bin/env bash
# VictoriaMetrics (with vmalert, vmalert-tool and vmagent, shipped in the same package), Prometheus and promtool
# for the real-stack and rule tests and the peers bench (bench/bench_peers.py), from Debian trixie's packages.
#
#   $DCGM_BRIDGE_CACHE/<package>-<upstream version>/   the unpacked .deb (dpkg -x), one per version
#   $DCGM_BRIDGE_CACHE/bin/<binary name>               symlink to a binary in it (what tests/conftest.py's
#                                                      require_binary() looks for)
#
# Works on a fresh Debian bookworm machine as root: trixie's lists go to a private apt dir under the
# cache (-oDir::State::Lists / -oDir::Cache), so the system's sources and package cache stay untouched
# and nothing is installed system-wide. Idempotent; when every version is present it only checks the
# symlinks (no network). Bump a pin: change the version below (the old directory stays, unused).
#
# Why trixie: it has VictoriaMetrics 1.112 (OTLP/HTTP ingest) and Prometheus 2.53.3. Debian's
# Prometheus has its OTLP receiver patched out (#1080354), so it is only used to scrape /metrics.
set -euo pipefail

CACHE="${DCGM_BRIDGE_CACHE:-$HOME/.cache/dcgm-bridge}"
SUITE="${DCGM_BRIDGE_DEBIAN_SUITE:-trixie}"
# package  upstream-version  binary-inside-the-package  (the link is named after the binary)
PACKAGES=(
    "victoria-metrics 1.112.0 usr/bin/victoria-metrics"
    "victoria-metrics 1.112.0 usr/bin/vmalert"
    "victoria-metrics 1.112.0 usr/bin/vmalert-tool"
    "victoria-metrics 1.112.0 usr/bin/vmagent"
    "prometheus 2.53.3 usr/bin/prometheus"
    "promtool 2.53.3 usr/bin/promtool"
)

log() { printf 'install-metrics-stores: %s\n' "$*" >&2; }

link() {  # link NAME TARGET: (re)point $CACHE/bin/NAME at TARGET
    mkdir -p "$CACHE/bin"
    if [ "$(readlink "$CACHE/bin/$1" 2>/dev/null || true)" != "$2" ]; then
        ln -sfn "$2" "$CACHE/bin/$1"
    fi
}

missing=()
for entry in "${PACKAGES[@]}"; do
    read -r name version binary <<<"$entry"
    dir="$CACHE/$name-$version"
    if [ -x "$dir/$binary" ]; then
        link "$(basename "$binary")" "$dir/$binary"
    else
        missing+=("$entry")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    log "all present in $CACHE (warm)"
    exit 0
fi

command -v apt-get >/dev/null && command -v dpkg >/dev/null || {
    log "apt-get and dpkg are needed (a Debian or Ubuntu machine); install the binaries by hand into $CACHE/bin"
    exit 1
}

APTDIR="$CACHE/apt-$SUITE"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" "$APTDIR/debs"
mirror=""
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
    mirror="$(awk '/^deb / && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list)"
fi
mirror="${mirror:-http://deb.debian.org/debian}"
echo "deb $mirror $SUITE main" >"$APTDIR/sources.list"
APT=(
    -o "Dir::Etc::SourceList=$APTDIR/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache"
    -o Debug::NoLocking=1 -o APT::Sandbox::User=root -q
)

# The private lists are refreshed at most once a day: a cold install of another version reuses them.
if [ -z "$(find "$APTDIR/lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
    log "apt-get update ($SUITE from $mirror) into $APTDIR"
    apt-get "${APT[@]}" update >"$APTDIR/update.log" 2>&1 || {
        cat "$APTDIR/update.log" >&2
        exit 1
    }
fi

for entry in "${missing[@]}"; do
    read -r name version binary <<<"$entry"
    if [ -x "$CACHE/$name-$version/$binary" ]; then  # a package with several binaries: unpacked already
        link "$(basename "$binary")" "$CACHE/$name-$version/$binary"
        continue
    fi
    candidate="$(apt-cache "${APT[@]}" policy "$name" | awk '/Candidate:/ {print $2; exit}')"
    # Debian versions look like [epoch:]UPSTREAM+ds1-REV: the pin is on UPSTREAM, any Debian revision will do.
    upstream="${candidate#*:}"
    upstream="${upstream%%[+~-]*}"
    if [ -z "$candidate" ] || [ "$candidate" = "(none)" ]; then
        log "$name: not in $SUITE"
        exit 1
    fi
    if [ "$upstream" != "$version" ]; then
        log "$name: $SUITE now has $candidate, not $version: update the pin in $0"
        exit 1
    fi
    log "$name $candidate: download and unpack into $CACHE/$name-$version"
    rm -f "$APTDIR/debs/${name}_"*.deb
    (cd "$APTDIR/debs" && apt-get "${APT[@]}" download "$name=$candidate" >"$APTDIR/download-$name.log" 2>&1) || {
        cat "$APTDIR/download-$name.log" >&2
        exit 1
    }
    tmp="$(mktemp -d "$CACHE/.$name-$version.XXXXXX")"
    dpkg -x "$APTDIR/debs/${name}_"*.deb "$tmp"
    echo "$candidate" >"$tmp/DEBIAN_VERSION"
    rm -rf "$CACHE/$name-$version"
    mv "$tmp" "$CACHE/$name-$version"  # atomic: a half-unpacked directory is never taken as present
    "$CACHE/$name-$version/$binary" --version >/dev/null 2>&1 || "$CACHE/$name-$version/$binary" -version >/dev/null 2>&1 || {
        log "$name: $CACHE/$name-$version/$binary does not run on this machine"
        exit 1
    }
    link "$(basename "$binary")" "$CACHE/$name-$version/$binary"
done
log "installed into $CACHE"
