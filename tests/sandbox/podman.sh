#!/usr/bin/env bash
# The sandboxed Podman (docs/podman.md): Debian 12's podman 4.3 as `podman system service` on a private socket, with
# its own storage (graph root under /var/lib, run root under /run), containers.conf, tmp dir and file locks, never
# the system's /var/lib/containers; containers get no network of their own (netns "none", as the Docker sandbox
# runs --bridge=none), and the ulimits that start on these machines (default_ulimits; podman 4.3's compat API
# ignores them, hostagent passes them: docs/podman.md).
#
# Podman 4.3 reads CDI specs from /etc/cdi and /var/run/cdi only (no cdi_spec_dirs, no --cdi-spec-dir before 4.6).
# The service therefore runs in a mount namespace of its own where /etc is an overlay of the host's /etc whose cdi/
# is the sandbox's folder: the fake `nvidia-ctk cdi generate` writes the spec there, and nothing is written to the
# host's /etc/cdi. `podman.sh exec CMD...` runs a command in that namespace (a host whose /etc/cdi has the spec).
#
# GPUPIN_PODMAN=5: Debian 13's podman 5.4 instead, a sandbox of its own beside 4.3's (the instance is
# /run/gpupin-sandbox-NAME-podman-5). It needs glibc 2.38 (Debian 12 has 2.36), so it runs from a Debian 13 root file
# system (debootstrap trixie, cached as a tar like the base image's, unpacked under build/podman5/root), chrooted in
# the same mount namespace as 4.3's: a chroot, not systemd-nspawn, keeps one pid namespace and the host's paths, so
# the pids podman reports are the host's (NVML's) and the OCI spec podman names is the host's file. The paths the
# service and its containers share with the host are bind-mounted at the same place inside (this checkout, whose
# build/fakegpu the CDI spec names; the sandbox's run folder and storage; the hook interpreter's prefix), and the
# root's /etc/cdi is the sandbox's folder, as /etc/cdi is in the namespace. Its CLI (`podman.sh podman`, the
# GPUPIN_SANDBOX_PODMAN of `env`) is the root's podman 5 run on the host by the root's own dynamic loader.
#
#   podman.sh up       start it (installing podman if missing; podman 5: its root file system), load
#                      gpupin-base:bookworm from the debootstrap root file system once, print DOCKER_HOST=unix://...
#   podman.sh down     remove its containers, stop it, unmount and remove its runtime state (the images stay)
#   podman.sh purge    down, then remove its storage too
#   podman.sh status   say whether it runs, and with which topology
#   podman.sh env      DOCKER_HOST, GPUPIN_SANDBOX_RUN, GPUPIN_SANDBOX_PODMAN (a podman --remote command line)
#   podman.sh podman ARGS...   the podman CLI against the service (--remote: the service resolves CDI names)
#   podman.sh exec CMD...      CMD in the service's mount namespace
#                              (podman 5: outside its chroot, the host as the service serves it)
#
# Another user's rootless podman (docs/podman.md, "Rootless"), beside the service and independent of it:
#   podman.sh rootless UID up      podman 4.3 rootless as the bare uid UID (no account, no /etc/subuid: one uid
#                                  mapped, storage that ignores chowns on the kernel's own overlay), its HOME,
#                                  storage and configuration under /var/lib and /run/gpupin-sandbox-NAME-podman-
#                                  rootless-UID, its XDG_RUNTIME_DIR /run/gpupin-xdg-NAME-UID; imports
#                                  gpupin-base:bookworm once
#   podman.sh rootless UID podman ARGS...   podman as UID (what that user types), in a mount namespace where /etc/cdi
#                                  is the sandbox's and /dev has the fake card nodes (rootless runc cannot make a
#                                  device node: it bind-mounts the host's, and the simulated host has none)
#   podman.sh rootless UID down    remove its containers, stop its pause process (as UID), remove its runtime state
#   podman.sh rootless UID purge   down, then remove its storage too
#   podman.sh rootless UID env     GPUPIN_SANDBOX_ROOTLESS_RUN (its runtime folder: the CDI spec, the hook's log)
#
# Environment: FAKEGPU_TOPOLOGY (default: mixed-4), GPUPIN_SANDBOX_NAME (as sandbox.sh: the instance of NAME is
# /run/gpupin-sandbox-NAME-podman), GPUPIN_PODMAN (4.3, the default, or 5), GPUPIN_CACHE, DEBOOTSTRAP_MIRROR (the
# root file systems, as sandbox.sh).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=podman-sandbox
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
NAME=${GPUPIN_SANDBOX_NAME:-}
case "$NAME" in *[!a-z0-9-]*) die "GPUPIN_SANDBOX_NAME=$NAME: use a-z, 0-9 and -" ;; esac
VERSION=${GPUPIN_PODMAN:-4.3}
case "$VERSION" in
    4.3) SUFFIX=${NAME:+-$NAME}-podman ;;
    5) SUFFIX=${NAME:+-$NAME}-podman-5 ;;
    *) die "GPUPIN_PODMAN=$VERSION: the sandbox runs podman 4.3 (Debian 12's) or 5 (Debian 13's)" ;;
