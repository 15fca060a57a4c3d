#!/usr/bin/env bash
# Installs the real Kubernetes API tier used by tests/kube: etcd + apiextensions-apiserver.
#
# Nothing ships kube-apiserver as a registry package, but Debian sid packages the Go source of
# k8s.io/apiextensions-apiserver (the CRD server kube-apiserver embeds) with its whole dependency
# closure, plus a Go toolchain. We download those .debs through a *private* apt directory (the host's
# apt state is never touched), unpack them and build one static binary. etcd comes from the host
# release's etcd-server package, fetched the same private way.
#
#   install dir : ${DCGM_BRIDGE_CACHE:-$HOME/.cache/dcgm-bridge}/kube-apiext<ver>-etcd<ver>/
#   symlinks    : $DCGM_BRIDGE_CACHE/bin/{etcd,apiextensions-apiserver}
#   GOCACHE     : $DCGM_BRIDGE_CACHE/gocache (kept, so a rebuild for a new sid version takes < 1 min)
#
# Warm (symlinks resolve to a finished install): exits at once, no network. `--refresh` asks sid for
# its current versions and builds a new keyed dir when they moved on.
# If the Debian toolchain cannot be obtained (sid unreachable, source package gone), the reason is
# written to $DCGM_BRIDGE_CACHE/kube-apiserver.unavailable and the script exits 0: the test tier then
# skips with that reason on a developer machine, and fails with it in CI (CI=true), which must run the tier.
# A *build* failure is a real failure (exit 1).
set -euo pipefail

CACHE=${DCGM_BRIDGE_CACHE:-$HOME/.cache/dcgm-bridge}
BIN="$CACHE/bin"
MARKER="$CACHE/kube-apiserver.unavailable"
RECIPE=1   # bump when the build recipe changes, so old installs are not taken as current
REFRESH=0
[[ "${1:-}" == "--refresh" ]] && REFRESH=1

log() { printf '[install-kube-apiserver] %s\n' "$*" >&2; }

installed_dir() {
    # The dir both symlinks point into, if it is a finished install of this recipe.
    local a e
    a=$(readlink -f "$BIN/apiextensions-apiserver" 2>/dev/null) || return 1
    e=$(readlink -f "$BIN/etcd" 2>/dev/null) || return 1
    [[ -x "$a" && -x "$e" ]] || return 1
    local d; d=$(dirname "$(dirname "$a")")
    [[ "$(cat "$d/.complete" 2>/dev/null)" == "recipe=$RECIPE" ]] || return 1
    echo "$d"
}

ensure_openssl() {
    # The test fixture makes its PKI with the openssl CLI; slim images may lack it.
    command -v openssl >/dev/null && return 0
    log "installing openssl (the test fixture makes its certificates with it)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl
}

unavailable() {
    mkdir -p "$CACHE"
    printf '%s\n' "$*" > "$MARKER"
    log "Debian toolchain unavailable: $* (wrote $MARKER; the kube-apiserver test tier will skip, and fail in CI)"
    exit 0
}

if [[ $REFRESH == 0 ]] && d=$(installed_dir); then
    ensure_openssl
    log "present: $d"
    exit 0
fi

START=$SECONDS
mkdir -p "$CACHE" "$BIN"
APTW="$CACHE/apt-sid"
mkdir -p "$APTW"/{lists/partial,cache/archives/partial,etc}
: > "$APTW/empty-status"

