#!/usr/bin/env bash
# The shipped systemd unit under a real systemd: an image whose PID 1 is Debian 12's systemd, with gpupin's host
# side installed where the unit's ExecStart looks (/usr/local/bin/hostagent) and the unit enabled as its comment
# says to install it (tests/docker/test_systemd_unit.py runs it on the sandbox daemon).
#
#   tests/sandbox/systemd.sh image      build gpupin-systemd:test on the daemon at DOCKER_HOST (the sandbox's), from
#                                       a debootstrap root with systemd (built once per machine under GPUPIN_CACHE)
#                                       and the wheels in build/wheels and build/wheels-systemd (make wheels)
set -euo pipefail
SAY_AS=systemd.sh
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
SYSTEMD_TAR=$CACHE/rootfs-bookworm-systemd.tar
IMAGE=gpupin-systemd:test
DOCKER=${DOCKER:-docker}  # the engine's own CLI (the sandbox's GPUPIN_SANDBOX_DOCKER)
# The host side's needs from Debian's packages, but the docker SDK (bookworm's is 5.0; gpupin wants 6.1 or later).
PACKAGES=python3,python3-pip,procps,systemd,systemd-sysv,dbus,python3-requests,python3-yaml,python3-ruamel.yaml,python3-prometheus-client

image() {
    command -v debootstrap >/dev/null || ensure_packages debootstrap
    debootstrap_tar bookworm "$PACKAGES" "$SYSTEMD_TAR"
    "$DOCKER" image inspect "$IMAGE-base" >/dev/null 2>&1 || "$DOCKER" import - "$IMAGE-base" <"$SYSTEMD_TAR" >/dev/null
    local ctx
    ctx=$(mktemp -d)
    trap "rm -rf '$ctx'" EXIT
    cp "$REPO"/build/wheels/gpupin-*.whl "$REPO"/build/wheels/nvidia_ml_py-*.whl "$ctx/"
    docker_sdk "$ctx"
    cp "$REPO/contrib/systemd/gpupin-hostagent.service" "$ctx/"
    cat >"$ctx/Dockerfile" <<DOCKERFILE
FROM $IMAGE-base
COPY *.whl /tmp/wheels/
RUN PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install -q --no-index --no-deps --no-cache-dir /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels && test -x /usr/local/bin/hostagent
# As the unit's comment installs it: the unit, the group, enabled.
COPY gpupin-hostagent.service /etc/systemd/system/
RUN groupadd --system gpupin && systemctl enable gpupin-hostagent.service \
    && systemctl mask getty.target console-getty.service systemd-logind.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
DOCKERFILE
    "$DOCKER" build -q -t "$IMAGE" "$ctx" >/dev/null
    echo "$IMAGE"
}

docker_sdk() {
    # The docker SDK's wheel (pure Python), downloaded once into the cache.
    local w
    w=$(ls "$CACHE"/docker-7*.whl 2>/dev/null | head -1 || true)
    if [ -z "$w" ]; then
        "$REPO/.venv/bin/python" -m pip download -q --no-deps --only-binary=:all: -d "$CACHE" "docker>=7,<8" >&2
        w=$(ls "$CACHE"/docker-7*.whl | head -1)
    fi
    cp "$w" "$1/"
}

case "${1:-}" in
    image) image ;;
    *) echo "usage: tests/sandbox/systemd.sh image" >&2; exit 64 ;;
esac
