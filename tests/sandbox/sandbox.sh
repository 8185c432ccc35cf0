#!/usr/bin/env bash
# The sandboxed Docker daemon (docs/design.md, The simulated host): its own containerd, socket, data root, exec
# root and pid files; no bridge, no iptables; the fake nvidia-container-runtime-hook first on its PATH so that it
# accepts --gpus. It never talks to the system daemon or the system containerd.
#
#   sandbox.sh up       start it (installing docker.io, containerd, debootstrap and docker-compose if missing,
#                       fetching Engine 26 or 28.5 into build/engines/VERSION when that is the engine), build the
#                       base image once, print DOCKER_HOST=unix://... on stdout; restart it when it runs with
#                       another topology
#   sandbox.sh down     remove its containers, stop it, unmount and remove its runtime state (the image cache stays)
#   sandbox.sh purge    down, then remove the image cache and the shared root file system too
#   sandbox.sh status   say whether it runs, and with which topology
#   sandbox.sh install  install or fetch what the engine needs; start nothing
#   sandbox.sh env      print what a client needs (KEY=VALUE lines: DOCKER_HOST, DOCKER_CONFIG for Engines 26/28.5,
#                       GPUPIN_SANDBOX_RUN, GPUPIN_SANDBOX_DOCKER: the engine's own docker CLI)
#   sandbox.sh docker ARGS...   run the engine's docker CLI against the sandbox
#
# Environment: FAKEGPU_TOPOLOGY (default: the mixed-4 scenario); GPUPIN_SANDBOX_ENGINE: 20.10 (default: Debian 12's
# docker.io and containerd 1.6), 26 (Debian 13's Engine 26.1, containerd 1.7 and compose v2, with CDI turned on and
# a CDI spec that the fake `nvidia-ctk cdi generate` writes from the topology) or 28.5 (sid's Engine 28.5,
# containerd 2.1 and compose v2.40, CDI on by default, the same spec); GPUPIN_SANDBOX_NAME (default empty:
# one more sandbox beside the default one, e.g. for a second checkout, at /run/gpupin-sandbox-NAME; Engine 26's
# instance of a name is NAME-26, 28.5's NAME-28.5, so all engines run at once); GPUPIN_SANDBOX_STATE (default
# /var/lib/gpupin-sandbox[-NAME]), GPUPIN_SANDBOX_RUN (default /run/gpupin-sandbox[-NAME]), each + -26 or -28.5
# for those engines; GPUPIN_CACHE (default /var/cache/gpupin: the debootstrap root file system, built once for
# every sandbox); DEBOOTSTRAP_MIRROR (the Debian mirror of the root file system and of Engines 26 and 28.5;
# default: this machine's own, the first main-archive entry of its apt sources).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=sandbox
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
NAME=${GPUPIN_SANDBOX_NAME:-}
case "$NAME" in *[!a-z0-9-]*) echo "sandbox: ERROR: GPUPIN_SANDBOX_NAME=$NAME: use a-z, 0-9 and -" >&2; exit 64 ;; esac
case "$NAME" in 26|*-26) echo "sandbox: ERROR: GPUPIN_SANDBOX_NAME=$NAME ends in 26, which names Engine 26's instances. \
HINT: choose another name; GPUPIN_SANDBOX_ENGINE=26 selects the engine" >&2; exit 64 ;; esac
ENGINE=${GPUPIN_SANDBOX_ENGINE:-20.10}
case "$ENGINE" in
    20.10)
        ENGINE_SUFFIX=
        # The Debian client matches the 20.10 daemon; a newer client elsewhere on PATH would still work, but this
        # one is what the tests and the benchmark compare against.
        DOCKER=/usr/bin/docker
        [ -x "$DOCKER" ] || DOCKER=$(command -v docker || echo /usr/bin/docker)
        DOCKERD=dockerd CONTAINERD=containerd ENGINE_PATH= ;;
    26|28.5)
        ENGINE_SUFFIX=-$ENGINE
        ENGINE_ROOT=$(engine_dir "$ENGINE")/root
        DOCKER=$ENGINE_ROOT/usr/bin/docker DOCKERD=$ENGINE_ROOT/usr/sbin/dockerd
        CONTAINERD=$ENGINE_ROOT/usr/bin/containerd
        # containerd finds its shim, dockerd its containerd tools here; runc stays Debian 12's (/usr/sbin).
        ENGINE_PATH=$ENGINE_ROOT/usr/sbin:$ENGINE_ROOT/usr/bin:
        DOCKER_CONFIG=$(engine_dir "$ENGINE")/docker-config
        export DOCKER_CONFIG ;;
    *) echo "sandbox: ERROR: GPUPIN_SANDBOX_ENGINE=$ENGINE is no engine here. HINT: 20.10 (the default), 26 or 28.5" >&2
       exit 64 ;;
