#!/usr/bin/env bash
# The sandboxed Docker daemon of the simulated GPU host (DESIGN.md): its own containerd, socket, data root, exec
# root and pid files; no bridge, no iptables; the fake nvidia-container-runtime-hook first on its PATH so that it
# accepts --gpus. It never talks to the system daemon or the system containerd.
#
#   sandbox.sh up       start it (installing docker.io, containerd, debootstrap and docker-compose if missing),
#                       build the base image once,
#                       print DOCKER_HOST=unix://... on stdout; restart it when it runs with another topology
#   sandbox.sh down     remove its containers, stop it, unmount and remove its runtime state (the image cache stays)
#   sandbox.sh purge    down, then remove the image cache and the shared root file system too
#   sandbox.sh status   say whether it runs, and with which topology
#
# Environment: FAKEGPU_TOPOLOGY (default: the mixed-4 scenario); GPUPIN_SANDBOX_NAME (default empty: one more
# sandbox beside the default one, e.g. for a second checkout, at /run/gpupin-sandbox-NAME); GPUPIN_SANDBOX_STATE
# (default /var/lib/gpupin-sandbox[-NAME]), GPUPIN_SANDBOX_RUN (default /run/gpupin-sandbox[-NAME]);
# GPUPIN_CACHE (default /var/cache/gpupin: the debootstrap root file system, built once for every sandbox);
# DEBOOTSTRAP_MIRROR.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=sandbox
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
NAME=${GPUPIN_SANDBOX_NAME:-}
case "$NAME" in *[!a-z0-9-]*) echo "sandbox: ERROR: GPUPIN_SANDBOX_NAME=$NAME: use a-z, 0-9 and -" >&2; exit 64 ;; esac
SUFFIX=${NAME:+-$NAME}
STATE=${GPUPIN_SANDBOX_STATE:-/var/lib/gpupin-sandbox$SUFFIX}
RUN=${GPUPIN_SANDBOX_RUN:-/run/gpupin-sandbox$SUFFIX}
SOCK=$RUN/docker.sock
CTRD_SOCK=$RUN/containerd.sock
DOCKERD_PID=$RUN/dockerd.pid
CTRD_PID=$RUN/containerd.pid
BASE_IMAGE=gpupin-base:bookworm
TOPOLOGY=$(realpath "${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}")
HOOK=$REPO/build/fakegpu/bin/nvidia-container-runtime-hook
# The fake nvidia-container-runtime registered as `nvidia`, as `nvidia-ctk runtime configure` registers the real
# one: `--runtime nvidia` containers (NVIDIA_VISIBLE_DEVICES, --privileged) behave as on a toolkit host.
DAEMON_JSON="{\"runtimes\": {\"nvidia\": {\"path\": \"$REPO/build/fakegpu/bin/nvidia-container-runtime\"}}}"
# The Debian client matches the 20.10 daemon; a newer client elsewhere on PATH would still work, but this one
# is what the tests and the benchmark compare against.
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker || echo /usr/bin/docker)

dk() { "$DOCKER" -H "unix://$SOCK" "$@"; }

[ "$(id -u)" = 0 ] || die "the sandboxed daemon needs root (as dockerd does)"

config_line() {
    printf '%s %s %s %s\n' "$REPO" "$TOPOLOGY" "$(sha256sum <"$TOPOLOGY" | cut -c1-16)" \
        "$(printf %s "$DAEMON_JSON" | sha256sum | cut -c1-8)"
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
    printf '%s\n' "$DAEMON_JSON" >"$RUN/daemon.json"
    # dockerd's environment is the hook's environment (Docker passes os.Environ() to the prestart hook).
    local envs=(env -i "PATH=$REPO/build/fakegpu/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                "FAKEGPU_TOPOLOGY=$TOPOLOGY" "FAKEGPU_HOOK_LOG=$RUN/hook.log" "HOME=/root")
    setsid "${envs[@]}" containerd --config "$RUN/containerd.toml" >"$RUN/containerd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$CTRD_PID"
    wait_for test -S "$CTRD_SOCK" || die "containerd did not start; see $RUN/containerd.log"
    setsid "${envs[@]}" dockerd --config-file "$RUN/daemon.json" --host "unix://$SOCK" \
        --containerd "$CTRD_SOCK" --containerd-namespace "gpupin-sandbox$SUFFIX" \
        --containerd-plugins-namespace "gpupin-sandbox$SUFFIX-plugins" \
        --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$DOCKERD_PID" \
        --bridge=none --iptables=false --ip-masq=false --userland-proxy=false \
        >"$RUN/dockerd.log" 2>&1 </dev/null 9>&- &
    wait_for dk version || die "dockerd did not answer on $SOCK; see $RUN/dockerd.log"
    config_line >"$RUN/config"
}

build_base_image() {
    dk image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
    build_rootfs
    dk import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' "$ROOTFS_TAR" "$BASE_IMAGE" >/dev/null
}

do_up() {
    ensure_packages docker.io:/usr/sbin/dockerd debootstrap containerd docker-compose
    [ -x "$HOOK" ] || die "$HOOK is missing: run 'make fakegpu' first"
    [ -f "$TOPOLOGY" ] || die "no topology file $TOPOLOGY"
    exec 9>"/run/gpupin-sandbox$SUFFIX.lock"
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
    purge) do_down; rm -rf "$STATE" "$CACHE"; say "purged $STATE and $CACHE" ;;
    status)
        if alive "$DOCKERD_PID"; then echo "running: DOCKER_HOST=unix://$SOCK ($(cat "$RUN/config"))"
        else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 up|down|purge|status" >&2; exit 64 ;;
esac