esac
STATE=/var/lib/gpupin-sandbox$SUFFIX
RUN=/run/gpupin-sandbox$SUFFIX
SOCK=$RUN/podman.sock
PID_FILE=$RUN/service.pid
BASE_IMAGE=gpupin-base:bookworm
TOPOLOGY=$(realpath "${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}")
FAKEGPU_BIN=$REPO/build/fakegpu/bin
CDI_DIR=$RUN/cdi
PODMAN=/usr/bin/podman
# Podman 5's root file system (the service is chrooted there) and its remote CLI run on the host through the
# root's loader and libraries (one exec, as cheap as 4.3's CLI: the benchmark's floor runs it).
ROOT=$REPO/build/podman5/root
ROOT_TAR=$CACHE/rootfs-trixie-minbase-podman-catatonit.tar
ROOT_PACKAGES=podman,runc,netavark,python3,catatonit  # catatonit: podman's --init
CLI=("$PODMAN")
[ "$VERSION" = 5 ] && CLI=("$ROOT/lib64/ld-linux-x86-64.so.2" --library-path \
    "$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/lib/x86_64-linux-gnu" "$ROOT$PODMAN")
# What podman itself reads: the sandbox's configuration, never the system's storage.
PODMAN_ENV=(env "CONTAINERS_CONF=$RUN/containers.conf" "CONTAINERS_STORAGE_CONF=$RUN/storage.conf")

print_env() {
    echo "DOCKER_HOST=unix://$SOCK"
    echo "GPUPIN_SANDBOX_RUN=$RUN"
    echo "GPUPIN_SANDBOX_PODMAN=${CLI[*]} --remote --url unix://$SOCK"
}
case "${1:-}" in
    env) print_env; exit 0 ;;
    podman) shift; exec "${CLI[@]}" --remote --url "unix://$SOCK" "$@" ;;
esac

[ "$(id -u)" = 0 ] || die "the sandboxed podman service runs rootful: it needs root"

alive_service() { alive "$PID_FILE" && [ -S "$SOCK" ]; }
pm() { "${CLI[@]}" --remote --url "unix://$SOCK" "$@"; }

config_line() {
    printf '%s %s %s %s\n' "$REPO" "$VERSION" "$TOPOLOGY" "$(sha256sum <"$TOPOLOGY" | cut -c1-16)"
}

do_down() {
    if alive_service; then
        local ids
        ids=$(pm ps -aq 2>/dev/null || true)
        [ -n "$ids" ] && pm rm -f $ids >/dev/null 2>&1 || true
    fi
    stop_pid "$PID_FILE" "podman system service"
    # conmon of containers that outlived a killed service: they name this sandbox's run root
    pgrep -f -- "conmon .*$RUN/" | xargs -r kill -KILL 2>/dev/null || true
    unmount_under "$RUN" "$STATE"
    rm -rf "$RUN"
}