# Reuse the mirror the host is configured with (deb822 or one-line format); only sid and the host's
# own release are listed, in our private directory.
# Third-party sources (nodesource, cloud SDKs…) may sit beside it: take the first URI naming debian.
MIRROR=$(awk '/^URIs:/ && $2 ~ /debian/ && $2 !~ /security/ {print $2; exit}' \
    /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
if [[ -z "$MIRROR" ]]; then
    MIRROR=$(awk '$1 == "deb" { u = ($2 ~ /^\[/) ? $3 : $2; if (u ~ /debian/ && u !~ /security/) { print u; exit } }' \
        /etc/apt/sources.list 2>/dev/null || true)
fi
MIRROR=${DCGM_BRIDGE_DEBIAN_MIRROR:-$MIRROR}   # override for testing the "unavailable" path
[[ -n "$MIRROR" ]] || unavailable "no Debian mirror configured in /etc/apt"
MIRROR=${MIRROR%/}
# The host's mirror may be debian-security first; the main archive sits beside it.
MIRROR=${MIRROR%-security}
HOST_SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
printf 'Types: deb\nURIs: %s\nSuites: sid %s\nComponents: main\nSigned-By: %s\n' \
    "$MIRROR" "$HOST_SUITE" "$KEYRING" > "$APTW/etc/private.sources"

APT=(-o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$APTW/etc"
     -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts="$APTW/etc"
     -o Dir::State::Lists="$APTW/lists" -o Dir::Cache="$APTW/cache"
     -o Dir::State::status="$APTW/empty-status" -o APT::Sandbox::User=root
     -o APT::Default-Release=sid -o Acquire::Languages=none)

log "reading sid and $HOST_SUITE package lists from $MIRROR (private apt dir $APTW)"
apt-get "${APT[@]}" update -qq >/dev/null 2>"$APTW/update.err" \
    || unavailable "apt-get update for Debian sid failed: $(tail -1 "$APTW/update.err")"
# apt-get update exits 0 when an index can't be fetched ("W: Failed to fetch …"): check the lists.
if ! compgen -G "$APTW/lists/*_dists_sid_main_*Packages*" >/dev/null; then
    unavailable "cannot download the Debian sid package lists from $MIRROR: $(grep -m1 -E '^(W|E):' "$APTW/update.err" || echo 'no index fetched')"
fi

pkg_version() {  # pkg_version NAME SUITE -> the candidate version in that suite, or nothing
    apt-cache "${APT[@]}" madison "$1" 2>/dev/null | awk -v s="$2" '$0 ~ s"/main" {print $3; exit}'
}
APIEXT_VER=$(pkg_version golang-k8s-apiextensions-apiserver-dev sid)
[[ -n "$APIEXT_VER" ]] || unavailable "Debian sid has no golang-k8s-apiextensions-apiserver-dev"
ETCD_VER=$(pkg_version etcd-server "$HOST_SUITE")
ETCD_SUITE=$HOST_SUITE
if [[ -z "$ETCD_VER" ]]; then
    ETCD_VER=$(pkg_version etcd-server sid); ETCD_SUITE=sid
fi
[[ -n "$ETCD_VER" ]] || unavailable "no etcd-server package in $HOST_SUITE or sid"

KEY="kube-apiext${APIEXT_VER%%-*}-etcd${ETCD_VER%%-*}"
W="$CACHE/$KEY"
link() {
    ln -sfn "$W/bin/apiextensions-apiserver" "$BIN/apiextensions-apiserver"
    ln -sfn "$W/bin/etcd" "$BIN/etcd"
    rm -f "$MARKER"
}
if [[ "$(cat "$W/.complete" 2>/dev/null)" == "recipe=$RECIPE" ]]; then
    link; ensure_openssl
    log "present: $W"
    exit 0
fi

log "building $KEY (cold: about 7 minutes on 2 cores)"
rm -rf "$W"
mkdir -p "$W"/{debs,tree,bin,tmp}

# The build closure: every -dev source package plus the Go compiler itself (golang-1.NN-go/src).
PKGS=$(apt-get "${APT[@]}" -s install --no-install-recommends \
        golang-k8s-apiextensions-apiserver-dev/sid golang-go/sid 2>"$APTW/sim.err" \
    | awk '/^Inst/ {print $2}' | grep -E -- '-dev$|^golang-1\.[0-9]+-(go|src)$' || true)
[[ -n "$PKGS" ]] || unavailable "cannot resolve the sid build closure: $(tail -1 "$APTW/sim.err")"
log "downloading $(wc -w <<<"$PKGS") packages"
# shellcheck disable=SC2086  # word splitting of the package list is intended
(cd "$W/debs" && apt-get "${APT[@]}" download $PKGS >/dev/null 2>"$W/download.err") \
    || unavailable "downloading the sid Go packages failed: $(tail -1 "$W/download.err")"
(cd "$W/debs" && apt-get "${APT[@]}" download "etcd-server/$ETCD_SUITE" >/dev/null 2>"$W/download.err") \
    || unavailable "downloading etcd-server from $ETCD_SUITE failed: $(tail -1 "$W/download.err")"

log "unpacking"
for f in "$W"/debs/*.deb; do
    [[ "$f" == */etcd-server_* ]] && continue
    dpkg-deb -x "$f" "$W/tree"
done
mkdir -p "$W/etcd"
dpkg-deb -x "$W"/debs/etcd-server_*.deb "$W/etcd"
cp "$W/etcd/usr/bin/etcd" "$W/bin/etcd"

GOROOT=$(ls -d "$W"/tree/usr/lib/go-1.* | sort -V | tail -1)   # Debian's go binary is static
[[ -x "$GOROOT/bin/go" ]] || { log "no go binary under $W/tree/usr/lib"; exit 1; }
export GOROOT PATH="$GOROOT/bin:$PATH" GOPATH="$W/tree/usr/share/gocode" GO111MODULE=off GOPROXY=off \
       GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0 GOCACHE="$CACHE/gocache" GOTMPDIR="$W/tmp"
log "go build ($("$GOROOT/bin/go" version | awk '{print $3}'))"
(cd "$GOPATH/src/k8s.io/apiextensions-apiserver" \
    && go build -trimpath -ldflags="-s -w" -o "$W/bin/apiextensions-apiserver" .)

"$W/bin/etcd" --version >/dev/null
"$W/bin/apiextensions-apiserver" --help >/dev/null 2>&1 || true

# The unpacked sources (2.3 GB) and the .debs are only needed to build; GOCACHE stays for rebuilds.
rm -rf "$W/tree" "$W/debs" "$W/etcd" "$W/tmp"
printf 'golang-k8s-apiextensions-apiserver-dev %s (sid)\netcd-server %s (%s)\n' \
    "$APIEXT_VER" "$ETCD_VER" "$ETCD_SUITE" > "$W/VERSIONS"
echo "recipe=$RECIPE" > "$W/.complete"
link
ensure_openssl
log "built $KEY in $((SECONDS - START)) s"
