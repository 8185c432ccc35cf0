# Shell helpers shared by the simulated host's daemons and clusters (sourced, never run): messages, processes
# started and stopped by their pid files, mounts a killed daemon left, Debian packages installed when missing,
# and the debootstrap root file system that every sandboxed daemon imports as its base image.
# The sourcing script sets SAY_AS (the name its messages start with) first.

CACHE=${GPUPIN_CACHE:-/var/cache/gpupin}
ROOTFS_TAR=$CACHE/rootfs-bookworm-minbase-python3.tar
MIRROR=${DEBOOTSTRAP_MIRROR:-http://deb.debian.org/debian}

say() { printf '%s: %s\n' "$SAY_AS" "$*" >&2; }
die() { printf '%s: ERROR: %s\n' "$SAY_AS" "$*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ensure_packages() {
    # Each argument is PACKAGE or PACKAGE:PATH (installed when PATH is not executable, else when the command
    # named PACKAGE is missing).
    local need=() spec pkg path
    for spec in "$@"; do
        pkg=${spec%%:*}; path=${spec#*:}
        if [ "$path" != "$spec" ]; then [ -x "$path" ] || need+=("$pkg")
        else command -v "$pkg" >/dev/null || need+=("$pkg"); fi
    done
    [ ${#need[@]} = 0 ] && return 0
    say "installing ${need[*]}"
    # Keep the packages' init scripts from starting system daemons: those are never ours to touch.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [ "$made_policy" = 1 ] && rm -f "$policy"
    return 0
}

unmount_under() {
    # Mounts a killed daemon left behind (overlay, shm, netns), deepest first.
    local dir
    for dir in "$@"; do
        awk -v d="$dir" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
            umount -l "$m" 2>/dev/null || true
        done
    done
}

stop_pid() {
    local pidfile=$1 name=$2 pid i
    alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then say "$name ($pid) did not stop in 20 s; killing it"; kill -KILL "$pid"; fi
    rm -f "$pidfile"
}

wait_for() {
    local i
    for i in $(seq 1 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    return 1
}

build_rootfs() {
    # One debootstrap for every sandbox and engine on this machine, kept as a tar (the image cache of a daemon
    # cannot be shared); the lock keeps two sandboxes from building it at once.
    [ -s "$ROOTFS_TAR" ] && return 0
    mkdir -p "$CACHE" && chmod 0755 "$CACHE"
    exec 8>"$CACHE/.build.lock"
    flock 8
    [ -s "$ROOTFS_TAR" ] && { exec 8>&-; return 0; }
    say "building the base root file system with debootstrap (bookworm, minbase, python3) from $MIRROR"
    local root=$CACHE/rootfs.tmp
    rm -rf "$root"
    debootstrap --variant=minbase --include=python3,python3-pip,procps bookworm "$root" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed; see $CACHE/debootstrap.log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$ROOTFS_TAR.tmp" . && mv -f "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
    rm -rf "$root"
    exec 8>&-
}
