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
#   podman.sh up       start it (installing podman if missing), load gpupin-base:bookworm from the debootstrap
#                      root file system once, print DOCKER_HOST=unix://... on stdout
#   podman.sh down     remove its containers, stop it, unmount and remove its runtime state (the images stay)
#   podman.sh purge    down, then remove its storage too
#   podman.sh status   say whether it runs, and with which topology
#   podman.sh env      DOCKER_HOST, GPUPIN_SANDBOX_RUN, GPUPIN_SANDBOX_PODMAN (a podman --remote command line)
#   podman.sh podman ARGS...   the podman CLI against the service (--remote: the service resolves CDI names)
#   podman.sh exec CMD...      CMD in the service's mount namespace
#
# Environment: FAKEGPU_TOPOLOGY (default: mixed-4), GPUPIN_SANDBOX_NAME (as sandbox.sh: the instance of NAME is
# /run/gpupin-sandbox-NAME-podman), GPUPIN_CACHE, DEBOOTSTRAP_MIRROR (the base root file system, as sandbox.sh).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=podman-sandbox
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
NAME=${GPUPIN_SANDBOX_NAME:-}
case "$NAME" in *[!a-z0-9-]*) die "GPUPIN_SANDBOX_NAME=$NAME: use a-z, 0-9 and -" ;; esac
SUFFIX=${NAME:+-$NAME}-podman
STATE=/var/lib/gpupin-sandbox$SUFFIX
RUN=/run/gpupin-sandbox$SUFFIX
SOCK=$RUN/podman.sock
PID_FILE=$RUN/service.pid
BASE_IMAGE=gpupin-base:bookworm
TOPOLOGY=$(realpath "${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}")
FAKEGPU_BIN=$REPO/build/fakegpu/bin
CDI_DIR=$RUN/cdi
PODMAN=/usr/bin/podman
# What podman itself reads: the sandbox's configuration, never the system's storage.
PODMAN_ENV=(env "CONTAINERS_CONF=$RUN/containers.conf" "CONTAINERS_STORAGE_CONF=$RUN/storage.conf")

print_env() {
    echo "DOCKER_HOST=unix://$SOCK"
    echo "GPUPIN_SANDBOX_RUN=$RUN"
    echo "GPUPIN_SANDBOX_PODMAN=$PODMAN --remote --url unix://$SOCK"
}
case "${1:-}" in
    env) print_env; exit 0 ;;
    podman) shift; exec "$PODMAN" --remote --url "unix://$SOCK" "$@" ;;
esac

[ "$(id -u)" = 0 ] || die "the sandboxed podman service runs rootful: it needs root"

alive_service() { alive "$PID_FILE" && [ -S "$SOCK" ]; }
pm() { "$PODMAN" --remote --url "unix://$SOCK" "$@"; }

config_line() {
    printf '%s %s %s\n' "$REPO" "$TOPOLOGY" "$(sha256sum <"$TOPOLOGY" | cut -c1-16)"
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
mount --bind $CDI_DIR /etc/cdi && exec \"\$@\""
    mkdir -p "$RUN/etc-overlay"
    setsid env -i "PATH=$FAKEGPU_BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" "HOME=/root" \
        "FAKEGPU_TOPOLOGY=$TOPOLOGY" "FAKEGPU_HOOK_LOG=$RUN/hook.log" "${PODMAN_ENV[@]:1}" \
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
    # podman-compose: the compose tests on podman (tests/docker/test_podman_compose.py)
    ensure_packages podman:/usr/bin/podman catatonit:/usr/libexec/podman/catatonit podman-compose debootstrap
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
    say "up: $("$PODMAN" --version), topology $TOPOLOGY"
    echo "DOCKER_HOST=unix://$SOCK"
}

case "${1:-}" in
    up) do_up ;;
    down) do_down; say "down" ;;
    purge) do_down; rm -rf "$STATE"; say "purged $STATE" ;;
    exec)
        shift
        alive "$PID_FILE" || die "not running (podman.sh up starts it)"
        exec nsenter --mount="/proc/$(cat "$PID_FILE")/ns/mnt" -- "$@" ;;
    status)
        if alive_service; then echo "running: DOCKER_HOST=unix://$SOCK ($(cat "$RUN/config"))"
        else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 up|down|purge|status|env|podman ARGS...|exec CMD..." >&2; exit 64 ;;
esac
