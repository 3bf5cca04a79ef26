#!/usr/bin/env bash
# Install Apptainer for rollserve on Debian 12 (bookworm), idempotently.
#
# Apptainer is not packaged for Debian 12, and Debian sid's apptainer needs glibc >= 2.38, so it
# runs from a Debian sid root filesystem ($PREFIX/sid-root) that a small wrapper
# ($BINDIR/apptainer, plus a `singularity` symlink) enters with a private mount namespace and
# pivot_root (a plain chroot would forbid the user namespaces apptainer needs).
#
# Fast path: if `apptainer --version` or `singularity --version` already works, exit 0 at once.
#
# Environment:
#   ROLLSERVE_TOOLS_DIR      prefix for the sid root (default /opt/rollserve)
#   ROLLSERVE_BIN_DIR        where the wrapper goes (default /usr/local/bin)
#   ROLLSERVE_APT_MIRROR     Debian mirror URL (default: read from the host's apt sources)
#   ROLLSERVE_APPTAINER_BINDS  extra colon-separated absolute directories to make reachable
#                            (at the same path) through the wrapper, besides the fixed list below
#   ROLLSERVE_FORCE_INSTALL=1  skip the fast path (rebuilds only what lacks a stamp)
#   ROLLSERVE_APPTAINER_SQUASHFUSE=0  do not install squashfuse (see step 2)
#
# Needs root for the install itself (debootstrap); the installed wrapper also works rootless
# (it then uses `unshare --user --map-current-user`, see the wrapper's comments).
set -euo pipefail

