# Shared by the install scripts: sourced, never run. Callers set LOG_NAME first.

log() { printf '%s: %s\n' "$LOG_NAME" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The Debian mirror the host already uses (one-line .list and deb822 .sources formats).
detect_mirror() {
    if [[ -n ${ROLLSERVE_APT_MIRROR:-} ]]; then echo "${ROLLSERVE_APT_MIRROR%/}"; return; fi
    local files=() f uri
    [[ -f /etc/apt/sources.list ]] && files+=(/etc/apt/sources.list)
    for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -f $f ]] && files+=("$f")
    done
    ((${#files[@]})) || { echo http://deb.debian.org/debian; return; }
    while read -r uri; do
        uri=${uri%/}
        # the main archive: .../debian (not debian-security, not third-party repositories)
        if [[ $uri =~ ^(https?|file):// && $uri == */debian ]]; then echo "$uri"; return; fi
    done < <(awk '
        /^[[:space:]]*#/ { next }
        /^[[:space:]]*deb[[:space:]]/ {          # one-line: deb [opts] URI suite comps
            sub(/^[[:space:]]*deb[[:space:]]+/, ""); sub(/^\[[^]]*\][[:space:]]*/, "")
            print $1; next }
        /^URIs:/ { for (i = 2; i <= NF; i++) print $i }' "${files[@]}")
    log "no Debian mirror found in the host apt sources; using http://deb.debian.org/debian"
    echo http://deb.debian.org/debian
}

# Refuse to delete a directory that still has something mounted below it.
safe_rm() {
    if awk -v d="$1" '$5 == d || index($5, d "/") == 1 { found = 1 } END { exit !found }' /proc/self/mountinfo; then
        die "$1 has mounts below it (see /proc/self/mountinfo); unmount them, then rerun"
    fi
    rm -rf --one-file-system "$1"
}