write_config() {
    mkdir -p "$RUN/tmp" "$STATE/storage" "$STATE/networks" "$CDI_DIR"
    cat >"$RUN/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$STATE/storage"
runroot = "$RUN/storage"
EOF
    # default_ulimits: the kernel's limits here are below podman's defaults (it would fail every start with
    # "error setting rlimit type 7"); netns none: no bridge, no iptables (as the Docker sandbox).
    cat >"$RUN/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$RUN/events.log"
lock_type = "file"
runtime = "runc"
tmp_dir = "$RUN/tmp"
volume_path = "$STATE/volumes"
[network]
network_config_dir = "$STATE/networks"
EOF
}

prepare_root() {
    # Podman 5's root file system: the cached debootstrap of trixie, unpacked into this checkout once.
    local stamp=$ROOT/.gpupin-unpacked
    [ "$(cat "$stamp" 2>/dev/null)" = "$(basename "$ROOT_TAR")" ] && [ -x "$ROOT$PODMAN" ] && return 0
    debootstrap_tar trixie "$ROOT_PACKAGES" "$ROOT_TAR"
    mkdir -p "$(dirname "$ROOT")"
    exec 7>"$(dirname "$ROOT")/.lock"
    flock 7
    if ! { [ "$(cat "$stamp" 2>/dev/null)" = "$(basename "$ROOT_TAR")" ] && [ -x "$ROOT$PODMAN" ]; }; then
        rm -rf "$ROOT.tmp" "$ROOT" && mkdir -p "$ROOT.tmp"
        tar -C "$ROOT.tmp" --numeric-owner -xf "$ROOT_TAR" && mv "$ROOT.tmp" "$ROOT"
        basename "$ROOT_TAR" >"$stamp"
    fi
    exec 7>&-
    local got
    got=$("${CLI[@]}" --version) || die "podman 5 of $ROOT does not run on this host"
    case "$got" in "podman version 5."*) ;; *) die "$ROOT holds $got, not podman 5. HINT: rm -rf $ROOT $ROOT_TAR \
and run again (trixie's podman is 5.4)" ;; esac
}

chroot_mounts() {
    # The shell commands that put podman 5's root in place inside the namespace, then chroot there: the kernel's
    # file systems, and the host paths the service, the CDI spec and its hook name, at the same place.
    local interp prefix paths=("$REPO" "$RUN" "$STATE")
    interp=$(head -1 "$(readlink -f "$FAKEGPU_BIN/nvidia-cdi-hook")") interp=${interp#\#!}
    prefix=$(dirname "$(dirname "$interp")")
    case "$prefix" in /usr | /) ;; *) paths+=("$prefix") ;; esac
    # The root a mount of its own: containers/storage remounts / private when it unpacks a layer (EINVAL on a
    # folder that is no mount point).
    printf 'mount --bind %s %s && ' "$ROOT" "$ROOT"
    printf 'mount --rbind /dev %s/dev && mount --rbind /sys %s/sys && ' "$ROOT" "$ROOT"
    printf 'mount -t proc proc %s/proc && ' "$ROOT"
    # The host's /tmp, as Docker's daemon sees it: bind sources and files the tests name there.
    printf 'mount -t tmpfs gpupin-podman5-run %s/run && mount --bind /tmp %s/tmp && ' "$ROOT" "$ROOT"
    local path
    for path in "${paths[@]}"; do
        printf 'mkdir -p %s%s && mount --bind %s %s%s && ' "$ROOT" "$path" "$path" "$ROOT" "$path"
    done
    # Its /etc/cdi is the sandbox's folder, as in the namespace: 5.4.2 left a spec in containers.conf's
    # cdi_spec_dirs unread (measured: "unresolvable CDI devices").
    printf 'mkdir -p %s/etc/cdi && mount --bind %s %s/etc/cdi && ' "$ROOT" "$CDI_DIR" "$ROOT"
    printf 'cd / && exec chroot %s "$@"' "$ROOT"
}