PREFIX=${ROLLSERVE_TOOLS_DIR:-/opt/rollserve}
BINDIR=${ROLLSERVE_BIN_DIR:-/usr/local/bin}
SIDROOT=$PREFIX/sid-root
# Host directories bound at the same path inside the sid root (when they exist on the host): every
# top-level directory of the host but the system's own (those are the sid root's), and /var/tmp.
# The one that holds the sid root comes first, so that its recursive bind does not copy the other
# binds made into the sid root.  The wrapper binds top-level directories made after the install too.
SYSTEM_DIRS="bin boot dev etc lib lib32 lib64 libx32 lost+found proc run sbin sys usr var"
# Bumped whenever the wrapper or its fstab changes: an older wrapper is then rewritten.
WRAPPER_REVISION=2
host_binds() {
    local rel=${SIDROOT#/}
    local top=${rel%%/*} d
    local -a dirs=()
    [[ -d /$top && ! -L /$top && " $SYSTEM_DIRS " != *" $top "* ]] && dirs+=("/$top")
    for d in /* /opt /tmp /root /home /work /srv /mnt /media /data; do
        [[ -L $d || (-e $d && ! -d $d) ]] && continue
        [[ " $SYSTEM_DIRS " == *" ${d#/} "* ]] && continue
        [[ " ${dirs[*]} " == *" $d "* ]] || dirs+=("$d")
    done
    printf '%s\n' "${dirs[@]}" /var/tmp
}

LOG_NAME=install-apptainer
# shellcheck source=scripts/lib.sh
. "$(dirname "$0")/lib.sh"

# ---- fast path -------------------------------------------------------------------------------
wrapper_current() {
    # a wrapper of ours from an older install is rewritten (the steps with a stamp are kept)
    ! grep -q 'rollserve apptainer wrapper' "$1" 2>/dev/null \
        || grep -qF "wrapper revision: $WRAPPER_REVISION)" "$1"
}
if [[ ${ROLLSERVE_FORCE_INSTALL:-0} != 1 ]]; then
    for cmd in apptainer singularity; do
        wrapper_current "$(command -v "$cmd" 2>/dev/null)" || continue
        if command -v "$cmd" >/dev/null 2>&1 \
            && ver=$(timeout 30 "$cmd" --version 2>/dev/null) && [[ -n $ver ]]; then
            log "already working: $(command -v "$cmd") ($ver)"
            exit 0
        fi
    done
fi

# ---- slow path: install ----------------------------------------------------------------------
[[ $(id -u) == 0 ]] || die "apptainer is not working and installing it needs root (debootstrap); rerun as root"
T0=$SECONDS


need() { command -v "$1" >/dev/null 2>&1; }
if ! need debootstrap; then
    log "installing debootstrap on the host (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap >/dev/null \
        || die "could not install debootstrap"
fi
for t in unshare pivot_root mount chroot; do need "$t" || die "missing host tool: $t (util-linux/coreutils)"; done

mkdir -p "$PREFIX"
exec 9>"$PREFIX/.install-apptainer.lock"
flock 9   # serialise concurrent installs (e.g. parallel `make test`)

MIRROR=$(detect_mirror)
log "mirror: $MIRROR; sid root: $SIDROOT; wrapper: $BINDIR/apptainer"


# Run a command chrooted into the sid root, inside a throwaway private mount namespace so that no
# mount (/proc, /dev, ...) can outlive it on the host.
in_sid_chroot() {
    # shellcheck disable=SC2016
    unshare --mount --propagation private -- /bin/sh -ec '
        r=$1; shift
        mount --rbind /proc "$r/proc"; mount --rbind /sys "$r/sys"; mount --rbind /dev "$r/dev"
        [ -f /etc/resolv.conf ] && [ ! -L "$r/etc/resolv.conf" ] && touch "$r/etc/resolv.conf" \
            && mount --bind /etc/resolv.conf "$r/etc/resolv.conf"
        exec chroot "$r" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 \
            ${http_proxy:+http_proxy=$http_proxy} ${https_proxy:+https_proxy=$https_proxy} "$@"
    ' in-sid-chroot "$SIDROOT" "$@"
}

# 1. debootstrap the sid root (stamp: .rollserve-debootstrap-ok)
if [[ ! -f $SIDROOT/.rollserve-debootstrap-ok ]]; then
    [[ -e $SIDROOT ]] && { log "removing incomplete $SIDROOT"; safe_rm "$SIDROOT"; }
    log "debootstrap --variant=minbase sid (about a minute)..."
    t=$SECONDS
    # private mount namespace: debootstrap's own /proc, /sys mounts cannot leak if it is killed
    if ! unshare --mount --propagation private -- \
        debootstrap --variant=minbase sid "$SIDROOT" "$MIRROR" >"$PREFIX/debootstrap-sid.log" 2>&1; then
        tail -n 20 "$PREFIX/debootstrap-sid.log" >&2
        die "debootstrap failed (full log: $PREFIX/debootstrap-sid.log)"
    fi
    touch "$SIDROOT/.rollserve-debootstrap-ok"
    log "debootstrap done in $((SECONDS - t)) s"
fi

# 2. apptainer (+ squashfs-tools for `apptainer build`, uidmap for --fakeroot) inside the sid root.
# squashfuse: lets root run SIF images with --userns in ~0.2 s instead of extracting them (~10 s);
# /dev/fuse is root-only here, so ordinary users must then pass --unsquash for SIF images (without
# squashfuse installed apptainer falls back to extraction by itself).
PKGS=(apptainer squashfs-tools uidmap)
[[ ${ROLLSERVE_APPTAINER_SQUASHFUSE:-1} == 0 ]] || PKGS+=(squashfuse)
if [[ ! -f $SIDROOT/.rollserve-apptainer-ok ]]; then
    log "apt-get install ${PKGS[*]} (in the sid root)..."
    t=$SECONDS
    APT=(apt-get -q -o Acquire::Check-Valid-Until=false -o Acquire::Languages=none)
    if ! in_sid_chroot "${APT[@]}" update >"$PREFIX/apt-sid.log" 2>&1 \
        || ! in_sid_chroot "${APT[@]}" install -y --no-install-recommends "${PKGS[@]}" \
            >>"$PREFIX/apt-sid.log" 2>&1; then
        tail -n 20 "$PREFIX/apt-sid.log" >&2
        die "apt-get in the sid root failed (full log: $PREFIX/apt-sid.log)"
    fi
    in_sid_chroot apt-get clean
    [[ -x $SIDROOT/usr/bin/apptainer ]] || die "apptainer binary missing after install"
    touch "$SIDROOT/.rollserve-apptainer-ok"
    log "apptainer installed in $((SECONDS - t)) s"
fi

# 3. root's container capabilities.  With the default `root default capabilities = full`, apptainer
# run by root requests all 41 capabilities, and aborts ("Requesting capability set 0x1ffffffffff
# while permitted capability set is ...") where root lacks some (here: CAP_SYS_RESOURCE).  `--userns`
# avoids that for our own invocations, but not apptainer's internal `apptainer exec` that sandboxes
# unsquashfs (SIF -> temporary sandbox), which passes no flags.  So grant root exactly the
# capabilities it has here (its bounding set), via capability.json.
CONF=$SIDROOT/etc/apptainer/apptainer.conf
caps=$(setpriv -d | sed -n 's/^Capability bounding set: //p' | tr '[:lower:]' '[:upper:]')
[[ -n $caps ]] || die "could not read root's capability bounding set (setpriv -d)"
{
    printf '{\n\t"users": {\n\t\t"root": [\n'
    IFS=, read -r -a arr <<<"$caps"
    for i in "${!arr[@]}"; do
        printf '\t\t\t"CAP_%s"%s\n' "${arr[i]}" "$([[ $i -lt $((${#arr[@]} - 1)) ]] && echo ,)"
    done
    printf '\t\t]\n\t}\n}\n'
} >"$SIDROOT/etc/apptainer/capability.json"
sed -i -E 's/^#?[[:space:]]*root default capabilities[[:space:]]*=.*/root default capabilities = file/' "$CONF"
grep -q '^root default capabilities = file$' "$CONF" || die "could not set 'root default capabilities' in $CONF"

# 4. mount points and the wrapper's fstab.  All binds are made by one `mount -a -T FSTAB`
# (~4 ms; one `mount` process per bind cost ~45 ms).  `nofail`: host paths that do not exist are
# skipped.  Mount points are created here because a rootless wrapper cannot create them.
mapfile -t HOST_BINDS < <(host_binds)
IFS=: read -r -a EXTRA <<<"${ROLLSERVE_APPTAINER_BINDS:-}"
for d in "${HOST_BINDS[@]}" "${EXTRA[@]}" /.oldroot; do
    [[ -n $d ]] || continue
    [[ $d == /* ]] || die "ROLLSERVE_APPTAINER_BINDS entries must be absolute: $d"
    [[ -L $SIDROOT$d ]] && die "$SIDROOT$d is a symlink; cannot use it as a bind target"
    mkdir -p "$SIDROOT$d"
done
ETC_FILES="passwd group subuid subgid hosts resolv.conf"
for f in $ETC_FILES; do
    [[ -L $SIDROOT/etc/$f ]] || touch "$SIDROOT/etc/$f"
done
fstab_escape() { local x=${1// /\\040}; printf '%s' "${x//$'\t'/\\011}"; }
FSTAB=$PREFIX/apptainer-wrapper.fstab
{
    echo "# Binds made by $BINDIR/apptainer (written by scripts/install-apptainer.sh), in order."
    r=$(fstab_escape "$SIDROOT")
    echo "$r $r none bind 0 0"    # pivot_root needs the new root to be a mount point
    for d in "${HOST_BINDS[@]}"; do echo "$(fstab_escape "$d") $r$(fstab_escape "$d") none rbind,nofail 0 0"; done
    for d in /proc /sys /dev; do echo "$d $r$d none rbind 0 0"; done
    for f in $ETC_FILES; do
        [[ -L $SIDROOT/etc/$f ]] || echo "/etc/$f $r/etc/$f none bind,nofail 0 0"
    done
} >"$FSTAB.tmp"
chmod 644 "$FSTAB.tmp"
mv -f "$FSTAB.tmp" "$FSTAB"

# 5. the wrapper
tmp=$(mktemp "$BINDIR/.apptainer.XXXXXX")
cat >"$tmp" <<'WRAPPER'
#!/bin/sh
# rollserve apptainer wrapper (written by scripts/install-apptainer.sh; wrapper revision: @REVISION@)
# Runs Debian sid's
# apptainer (it needs glibc >= 2.38) from the sid root below, with arguments, environment, stdio,
# cwd and exit status passed through.  Every step exec()s (sh -> unshare -> sh -> [setpriv ->]
# apptainer -> starter), so the PID the caller spawned ends up being apptainer's starter itself.
#
# How: `unshare --mount --propagation private` (a new mount namespace: nothing reaches the host's
# mount table, and it all vanishes with the last process in it); `mount -a -T FSTAB` binds the sid
# root on itself (pivot_root needs a mount point) and the host paths below into it at the SAME
# path; pivot_root into it; lazily unmount the old root; cd to the caller's cwd; exec apptainer.
#   Bound recursively, when present on the host: every top-level directory but the system's own
#   (@SYSTEM_DIRS@), /var/tmp, /proc /sys /dev; the host's
#   /etc/{passwd,group,subuid,subgid,hosts,resolv.conf}; and $ROLLSERVE_APPTAINER_BINDS
#   (colon-separated absolute dirs).  Mount points missing from the sid root (a top-level directory
#   made after the install) are made here when running as root; an ordinary user cannot make them.
#   Everything else (/usr, /etc, /var/lib/apptainer, ...) is the sid root's own.
# Rootless: an ordinary user cannot make a mount namespace alone, so it also gets a user namespace
# mapping its uid/gid to themselves (`--user --map-current-user --keep-caps`); the capabilities that
# namespace grants are dropped (setpriv) before apptainer runs, so apptainer sees the same
# unprivileged user as outside (and uses its own rootless user-namespace mode).
ROOT=@SIDROOT@
FSTAB=@FSTAB@
if [ ! -x "$ROOT/usr/bin/apptainer" ] || [ ! -r "$FSTAB" ]; then
    echo "apptainer wrapper: $ROOT/usr/bin/apptainer or $FSTAB missing; run scripts/install-apptainer.sh" >&2
    exit 127
fi
if [ "$(id -u)" = 0 ]; then
    ns="--mount --propagation private"; drop=""
else
    ns="--user --map-current-user --keep-caps --mount --propagation private"
    drop="/usr/bin/setpriv --inh-caps=-all --ambient-caps=-all --"
fi
# shellcheck disable=SC2086,SC2016
exec unshare $ns -- /bin/sh -c '
r=$1; fstab=$2; drop=$3; system=$4; shift 4
cwd=$PWD
fail() { echo "apptainer wrapper: $*" >&2; exit 126; }
/bin/mount -a -T "$fstab" || fail "binding host paths into $r failed (see $fstab)"
for d in /*; do
    [ -d "$d" ] && [ ! -L "$d" ] || continue
    case " $system " in *" ${d#/} "*) continue ;; esac
    [ "$d" -ef "$r$d" ] && continue   # bound by the fstab
    [ -d "$r$d" ] || mkdir "$r$d" 2>/dev/null || continue
    [ -L "$r$d" ] || /bin/mount --rbind "$d" "$r$d" || fail "cannot bind $d"
done
if [ -n "${ROLLSERVE_APPTAINER_BINDS:-}" ]; then
    IFS=:
    for d in $ROLLSERVE_APPTAINER_BINDS; do
        case $d in /*) [ -d "$d" ] || continue ;; *) continue ;; esac
        [ -d "$r$d" ] || mkdir -p "$r$d" 2>/dev/null \
            || { echo "apptainer wrapper: warning: no mount point $r$d; $d not reachable" >&2; continue; }
        /bin/mount --rbind "$d" "$r$d" || fail "cannot bind $d"
    done
    unset IFS
fi
cd "$r" && /sbin/pivot_root . .oldroot || fail "pivot_root into $r failed"
/usr/bin/umount -l /.oldroot || fail "cannot detach the old root"
cd "$cwd" 2>/dev/null || { echo "apptainer wrapper: warning: $cwd is not reachable inside the sid root; running in /" >&2; cd /; }
exec $drop /usr/bin/apptainer "$@"
' rollserve-apptainer "$ROOT" "$FSTAB" "$drop" '@SYSTEM_DIRS@' "$@"
WRAPPER
sed -i -e "s|@SIDROOT@|'$SIDROOT'|" -e "s|@FSTAB@|'$FSTAB'|" -e "s|@REVISION@|$WRAPPER_REVISION|" \
    -e "s|@SYSTEM_DIRS@|$SYSTEM_DIRS|" "$tmp"
chmod 755 "$tmp"
mv -f "$tmp" "$BINDIR/apptainer"
if [[ ! -e $BINDIR/singularity || -L $BINDIR/singularity ]]; then
    ln -sfn apptainer "$BINDIR/singularity"
fi

# 6. check
ver=$("$BINDIR/apptainer" --version) || die "the installed wrapper $BINDIR/apptainer does not run"
log "installed: $BINDIR/apptainer ($ver) in $((SECONDS - T0)) s"
