#!/usr/bin/env bash
# Records what the Engine streams for a real image pull (`POST /images/create`), for the tests of hostagent's pull
# progress (tests/data/pull-stream-*.jsonl): there is no registry to pull from in the tests, so the stream's shape
# is recorded once from a real daemon pulling from a real registry, here, and replayed.
#
# It makes a network namespace of its own (loopback only), starts Debian's docker-registry and a throw-away
# containerd + dockerd inside it (nsenter --net: `ip netns exec` remounts /sys), pushes the sandbox's base image
# to the registry, removes it, pulls it back through the API with curl, and writes the stream. Everything it
# started is stopped and removed at the end.
#
#   tests/sandbox/record_pull.sh OUT.jsonl
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=record-pull
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
OUT=$(realpath -m "${1:?usage: record_pull.sh OUT.jsonl}")
NS=gpupin-record-pull
DIR=$(mktemp -d /run/gpupin-record-pull.XXXXXX)
[ "$(id -u)" = 0 ] || die "needs root (a network namespace and a daemon)"
ensure_packages docker-registry curl containerd docker.io:/usr/sbin/dockerd
build_rootfs

cleanup() {
    stop_pid "$DIR/dockerd.pid" dockerd
    stop_pid "$DIR/containerd.pid" containerd
    stop_pid "$DIR/registry.pid" registry
    pgrep -f -- "-address $DIR/containerd.sock" | xargs -r kill -KILL 2>/dev/null || true
    unmount_under "$DIR"
    ip netns del "$NS" 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT
ip netns del "$NS" 2>/dev/null || true
ip netns add "$NS"
ip -n "$NS" link set lo up
in_ns() { nsenter --net="/run/netns/$NS" "$@"; }

cat >"$DIR/registry.yml" <<EOT
version: 0.1
storage: {filesystem: {rootdirectory: $DIR/registry}}
http: {addr: 127.0.0.1:5000}
EOT
in_ns setsid docker-registry serve "$DIR/registry.yml" >"$DIR/registry.log" 2>&1 </dev/null &
echo $! >"$DIR/registry.pid"
cat >"$DIR/containerd.toml" <<EOT
version = 2
root = "$DIR/containerd-root"
state = "$DIR/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$DIR/containerd.sock"
EOT
in_ns setsid containerd --config "$DIR/containerd.toml" >"$DIR/containerd.log" 2>&1 </dev/null &
echo $! >"$DIR/containerd.pid"
wait_for test -S "$DIR/containerd.sock" || die "containerd did not start; see $DIR/containerd.log"
in_ns setsid dockerd --host "unix://$DIR/docker.sock" --containerd "$DIR/containerd.sock" \
    --data-root "$DIR/docker" --exec-root "$DIR/exec" --pidfile "$DIR/dockerd.pid" \
    --bridge=none --iptables=false --ip-masq=false >"$DIR/dockerd.log" 2>&1 </dev/null &
dk() { docker -H "unix://$DIR/docker.sock" "$@"; }
wait_for dk version || die "dockerd did not answer; see $DIR/dockerd.log"
wait_for in_ns curl -sf http://127.0.0.1:5000/v2/ || die "the registry did not answer; see $DIR/registry.log"

IMAGE=127.0.0.1:5000/gpupin/base:recorded
dk import -c 'CMD ["/bin/bash"]' "$ROOTFS_TAR" gpupin-record-base >/dev/null
# Three layers of different sizes, as a real image has several.
printf 'FROM gpupin-record-base\nRUN head -c 3000000 /dev/urandom >/blob1\nRUN head -c 200000 /dev/urandom >/blob2\n' |
    dk build -q --network none -t "$IMAGE" - >/dev/null
dk push "$IMAGE" >/dev/null
dk rmi "$IMAGE" gpupin-record-base >/dev/null
version=$(dk version --format '{{.Server.Version}}')
curl -sS --unix-socket "$DIR/docker.sock" -X POST \
    "http://docker/images/create?fromImage=127.0.0.1:5000/gpupin/base&tag=recorded" >"$OUT.tmp"
mv -f "$OUT.tmp" "$OUT"
say "recorded $(wc -l <"$OUT") events of a pull from Docker $version into $OUT"