write_cdi_spec() {
    # What `nvidia-ctk cdi generate --output /etc/cdi/nvidia.yaml` writes on a real host, for this topology.
    FAKEGPU_TOPOLOGY=$TOPOLOGY FAKEGPU_HOOK_LOG=$RUN/hook.log "$FAKEGPU_BIN/nvidia-ctk" cdi generate \
        --output "$CDI_DIR/nvidia.yaml" || die "the fake nvidia-ctk could not write the CDI spec for $TOPOLOGY"
}

start_service() {
    write_config
    write_cdi_spec
    # The mount namespace: /etc an overlay (upper on a tmpfs of the sandbox) whose cdi/ is the sandbox's folder.
    local inner
    inner="mount -t tmpfs gpupin-podman-etc $RUN/etc-overlay && mkdir -p $RUN/etc-overlay/upper/cdi $RUN/etc-overlay/work && \
mount -t overlay gpupin-podman-etc -o lowerdir=/etc,upperdir=$RUN/etc-overlay/upper,workdir=$RUN/etc-overlay/work /etc && \
mount --bind $CDI_DIR /etc/cdi && "
    if [ "$VERSION" = 5 ]; then inner+=$(chroot_mounts); else inner+='exec "$@"'; fi
    mkdir -p "$RUN/etc-overlay"
    setsid env -i "PATH=$FAKEGPU_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "HOME=/root" \
        "FAKEGPU_TOPOLOGY=$TOPOLOGY" "FAKEGPU_HOOK_LOG=$RUN/hook.log" "${PODMAN_ENV[@]:1}" \
        PODMAN_IGNORE_CGROUPSV1_WARNING=1 \
        unshare --mount --propagation private sh -c "$inner" sh \
        "$PODMAN" system service --time=0 "unix://$SOCK" >"$RUN/service.log" 2>&1 </dev/null 9>&- &
    echo $! >"$PID_FILE"
    wait_for pm version || die "podman system service did not answer on $SOCK; see $RUN/service.log"
    config_line >"$RUN/config"
}

load_base_image() {
    pm image exists "$BASE_IMAGE" && return 0
    build_rootfs
    pm import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$ROOTFS_TAR" "$BASE_IMAGE" >/dev/null
}

do_up() {
    # catatonit: podman's --init (a recommends of Debian's podman, which ensure_packages leaves out);
    # podman-compose: the compose tests on podman (tests/docker/test_podman_compose.py), on the host for both.
    if [ "$VERSION" = 5 ]; then ensure_packages debootstrap podman-compose; prepare_root
    else ensure_packages podman:/usr/bin/podman catatonit:/usr/libexec/podman/catatonit podman-compose debootstrap; fi
    [ -x "$FAKEGPU_BIN/nvidia-ctk" ] || die "$FAKEGPU_BIN lacks the fake nvidia-ctk: run 'make fakegpu' first"
    [ -f "$TOPOLOGY" ] || die "no topology file $TOPOLOGY"
    exec 9>"/run/gpupin-sandbox$SUFFIX.lock"
    flock 9
    if alive_service && pm version >/dev/null 2>&1; then
        if [ "$(cat "$RUN/config" 2>/dev/null)" = "$(config_line)" ]; then
            write_cdi_spec
            load_base_image
            echo "DOCKER_HOST=unix://$SOCK"
            return 0
        fi
        say "restarting: it runs with another topology or checkout ($(cat "$RUN/config" 2>/dev/null))"
    elif [ -e "$PID_FILE" ] || [ -d "$RUN" ]; then
        say "cleaning up a stale sandbox left by a killed run"
    fi
    do_down
    start_service
    load_base_image
    say "up: $("${CLI[@]}" --version), topology $TOPOLOGY"
    echo "DOCKER_HOST=unix://$SOCK"
}

# --- another user's rootless podman --------------------------------------------------------------------------------

