#!/usr/bin/env bash
# The sandboxed Docker daemon of the simulated GPU host (DESIGN.md): its own containerd, socket, data root, exec
# root and pid files; no bridge, no iptables; the fake nvidia-container-runtime-hook first on its PATH so that it
# accepts --gpus. It never talks to the system daemon or the system containerd.
#
#   sandbox.sh up       start it (installing docker.io, containerd, debootstrap and docker-compose if missing),
#                       build the base image once,
#                       print DOCKER_HOST=unix://... on stdout; restart it when it runs with another topology
#   sandbox.sh down     remove its containers, stop it, unmount and remove its runtime state (the image cache stays)
#   sandbox.sh purge    down, then remove the image cache too
#   sandbox.sh status   say whether it runs, and with which topology
#
# Environment: FAKEGPU_TOPOLOGY (default: the mixed-4 scenario), GPUPIN_SANDBOX_STATE (default
# /var/lib/gpupin-sandbox), GPUPIN_SANDBOX_RUN (default /run/gpupin-sandbox), DEBOOTSTRAP_MIRROR.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STATE=${GPUPIN_SANDBOX_STATE:-/var/lib/gpupin-sandbox}
RUN=${GPUPIN_SANDBOX_RUN:-/run/gpupin-sandbox}
SOCK=$RUN/docker.sock
CTRD_SOCK=$RUN/containerd.sock
DOCKERD_PID=$RUN/dockerd.pid
CTRD_PID=$RUN/containerd.pid
BASE_IMAGE=gpupin-base:bookworm
MIRROR=${DEBOOTSTRAP_MIRROR:-http://deb.debian.org/debian}
TOPOLOGY=$(realpath "${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}")
HOOK=$REPO/build/fakegpu/bin/nvidia-container-runtime-hook
# The Debian client matches the 20.10 daemon; a newer client elsewhere on PATH would still work, but this one
# is what the tests and the benchmark compare against.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker || echo /usr/bin/docker)

say() { printf 'sandbox: %s\n' "$*" >&2; }
die() { printf 'sandbox: ERROR: %s\n' "$*" >&2; exit 1; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
dk() { "$DOCKER" -H "unix://$SOCK" "$@"; }

[ "$(id -u)" = 0 ] || die "the sandboxed daemon needs root (as dockerd does)"

ensure_packages() {
    local need=()
    [ -x /usr/sbin/dockerd ] || need+=(docker.io)
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v containerd >/dev/null || need+=(containerd)
    command -v docker-compose >/dev/null || need+=(docker-compose)  # the compose examples' tests run it
    [ ${#need[@]} = 0 ] && return 0
    say "installing ${need[*]}"
    # Keep the package's init scripts from starting the system daemon: that one is never ours to touch.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    [ "$made_policy" = 1 ] && rm -f "$policy"
    return 0
}

config_line() { printf '%s %s %s\n' "$REPO" "$TOPOLOGY" "$(sha256sum <"$TOPOLOGY" | cut -c1-16)"; }

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

do_down() {
    if alive "$DOCKERD_PID" && [ -S "$SOCK" ]; then
        local ids
        ids=$(dk ps -aq 2>/dev/null || true)
        [ -n "$ids" ] && dk rm -f $ids >/dev/null 2>&1 || true
    fi
    stop_pid "$DOCKERD_PID" dockerd
    stop_pid "$CTRD_PID" containerd
    # containerd shims of containers that outlived a killed daemon
    pgrep -f -- "-address $CTRD_SOCK" | xargs -r kill -KILL 2>/dev/null || true
    unmount_under "$RUN" "$STATE/docker" "$STATE/containerd"
    rm -rf "$RUN"
}

wait_for() {
    local i
    for i in $(seq 1 150); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
    return 1
}

start_daemons() {
    mkdir -p "$RUN" "$STATE/docker" "$STATE/containerd"
    cat >"$RUN/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$CTRD_SOCK"
EOF
    echo '{}' >"$RUN/daemon.json"
    # dockerd's environment is the hook's environment (Docker passes os.Environ() to the prestart hook).
    local envs=(env -i "PATH=$REPO/build/fakegpu/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                "FAKEGPU_TOPOLOGY=$TOPOLOGY" "FAKEGPU_HOOK_LOG=$RUN/hook.log" "HOME=/root")
    setsid "${envs[@]}" containerd --config "$RUN/containerd.toml" >"$RUN/containerd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$CTRD_PID"
    wait_for test -S "$CTRD_SOCK" || die "containerd did not start; see $RUN/containerd.log"
    setsid "${envs[@]}" dockerd --config-file "$RUN/daemon.json" --host "unix://$SOCK" \
        --containerd "$CTRD_SOCK" --containerd-namespace gpupin-sandbox \
        --containerd-plugins-namespace gpupin-sandbox-plugins \
        --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$DOCKERD_PID" \
        --bridge=none --iptables=false --ip-masq=false --userland-proxy=false \
        >"$RUN/dockerd.log" 2>&1 </dev/null 9>&- &
    wait_for dk version || die "dockerd did not answer on $SOCK; see $RUN/dockerd.log"
    config_line >"$RUN/config"
}

build_base_image() {
    dk image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
    say "building $BASE_IMAGE with debootstrap (bookworm, minbase, python3) from $MIRROR"
    local root=$STATE/rootfs.tmp
    rm -rf "$root"
    debootstrap --variant=minbase --include=python3,python3-pip,procps bookworm "$root" "$MIRROR" \
        >"$STATE/debootstrap.log" 2>&1 || die "debootstrap failed; see $STATE/debootstrap.log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | dk import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
    rm -rf "$root"
}

do_up() {
    ensure_packages
    [ -x "$HOOK" ] || die "$HOOK is missing: run 'make fakegpu' first"
    [ -f "$TOPOLOGY" ] || die "no topology file $TOPOLOGY"
    exec 9>"/run/gpupin-sandbox.lock"
    flock 9
    if alive "$DOCKERD_PID" && dk version >/dev/null 2>&1; then
        if [ "$(cat "$RUN/config" 2>/dev/null)" = "$(config_line)" ]; then
            build_base_image
            echo "DOCKER_HOST=unix://$SOCK"
            return 0
        fi
        say "restarting: it runs with another topology or checkout ($(cat "$RUN/config" 2>/dev/null))"
    elif [ -e "$DOCKERD_PID" ] || [ -e "$CTRD_PID" ] || [ -d "$RUN" ]; then
        say "cleaning up a stale sandbox left by a killed run"
    fi
    do_down
    start_daemons
    build_base_image
    say "up: topology $TOPOLOGY"
    echo "DOCKER_HOST=unix://$SOCK"
}

case "${1:-}" in
    up) do_up ;;
    down) do_down; say "down" ;;
    purge) do_down; rm -rf "$STATE"; say "purged $STATE" ;;
    status)
        if alive "$DOCKERD_PID"; then echo "running: DOCKER_HOST=unix://$SOCK ($(cat "$RUN/config"))"
        else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 up|down|purge|status" >&2; exit 64 ;;
esac
