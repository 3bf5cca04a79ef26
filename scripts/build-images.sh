#!/usr/bin/env bash
# Build rollserve's base test image, idempotently:
#   $PREFIX/images/base      Debian 12 minbase root filesystem (git, patch, tmux, less, python3,
#                            procps, ca-certificates): an Apptainer sandbox directory, also usable as a
#                            bubblewrap root filesystem
#   $PREFIX/images/base.sif  the same as a SIF file (`apptainer build` from the directory)
# Each is skipped when it exists with its stamp ($PREFIX/images/.base.ok, .base.sif.ok); a
# half-built one (no stamp) is removed and rebuilt.  Rebuilding the directory rebuilds the SIF.
#
# Environment: ROLLSERVE_TOOLS_DIR (default /opt/rollserve), ROLLSERVE_APT_MIRROR (default: the
# host's Debian mirror from its apt sources), ROLLSERVE_IMAGE_SUITE (default bookworm),
# ROLLSERVE_SKIP_SIF=1 (directory only).  Needs root (debootstrap).
set -euo pipefail

PREFIX=${ROLLSERVE_TOOLS_DIR:-/opt/rollserve}
IMAGES=$PREFIX/images
SUITE=${ROLLSERVE_IMAGE_SUITE:-bookworm}
PACKAGES=git,patch,tmux,less,python3,procps,ca-certificates
DIR=$IMAGES/base
SIF=$IMAGES/base.sif
DIR_STAMP=$IMAGES/.base.ok
SIF_STAMP=$IMAGES/.base.sif.ok

LOG_NAME=build-images
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

# The stamp holds what the image was built from: a changed package list rebuilds it.
dir_ok() { [[ -f $DIR_STAMP && $(cat "$DIR_STAMP") == "$SUITE $PACKAGES" && -x $DIR/bin/bash ]]; }
sif_ok() { [[ -f $SIF_STAMP && -s $SIF && ! $SIF -nt $SIF_STAMP ]]; }

if dir_ok && { [[ ${ROLLSERVE_SKIP_SIF:-0} == 1 ]] || sif_ok; }; then
    log "up to date: $DIR$([[ ${ROLLSERVE_SKIP_SIF:-0} == 1 ]] || echo " and $SIF")"
    exit 0
fi

[[ $(id -u) == 0 ]] || die "building images needs root (debootstrap); rerun as root"
command -v debootstrap >/dev/null || die "debootstrap missing (apt-get install debootstrap)"
T0=$SECONDS



mkdir -p "$IMAGES"
exec 9>"$IMAGES/.build.lock"
flock 9   # serialise concurrent builds

# 1. the sandbox directory
if ! dir_ok; then
    MIRROR=$(detect_mirror)
    rm -f "$DIR_STAMP" "$SIF_STAMP"
    [[ -e $DIR ]] && { log "removing incomplete $DIR"; safe_rm "$DIR"; }
    log "debootstrap --variant=minbase --include=$PACKAGES $SUITE $DIR $MIRROR ..."
    t=$SECONDS
    # private mount namespace: debootstrap's /proc, /sys mounts cannot leak if it is killed
    if ! unshare --mount --propagation private -- debootstrap --variant=minbase \
        --include="$PACKAGES" "$SUITE" "$DIR" "$MIRROR" >"$IMAGES/debootstrap-base.log" 2>&1; then
        tail -n 20 "$IMAGES/debootstrap-base.log" >&2
        die "debootstrap failed (full log: $IMAGES/debootstrap-base.log)"
    fi
    rm -rf "$DIR"/var/cache/apt/archives/*.deb "$DIR"/var/lib/apt/lists/*_Packages* || true
    # mount points apptainer binds by default / rollserve uses
    mkdir -p "$DIR/workspace"
    [[ -x $DIR/usr/bin/python3 && -x $DIR/bin/bash ]] || die "debootstrap finished but $DIR lacks python3 or bash"
    echo "$SUITE $PACKAGES" >"$DIR_STAMP"
    log "directory image done in $((SECONDS - t)) s ($(du -sh "$DIR" | cut -f1))"
fi

[[ ${ROLLSERVE_SKIP_SIF:-0} == 1 ]] && { log "done in $((SECONDS - T0)) s (SIF skipped)"; exit 0; }

# 2. the SIF file
if ! sif_ok; then
    "$(dirname "$0")/install-apptainer.sh"
    rm -f "$SIF_STAMP"
    log "apptainer build $SIF from $DIR ..."
    t=$SECONDS
    tmp=$IMAGES/.base.sif.tmp
    rm -f "$tmp"
    # As root, `apptainer build SIF DIR` only runs mksquashfs on the directory (no namespaces).
    if ! apptainer build --force "$tmp" "$DIR" >"$IMAGES/build-sif.log" 2>&1; then
        tail -n 20 "$IMAGES/build-sif.log" >&2
        rm -f "$tmp"
        die "apptainer build failed (full log: $IMAGES/build-sif.log)"
    fi
    mv -f "$tmp" "$SIF"
    touch "$SIF_STAMP"
    log "SIF done in $((SECONDS - t)) s ($(du -sh "$SIF" | cut -f1))"
fi
log "done in $((SECONDS - T0)) s"
