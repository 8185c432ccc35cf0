#!/usr/bin/env bash
# A Docker Engine of the gpu tier's own on a GPU host that has none (a lent machine: no Docker, no registry), from
# unpacked binaries (sid's Engine 28.5 packages: dockerd, containerd and its runc shim, the CLI; runc and its
# libseccomp), with a CDI spec written from NVML (tests/support/realcdi.py: no NVIDIA container toolkit needed).
#
#   tests/gpu/engine.sh up BINDIR     start it (BINDIR/bin: the binaries, BINDIR/lib: runc's libraries); prints
#                                     DOCKER_HOST=... on its last line
#   tests/gpu/engine.sh down          stop it and its containers
#
# Its state is under /var/lib/gpupin-gpu and /run/gpupin-gpu; it has no bridge and touches no iptables (containers
# get the network `none` or the host's). The CDI spec lands in /run/gpupin-gpu/cdi, the daemon's one spec folder.
set -euo pipefail
RUN=/run/gpupin-gpu STATE=/var/lib/gpupin-gpu
SOCK=$RUN/docker.sock CTRD_SOCK=$RUN/containerd.sock
REPO=$(cd "$(dirname "$0")/../.." && pwd)
die() { echo "engine.sh: ERROR: $*" >&2; exit 1; }
wait_for() { for _ in $(seq 300); do "$@" 2>/dev/null && return 0; sleep 0.1; done; return 1; }

up() {
    local bin=${1:?BINDIR}
    bin=$(cd "$bin" && pwd)
    mkdir -p "$RUN/cdi" "$STATE/docker" "$STATE/containerd" "$RUN/bin"
    # runc through a wrapper that finds the libseccomp it was built against (the host may lack it).
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/bin/runc "$@"\n' "$bin" "$bin" >"$RUN/bin/runc"
    chmod 755 "$RUN/bin/runc"
    ln -sfn "$bin/bin/tini" "$RUN/bin/docker-init"
    PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH} python3 -m tests.support.realcdi "$RUN/cdi" >/dev/null
    cat >"$RUN/containerd.toml" <<TOML
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$CTRD_SOCK"
TOML
    # No userland proxy: without a bridge nothing is published, and a host without docker-proxy on its PATH (a lent
    # GPU machine) would refuse to start dockerd with it on.
    printf '{"cdi-spec-dirs": ["%s"], "bridge": "none", "iptables": false, "ip6tables": false, %s}\n' "$RUN/cdi" \
        '"userland-proxy": false' >"$RUN/daemon.json"
    local path="$RUN/bin:$bin/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    setsid env -i PATH="$path" HOME=/root "$bin/bin/containerd" --config "$RUN/containerd.toml" \
        >"$RUN/containerd.log" 2>&1 </dev/null &
    wait_for test -S "$CTRD_SOCK" || { cat "$RUN/containerd.log" >&2; die "containerd did not start"; }
    setsid env -i PATH="$path" HOME=/root "$bin/bin/dockerd" --config-file "$RUN/daemon.json" \
        --host "unix://$SOCK" --containerd "$CTRD_SOCK" --data-root "$STATE/docker" --exec-root "$RUN/exec" \
        --pidfile "$RUN/dockerd.pid" >"$RUN/dockerd.log" 2>&1 </dev/null &
    wait_for "$bin/bin/docker" -H "unix://$SOCK" version >/dev/null || { tail -30 "$RUN/dockerd.log" >&2; die "dockerd did not start"; }
    echo "DOCKER_HOST=unix://$SOCK"
}

down() {
    local pid
    if [ -S "$SOCK" ] && command -v docker >/dev/null; then
        docker -H "unix://$SOCK" ps -aq | xargs -r docker -H "unix://$SOCK" rm -f >/dev/null 2>&1 || true
    fi
    for f in "$RUN/dockerd.pid"; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
    pid=$(pgrep -f -- "--config $RUN/containerd.toml" || true)
    [ -n "$pid" ] && kill $pid 2>/dev/null || true
}

case "${1:-}" in
    up) shift; up "$@" ;;
    down) down ;;
    *) echo "usage: tests/gpu/engine.sh up BINDIR | down" >&2; exit 64 ;;
esac