esac
# The engine's suffix comes after an overridden folder too: two engines never share one.
SUFFIX=${NAME:+-$NAME}$ENGINE_SUFFIX
STATE=${GPUPIN_SANDBOX_STATE:-/var/lib/gpupin-sandbox${NAME:+-$NAME}}$ENGINE_SUFFIX
RUN=${GPUPIN_SANDBOX_RUN:-/run/gpupin-sandbox${NAME:+-$NAME}}$ENGINE_SUFFIX
SOCK=$RUN/docker.sock
CTRD_SOCK=$RUN/containerd.sock
DOCKERD_PID=$RUN/dockerd.pid
CTRD_PID=$RUN/containerd.pid
BASE_IMAGE=gpupin-base:bookworm
TOPOLOGY=$(realpath "${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}")
FAKEGPU_BIN=$REPO/build/fakegpu/bin
HOOK=$FAKEGPU_BIN/nvidia-container-runtime-hook
CDI_DIR=$RUN/cdi
# The fake nvidia-container-runtime registered as `nvidia`, as `nvidia-ctk runtime configure` registers the real
# one: `--runtime nvidia` containers (NVIDIA_VISIBLE_DEVICES, --privileged) behave as on a toolkit host.
RUNTIMES="\"runtimes\": {\"nvidia\": {\"path\": \"$FAKEGPU_BIN/nvidia-container-runtime\"}}"

dk() { "$DOCKER" -H "unix://$SOCK" "$@"; }

print_env() {
    echo "DOCKER_HOST=unix://$SOCK"
    if [ "$ENGINE" != 20.10 ]; then echo "DOCKER_CONFIG=$DOCKER_CONFIG"; fi
    echo "GPUPIN_SANDBOX_RUN=$RUN"
    echo "GPUPIN_SANDBOX_DOCKER=$DOCKER"
}
case "${1:-}" in
    env) print_env; exit 0 ;;
    docker) shift; exec "$DOCKER" -H "unix://$SOCK" "$@" ;;
esac

[ "$(id -u)" = 0 ] || die "the sandboxed daemon needs root (as dockerd does)"

config_line() {
    printf '%s %s %s %s\n' "$REPO" "$TOPOLOGY" "$(sha256sum <"$TOPOLOGY" | cut -c1-16)" \
        "$(printf %s "$ENGINE $RUNTIMES" | sha256sum | cut -c1-8)"
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
    if [ "$ENGINE" = 26 ]; then
        printf '{%s, "features": {"cdi": true}, "cdi-spec-dirs": ["%s"]}\n' "$RUNTIMES" "$CDI_DIR" >"$RUN/daemon.json"
        write_cdi_spec
    elif [ "$ENGINE" = 28.5 ]; then
        # CDI is on by default since 28.2: only the spec folder is this sandbox's own (the default is /etc/cdi and
        # /var/run/cdi, the host's).
        printf '{%s, "cdi-spec-dirs": ["%s"]}\n' "$RUNTIMES" "$CDI_DIR" >"$RUN/daemon.json"
        write_cdi_spec
    else
        printf '{%s}\n' "$RUNTIMES" >"$RUN/daemon.json"
    fi
    mkdir -p "$RUN/plugins" && chmod 0700 "$RUN/plugins"
    # Both daemons run in a mount namespace of their own (ns_daemons): there /run/docker/plugins, where dockerd
    # finds its plugins (an authorization plugin's socket), is this sandbox's $RUN/plugins, so each sandbox serves
    # its own `gpupin` plugin and the host's folder is neither read nor written. containerd shares the namespace
    # because runc must see the layers dockerd mounts. setsid and unshare exec: the job's pid becomes dockerd's.
    setsid unshare -m --propagation private -- "$REPO/tests/sandbox/sandbox.sh" _daemons \
        >"$RUN/dockerd.log" 2>&1 </dev/null 9>&- &
    wait_for test -S "$CTRD_SOCK" || die "containerd did not start; see $RUN/containerd.log and $RUN/dockerd.log"
    wait_for dk version || die "dockerd did not answer on $SOCK; see $RUN/dockerd.log"
    config_line >"$RUN/config"
}