rootless_paths() {
    RL_UID=$1
    case "$RL_UID" in '' | *[!0-9]* | 0) die "rootless UID: a uid other than 0, in digits (got '$RL_UID')" ;; esac
    RL_RUN=$RUN-rootless-$RL_UID
    RL_STATE=$STATE-rootless-$RL_UID
    # Short: podman 4.3 refuses a run root ($XDG_RUNTIME_DIR/containers when rootless) of more than 50 characters,
    # in the cleanup it runs when a container exits; podman run then waits 20 s for an exit code never recorded.
    RL_XDG=/run/gpupin-xdg${NAME:+-$NAME}-$RL_UID
    [ ${#RL_XDG} -le 39 ] ||
        die "$RL_XDG: podman needs its XDG_RUNTIME_DIR within 39 characters (use a shorter GPUPIN_SANDBOX_NAME)"
}

# What the user's podman sees: /etc/cdi the sandbox's spec, /dev the spec's nodes (an overlay whose submounts are
# bound back). Run by root in a mount namespace of its own, then as the user ("$@").
ROOTLESS_NS='set -e; ov=$RL_RUN/ns
mount -t tmpfs gpupin-rootless "$ov"; mkdir -p "$ov/etc/u" "$ov/etc/w" "$ov/dev/u" "$ov/dev/w" "$ov/old"
mount -t overlay gpupin-rootless -o "lowerdir=/etc,upperdir=$ov/etc/u,workdir=$ov/etc/w" /etc
mkdir -p /etc/cdi; mount --bind "$RL_RUN/cdi" /etc/cdi; mount --rbind /dev "$ov/old"
while read -r node major minor; do mknod -m 666 "$ov/dev/u/${node#/dev/}" c "$major" "$minor"; done <"$RL_RUN/nodes"
mount -t overlay gpupin-rootless -o "lowerdir=/dev,upperdir=$ov/dev/u,workdir=$ov/dev/w" /dev
for sub in pts shm mqueue hugepages; do [ ! -d "$ov/old/$sub" ] || mount --rbind "$ov/old/$sub" "/dev/$sub"; done
exec "$@"'

# The user's podman, with only what a login gives them (HOME, XDG_RUNTIME_DIR), started in their home (the checkout
# may be where they cannot go: root's 0700 home); its pause process keeps the mount namespace of the first call.
rootless_podman() {
    (cd "$RL_STATE/home" && RL_RUN=$RL_RUN unshare --mount --propagation private sh -c "$ROOTLESS_NS" sh \
        setpriv --reuid="$RL_UID" --regid="$RL_UID" --clear-groups \
        env -i "PATH=/usr/local/bin:/usr/bin:/bin" "HOME=$RL_STATE/home" "XDG_RUNTIME_DIR=$RL_XDG" \
        "CONTAINERS_CONF=$RL_RUN/containers.conf" "CONTAINERS_STORAGE_CONF=$RL_RUN/storage.conf" "$PODMAN" "$@")
}

rootless_config() {
    # overlay: the kernel's own in a user namespace (5.11+), which podman 4.3 uses without fuse-overlayfs (whose
    # /dev/fuse is root's here); vfs would copy every layer of every image.
    cat >"$RL_RUN/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$RL_STATE/storage"
runroot = "$RL_XDG/storage"
rootless_storage_path = "$RL_STATE/storage"
[storage.options]
ignore_chown_errors = "true"
EOF
    # As the service's (above), with the user's own folders.
    cat >"$RL_RUN/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
netns = "none"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
tmp_dir = "$RL_XDG/tmp"
EOF
    chmod 0644 "$RL_RUN/storage.conf" "$RL_RUN/containers.conf"
}

rootless_up() {
    ensure_packages podman:/usr/bin/podman uidmap:/usr/bin/newuidmap debootstrap
    [ -f "$TOPOLOGY" ] || die "no topology file $TOPOLOGY"
    [ -d "$RL_RUN" ] && rootless_down
    mkdir -p "$RL_RUN/ns" "$RL_RUN/cdi" "$RL_XDG" "$RL_STATE/home" "$RL_STATE/storage"
    chown "$RL_UID:$RL_UID" "$RL_XDG" "$RL_STATE/home" "$RL_STATE/storage"
    chmod 0700 "$RL_XDG"
    # Its hooks run as the user: a copy of the fakes whose scripts start the system's python3 (root's may be private).
    make -s -C "$REPO/tests/fakegpu" OUT="$RL_RUN/fakegpu" PYTHON=/usr/bin/python3 >/dev/null
    install -m 0666 /dev/null "$RL_RUN/hook.log"
    # And of the topology, which the spec's hooks read as the user (the checkout may be where they cannot go).
    install -m 0644 "$TOPOLOGY" "$RL_RUN/topology.json"
    FAKEGPU_TOPOLOGY=$RL_RUN/topology.json FAKEGPU_HOOK_LOG=$RL_RUN/hook.log "$RL_RUN/fakegpu/bin/nvidia-ctk" cdi generate \
        --output "$RL_RUN/cdi/nvidia.yaml" || die "the fake nvidia-ctk could not write the CDI spec for $TOPOLOGY"
    chmod 0644 "$RL_RUN/cdi/nvidia.yaml"
    awk '/- path: "\/dev\//{gsub(/"/, "", $3); p=$3} /major:/{m=$2} /minor:/{print p, m, $2}' \
        "$RL_RUN/cdi/nvidia.yaml" | sort -u >"$RL_RUN/nodes"
    rootless_config
    if ! rootless_podman image exists "localhost/$BASE_IMAGE" 2>/dev/null; then
        build_rootfs
        rootless_podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$ROOTFS_TAR" \
            "localhost/$BASE_IMAGE" >/dev/null 2>"$RL_RUN/import.log" ||
            die "uid $RL_UID's podman could not import $ROOTFS_TAR: see $RL_RUN/import.log"
    fi
    say "rootless podman of uid $RL_UID up ($("$PODMAN" --version)), CDI spec $RL_RUN/cdi/nvidia.yaml"
}

rootless_down() {
    if [ -f "$RL_RUN/containers.conf" ]; then
        rootless_podman rm -af -t 0 >/dev/null 2>&1 || true
        # Its pause process, named by a file the user can write: signalled as the user, never as root.
        (cd / && setpriv --reuid="$RL_UID" --regid="$RL_UID" --clear-groups \
            sh -c 'kill "$(cat "$1")"' sh "$RL_XDG/tmp/pause.pid") 2>/dev/null || true
    fi
    rm -rf "$RL_RUN" "$RL_XDG"
}

do_rootless() {
    rootless_paths "${1:-}"
    local verb=${2:-}
    shift 2 || true
    exec 9>"$RL_RUN.lock"
    case "$verb" in
        up) flock 9; rootless_up ;;
        down) flock 9; rootless_down; say "rootless podman of uid $RL_UID down" ;;
        purge) flock 9; rootless_down; rm -rf "$RL_STATE"; say "purged $RL_STATE" ;;
        env) echo "GPUPIN_SANDBOX_ROOTLESS_RUN=$RL_RUN" ;;
        podman)
            [ -f "$RL_RUN/containers.conf" ] ||
                die "uid $RL_UID's rootless podman is not up (podman.sh rootless $RL_UID up)"
            rootless_podman "$@" ;;
        *) die "usage: $0 rootless UID up|down|purge|env|podman ARGS..." ;;
    esac
}

case "${1:-}" in
    up) do_up ;;
    rootless) shift; do_rootless "$@" ;;
    down) do_down; say "down" ;;
    purge) do_down; rm -rf "$STATE"; say "purged $STATE" ;;
    exec)
        shift
        alive "$PID_FILE" || die "not running (podman.sh up starts it)"
        exec nsenter --mount="/proc/$(cat "$PID_FILE")/ns/mnt" -- "$@" ;;
    status)
        if alive_service; then echo "running: DOCKER_HOST=unix://$SOCK ($(cat "$RUN/config"))"
        else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 up|down|purge|status|env|podman ARGS...|exec CMD...|rootless UID ..." >&2; exit 64 ;;
esac