ns_daemons() {
    # Inside the sandbox's mount namespace (start_daemons): drop the copies of other daemons' container mounts
    # (they would keep those layers and network namespaces alive here), give /run/docker/plugins this sandbox's
    # folder, start containerd, then become dockerd.
    NS_HOLD=$STATE/ns-hold ns_private_plugins "$RUN/plugins"
    # dockerd's environment is the hook's environment (Docker passes os.Environ() to the prestart hook).
    local envs=(env -i "PATH=$FAKEGPU_BIN:$ENGINE_PATH/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
                "FAKEGPU_TOPOLOGY=$TOPOLOGY" "FAKEGPU_HOOK_LOG=$RUN/hook.log" "HOME=/root")
    # A subshell: containerd is init's child, not dockerd's (no zombie when it dies before dockerd).
    ("${envs[@]}" "$CONTAINERD" --config "$RUN/containerd.toml" >"$RUN/containerd.log" 2>&1 </dev/null &
     echo $! >"$CTRD_PID")
    wait_for test -S "$CTRD_SOCK" || die "containerd did not start; see $RUN/containerd.log"
    exec "${envs[@]}" "$DOCKERD" --config-file "$RUN/daemon.json" --host "unix://$SOCK" \
        --containerd "$CTRD_SOCK" --containerd-namespace "gpupin-sandbox$SUFFIX" \
        --containerd-plugins-namespace "gpupin-sandbox$SUFFIX-plugins" \
        --data-root "$STATE/docker" --exec-root "$RUN/exec" --pidfile "$DOCKERD_PID" \
        --bridge=none --iptables=false --ip-masq=false --userland-proxy=false
}

write_cdi_spec() {
    # What `nvidia-ctk cdi generate --output /etc/cdi/nvidia.yaml` writes on a real host, for this topology; the
    # spec's hooks log to the same file as the runtime hook. dockerd rereads the folder when a spec changes.
    mkdir -p "$CDI_DIR"
    FAKEGPU_TOPOLOGY=$TOPOLOGY FAKEGPU_HOOK_LOG=$RUN/hook.log "$FAKEGPU_BIN/nvidia-ctk" cdi generate \
        --output "$CDI_DIR/nvidia.yaml" || die "the fake nvidia-ctk could not write the CDI spec for $TOPOLOGY"
}

build_base_image() {
    dk image inspect "$BASE_IMAGE" >/dev/null 2>&1 && return 0
    build_rootfs
    dk import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' "$ROOTFS_TAR" "$BASE_IMAGE" >/dev/null
}

do_install() {
    if [ "$ENGINE" != 20.10 ]; then
        ensure_packages runc:/usr/sbin/runc debootstrap
        fetch_engine "$ENGINE"
    else
        ensure_packages docker.io:/usr/sbin/dockerd debootstrap containerd docker-compose
    fi
}

do_up() {
    do_install
    [ -x "$HOOK" ] && [ -x "$FAKEGPU_BIN/nvidia-ctk" ] || die "$FAKEGPU_BIN lacks the fake hook or nvidia-ctk: run 'make fakegpu' first"
    [ -f "$TOPOLOGY" ] || die "no topology file $TOPOLOGY"
    exec 9>"/run/gpupin-sandbox$SUFFIX.lock"
    flock 9
    if alive "$DOCKERD_PID" && dk version >/dev/null 2>&1; then
        if [ "$(cat "$RUN/config" 2>/dev/null)" = "$(config_line)" ]; then
            # A rebuilt nvidia-ctk may write another spec for the same topology.
            if [ "$ENGINE" != 20.10 ]; then write_cdi_spec; fi
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
    say "up: Engine $ENGINE, topology $TOPOLOGY"
    echo "DOCKER_HOST=unix://$SOCK"
}

case "${1:-}" in
    up) do_up ;;
    _daemons) ns_daemons ;;  # start_daemons's, inside the new mount namespace
    down) do_down; say "down" ;;
    install) do_install ;;
    purge) do_down; rm -rf "$STATE" "$CACHE"; say "purged $STATE and $CACHE" ;;
    status)
        if alive "$DOCKERD_PID"; then echo "running: DOCKER_HOST=unix://$SOCK ($(cat "$RUN/config"))"
        else echo "not running"; exit 1; fi ;;
    *) echo "usage: $0 up|down|purge|status|install|env|docker ARGS..." >&2; exit 64 ;;
esac
