#!/usr/bin/env bash
# A three-node Docker Swarm (docs/design.md, The simulated host): one manager and two workers, each a
# containerd + dockerd of its own in a network namespace of its own, each with its own simulated cards, joined
# into one swarm over a bridge that lives in a namespace too. The addresses exist only inside those namespaces:
# no traffic reaches any other network, and the system daemon is never touched.
#
#   node      topology   address           advertises (from `hostagent swarm node-config`)
#   manager   mixed-4    192.168.213.11    4 cards
#   worker1   dgx-8      192.168.213.12    8 cards
#   worker2   mig        192.168.213.13    2 MIG devices and 1 card
#
# Each node's default runtime is the fake nvidia-container-runtime (it adds the fake hook to every container, as
# the real one does), and the fake hook reads the node's own toolkit config, whose swarm-resource names
# DOCKER_RESOURCE_GPU. GPUPIN_SWARM_TRAP=NODE configures that node as Docker's own example does, NVIDIA-GPU=<UUID>,
# while its runtime still reads DOCKER_RESOURCE_GPU (the silent trap: its tasks see every card).
#
#   swarm.sh up       start the cluster (or reconfigure the nodes whose settings changed), print one line per node:
#                     NODE DOCKER_HOST TOPOLOGY ADDRESS KIND; gpupin:test comes from the single-node sandbox
#                     (make image-test) unless a node holds that image already
#   swarm.sh down     remove the containers, stop the daemons, delete the namespaces (the image caches stay)
#   swarm.sh purge    down, then remove the nodes' image caches too
#   swarm.sh status   say whether it runs, and the nodes the manager sees
#   swarm.sh stop-node NODE    stop that node's dockerd (a daemon gone down; its containerd and membership stay)
#   swarm.sh start-node NODE   start it again, as it was configured; it rejoins the swarm
#
# Environment: GPUPIN_SANDBOX_NAME (as for sandbox.sh: one more cluster beside the default one, with its own
# namespaces, /run/gpupin-swarm-NAME and /var/lib/gpupin-swarm-NAME); GPUPIN_SWARM_TRAP (a node name, or empty);
# GPUPIN_SWARM_IMAGE_SOURCE (the DOCKER_HOST to take gpupin:test from; default: the sandbox of the same name).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SAY_AS=swarm
# shellcheck source=tests/sandbox/common.sh
. "$REPO/tests/sandbox/common.sh"
NAME=${GPUPIN_SANDBOX_NAME:-}
case "$NAME" in *[!a-z0-9-]*) echo "swarm: ERROR: GPUPIN_SANDBOX_NAME=$NAME: use a-z, 0-9 and -" >&2; exit 64 ;; esac
SUFFIX=${NAME:+-$NAME}
RUN=/run/gpupin-swarm$SUFFIX
STATE=/var/lib/gpupin-swarm$SUFFIX
NS=gpupin-swarm$SUFFIX
LAN_NS=$NS-lan
NODES=(manager worker1 worker2)
declare -A TOPOLOGY=([manager]=mixed-4 [worker1]=dgx-8 [worker2]=mig)
declare -A ADDRESS=([manager]=192.168.213.11 [worker1]=192.168.213.12 [worker2]=192.168.213.13)
MANAGER=manager
PREFIX_LEN=24
TRAP=${GPUPIN_SWARM_TRAP:-}
TRAP_KIND=NVIDIA-GPU
IMAGE=gpupin:test
IMAGE_SOURCE=${GPUPIN_SWARM_IMAGE_SOURCE:-unix:///run/gpupin-sandbox$SUFFIX/docker.sock}
FAKEGPU=$REPO/build/fakegpu
RUNTIME=$FAKEGPU/bin/nvidia-container-runtime
HOSTAGENT=$REPO/.venv/bin/hostagent
VPY=$REPO/.venv/bin/python
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=$(command -v docker || echo /usr/bin/docker)

[ "$(id -u)" = 0 ] || die "the swarm's daemons need root (as dockerd does)"
if [ -n "$TRAP" ] && [ -z "${TOPOLOGY[$TRAP]+x}" ]; then
    echo "swarm: ERROR: GPUPIN_SWARM_TRAP=$TRAP is no node. HINT: name one of ${NODES[*]}" >&2; exit 64
fi

dir_of() { echo "$RUN/$1"; }
ns_of() { echo "$NS-$1"; }
sock_of() { echo "$RUN/$1/docker.sock"; }
dkn() { local node=$1; shift; "$DOCKER" -H "unix://$(sock_of "$node")" "$@"; }
topology_of() { echo "$REPO/tests/fakegpu/scenarios/${TOPOLOGY[$1]}.json"; }
kind_of() { if [ "$1" = "$TRAP" ]; then echo "$TRAP_KIND"; else echo GPU; fi; }
config_line() {
    local topo; topo=$(topology_of "$1")
    printf '%s %s %s kind=%s\n' "$REPO" "$topo" "$(sha256sum <"$topo" | cut -c1-16)" "$(kind_of "$1")"
}
node_line() { printf '%s unix://%s %s %s %s\n' "$1" "$(sock_of "$1")" "$(topology_of "$1")" "${ADDRESS[$1]}" "$(kind_of "$1")"; }
answers() { [ -S "$(sock_of "$1")" ] && dkn "$1" version >/dev/null 2>&1; }

# ---------------------------------------------------------------------------------------------- network ----

setup_network() {
    # The bridge lives in a namespace of its own, so nothing of the cluster is in the host's network namespace.
    ip netns add "$LAN_NS"
    ip -n "$LAN_NS" link set lo up
    ip -n "$LAN_NS" link add br0 type bridge
    ip -n "$LAN_NS" link set br0 up
    local node ns
    for node in "${NODES[@]}"; do
        ns=$(ns_of "$node")
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        ip -n "$ns" link add eth0 type veth peer name "$node" netns "$LAN_NS"
        ip -n "$LAN_NS" link set "$node" master br0 up
        ip -n "$ns" addr add "${ADDRESS[$node]}/$PREFIX_LEN" dev eth0
        ip -n "$ns" link set eth0 up
    done
}

delete_network() {
    local ns
    for ns in "$LAN_NS" $(for n in "${NODES[@]}"; do ns_of "$n"; done); do
        [ -e "/run/netns/$ns" ] && ip netns del "$ns" 2>/dev/null || true
    done
}

# ------------------------------------------------------------------------------------------------ nodes ----

write_node_config() {
    # Dogfooding: the node's daemon.json and toolkit config are what `hostagent swarm node-config` prints for its
    # cards; the trapped node takes daemon.json from `--kind NVIDIA-GPU` and config.toml from the default kind.
    local node=$1 dir; dir=$(dir_of "$node")
    mkdir -p "$dir/nvidia-container-runtime"
    local nc=(env "LD_LIBRARY_PATH=$FAKEGPU/lib" "FAKEGPU_TOPOLOGY=$(topology_of "$node")" "$HOSTAGENT" swarm
              node-config --json --runtime-path "$RUNTIME" --daemon-json "$dir/daemon.json"
              --toolkit-config "$dir/nvidia-container-runtime/config.toml")
    "${nc[@]}" >"$dir/node-config.json" || die "hostagent swarm node-config failed for $node"
    "${nc[@]}" --kind "$(kind_of "$node")" >"$dir/node-config-daemon.json" || die "node-config failed for $node"
    "$VPY" - "$dir" <<'EOF'
import json, sys
d = sys.argv[1]
runtime = json.load(open(f"{d}/node-config.json"))["toolkit_config"]
daemon = json.load(open(f"{d}/node-config-daemon.json"))["daemon_json"]
with open(f"{d}/daemon.json", "w") as f:
    json.dump(daemon, f, indent=2)
with open(f"{d}/nvidia-container-runtime/config.toml", "w") as f:
    f.writelines(f"{key} = {json.dumps(value)}\n" for key, value in runtime.items())
EOF
}

set_node_env() {
    # containerd's environment reaches the runtime and the hook (containerd -> shim -> runtime -> runc -> hook);
    # dockerd's reaches the hook for `--gpus`. Both get the node's topology and toolkit config.
    local dir; dir=$(dir_of "$1")
    NODE_ENV=(env -i "PATH=$FAKEGPU/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
              "FAKEGPU_TOPOLOGY=$(topology_of "$1")" "FAKEGPU_HOOK_LOG=$dir/hook.log"
              "FAKEGPU_TOOLKIT_CONFIG=$dir/nvidia-container-runtime/config.toml" HOME=/root)
}

start_containerd() {
    local node=$1 dir state; dir=$(dir_of "$node"); state=$STATE/$node
    mkdir -p "$dir" "$state/containerd"
    cat >"$dir/containerd.toml" <<EOF
version = 2
root = "$state/containerd"
state = "$dir/containerd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$dir/containerd.sock"
EOF
    mkdir -p "$dir/plugins" && chmod 0700 "$dir/plugins"
    # Each node's daemons run in a mount namespace of their own (ns_containerd), as the sandbox's do: there
    # /run/docker/plugins is the node's `plugins` folder, so a node serves its own authorization plugin and the
    # host's folder is neither read nor written. dockerd joins containerd's namespace (start_dockerd): runc must see
    # the layers dockerd mounts. setsid, nsenter and unshare exec: the job's pid becomes containerd's.
    setsid nsenter --net="/run/netns/$(ns_of "$node")" unshare -m --propagation private -- \
        "$REPO/tests/sandbox/swarm.sh" _containerd "$node" >"$dir/containerd.log" 2>&1 </dev/null 9>&- &
    echo $! >"$dir/containerd.pid"
    wait_for test -S "$dir/containerd.sock" || die "$node: containerd did not start; see $dir/containerd.log"
}

ns_containerd() {
    # start_containerd's, inside the node's new mount namespace: /run/docker/plugins is the node's, then containerd.
    local node=$1 dir; dir=$(dir_of "$node")
    NS_HOLD=$STATE/$node/ns-hold ns_private_plugins "$dir/plugins"
    set_node_env "$node"
    exec "${NODE_ENV[@]}" containerd --config "$dir/containerd.toml"
}

start_dockerd() {
    # In containerd's mount namespace; own UTS namespace too, so that each node has its own host name in `docker
    # node ls`.
    local node=$1 dir state; dir=$(dir_of "$node"); state=$STATE/$node
    mkdir -p "$state/docker"
    set_node_env "$node"
    setsid "${NODE_ENV[@]}" nsenter --mount="/proc/$(cat "$dir/containerd.pid")/ns/mnt" \
        --net="/run/netns/$(ns_of "$node")" unshare --uts \
        sh -c 'hostname "$0" && exec "$@"' "$node" \
        dockerd --config-file "$dir/daemon.json" --host "unix://$(sock_of "$node")" \
        --containerd "$dir/containerd.sock" --containerd-namespace gpupin-swarm \
        --containerd-plugins-namespace gpupin-swarm-plugins \
        --data-root "$state/docker" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
        --bridge=none --iptables=false --ip-masq=false --userland-proxy=false \
        >"$dir/dockerd.log" 2>&1 </dev/null 9>&- &
    wait_for answers "$node" || die "$node: dockerd did not answer; see $dir/dockerd.log"
    config_line "$node" >"$dir/config"
}

stop_node() {
    local node=$1 dir state ids; dir=$(dir_of "$node"); state=$STATE/$node
    if alive "$dir/dockerd.pid" && answers "$node"; then
        ids=$(dkn "$node" ps -aq 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -n "$ids" ] && dkn "$node" rm -f $ids >/dev/null 2>&1 || true
    fi
    stop_pid "$dir/dockerd.pid" "$node dockerd"
    stop_pid "$dir/containerd.pid" "$node containerd"
    # containerd shims of containers that outlived a killed daemon
    pgrep -f -- "-address $dir/containerd.sock" | xargs -r kill -KILL 2>/dev/null || true
    unmount_under "$dir" "$state/docker" "$state/containerd"
    # A fresh swarm every time: a node that kept its membership would wait for a manager that is gone.
    rm -rf "$dir" "$state/docker/swarm"
}

start_node() {
    local node=$1
    write_node_config "$node"
    start_containerd "$node"
    start_dockerd "$node"
    # Containers a killed run left behind (their swarm is gone)
    local ids; ids=$(dkn "$node" ps -aq)
    # shellcheck disable=SC2086
    [ -z "$ids" ] || dkn "$node" rm -f $ids >/dev/null
}

restart_dockerd() {
    # A changed daemon.json (the trap on or off): dockerd only; the node keeps its swarm membership.
    local node=$1 dir; dir=$(dir_of "$node")
    say "$node: reconfiguring (advertises $(kind_of "$node"))"
    write_node_config "$node"
    stop_pid "$dir/dockerd.pid" "$node dockerd"
    start_dockerd "$node"
}

# ------------------------------------------------------------------------------------------------ swarm ----

load_image() {
    # gpupin:test comes from the sandbox (`make image-test` built it from the Dockerfile): saved once, loaded into
    # every node that lacks this very image.
    local want need=() node tar
    want=$("$DOCKER" -H "$IMAGE_SOURCE" image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null) || true
    for node in "${NODES[@]}"; do
        [ -n "$want" ] && [ "$(dkn "$node" image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null)" = "$want" ] && continue
        [ -z "$want" ] && dkn "$node" image inspect "$IMAGE" >/dev/null 2>&1 && continue
        need+=("$node")
    done
    [ ${#need[@]} = 0 ] && return 0
    [ -n "$want" ] || die "no $IMAGE at $IMAGE_SOURCE to load into ${need[*]}. HINT: make image-test (or set GPUPIN_SWARM_IMAGE_SOURCE)"
    say "loading $IMAGE into ${need[*]}"
    tar=$STATE/image.tar
    mkdir -p "$STATE"
    "$DOCKER" -H "$IMAGE_SOURCE" save -o "$tar" "$IMAGE"
    local pids=() pid rc=0
    for node in "${need[@]}"; do dkn "$node" load -q -i "$tar" >/dev/null & pids+=($!); done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    rm -f "$tar"
    [ "$rc" = 0 ] || die "docker load failed on one of ${need[*]}"
}

image_available() {
    # Before anything starts: the source has the image, or every node's image store holds one from before.
    "$DOCKER" -H "$IMAGE_SOURCE" image inspect "$IMAGE" >/dev/null 2>&1 && return 0
    local node
    for node in "${NODES[@]}"; do
        grep -qs "\"$IMAGE\"" "$STATE/$node/docker/image/overlay2/repositories.json" || return 1
    done
}

form_swarm() {
    local addr=${ADDRESS[$MANAGER]} token node pids=() pid rc=0
    dkn "$MANAGER" swarm init --advertise-addr "$addr" --listen-addr "$addr:2377" >/dev/null
    token=$(dkn "$MANAGER" swarm join-token -q worker)
    for node in "${NODES[@]}"; do
        [ "$node" = "$MANAGER" ] && continue
        dkn "$node" swarm join --token "$token" --advertise-addr "${ADDRESS[$node]}" \
            --listen-addr "${ADDRESS[$node]}:2377" "$addr:2377" >/dev/null & pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    [ "$rc" = 0 ] || die "a worker could not join; see $RUN/*/dockerd.log"
}

# Every node Ready and advertising exactly what its daemon.json lists, read as hostagent reads a node.
READY_PY=$(cat <<'EOF'
import json, sys
from gpupin.hostagent.swarm.resources import from_engine, parse_terms
for node in json.load(sys.stdin):
    with open(f"{sys.argv[1]}/{node['Description']['Hostname']}/daemon.json") as f:
        want = parse_terms(json.load(f)["node-generic-resources"])
    got = from_engine(node["Description"]["Resources"].get("GenericResources"))
    if node["Status"]["State"] != "ready" or sorted(map(repr, got)) != sorted(map(repr, want)):
        sys.exit(1)
EOF
)

ready_with_resources() {
    dkn "$MANAGER" node inspect "${NODES[@]}" 2>/dev/null | "$VPY" -c "$READY_PY" "$RUN"
}

healthy() {
    local node
    for node in "${NODES[@]}"; do
        alive "$(dir_of "$node")/dockerd.pid" && alive "$(dir_of "$node")/containerd.pid" && answers "$node" || return 1
    done
    [ "$(dkn "$MANAGER" info --format '{{.Swarm.LocalNodeState}} {{.Swarm.Nodes}}' 2>/dev/null)" = "active ${#NODES[@]}" ]
}

# --------------------------------------------------------------------------------------------- commands ----

do_down() {
    local node pids=() pid
    for node in "${NODES[@]}"; do stop_node "$node" & pids+=($!); done
    for pid in "${pids[@]}"; do wait "$pid" || true; done
    delete_network
    rm -rf "$RUN"
}

do_up() {
    ensure_packages docker.io:/usr/sbin/dockerd containerd iproute2:/usr/sbin/ip procps:/usr/bin/pgrep
    [ -x "$RUNTIME" ] || die "$RUNTIME is missing: run 'make fakegpu' first"
    [ -x "$HOSTAGENT" ] || die "$HOSTAGENT is missing: run 'make setup' first"
    mkdir -p "$(dirname "$RUN")"
    exec 9>"$RUN.lock"
    flock 9
    local node changed=() pids=() pid rc=0
    if healthy; then
        for node in "${NODES[@]}"; do
            [ "$(cat "$(dir_of "$node")/config" 2>/dev/null)" = "$(config_line "$node")" ] || changed+=("$node")
        done
        for node in "${changed[@]}"; do
            # Only the advertised kind may change in place; anything else is a fresh cluster.
            [ "$(cut -d' ' -f1-3 "$(dir_of "$node")/config")" = "$(config_line "$node" | cut -d' ' -f1-3)" ] \
                || { changed=(all); break; }
        done
    else
        changed=(all)
        if [ -d "$RUN" ] || [ -e "/run/netns/$LAN_NS" ]; then say "cleaning up a stale cluster left by a killed run"; fi
    fi
    if [ "${changed[*]-}" = all ]; then
        image_available || die "no $IMAGE at $IMAGE_SOURCE, and a node has none. HINT: make image-test (or set GPUPIN_SWARM_IMAGE_SOURCE)"
        do_down
        mkdir -p "$RUN" "$STATE"
        setup_network
        for node in "${NODES[@]}"; do start_node "$node" & pids+=($!); done
        for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
        [ "$rc" = 0 ] || die "a node did not start"
        load_image
        form_swarm
        say "up: ${#NODES[@]} nodes"
    else
        for node in "${changed[@]}"; do restart_dockerd "$node"; done
        load_image
    fi
    wait_for ready_with_resources || die "the nodes did not all become ready with their generic resources"
    for node in "${NODES[@]}"; do node_line "$node"; done | tee "$RUN/nodes"
}

node_arg() {
    [ -n "${1:-}" ] && [ -n "${TOPOLOGY[$1]+x}" ] || { echo "swarm: ERROR: name a node: ${NODES[*]}" >&2; exit 64; }
    [ -d "$(dir_of "$1")" ] || die "the cluster is not up. HINT: swarm.sh up"
}

do_stop_node() {
    node_arg "${1:-}"
    exec 9>"$RUN.lock"
    flock 9
    stop_pid "$(dir_of "$1")/dockerd.pid" "$1 dockerd"
    say "$1: dockerd stopped"
}

do_start_node() {
    node_arg "${1:-}"
    exec 9>"$RUN.lock"
    flock 9
    if alive "$(dir_of "$1")/dockerd.pid" && answers "$1"; then return 0; fi
    alive "$(dir_of "$1")/containerd.pid" || start_containerd "$1"
    start_dockerd "$1"
    say "$1: dockerd started"
}

do_status() {
    if ! healthy; then echo "not running"; return 1; fi
    cat "$RUN/nodes"
    dkn "$MANAGER" node ls
}

case "${1:-}" in
    up) do_up ;;
    down) do_down; say "down" ;;
    purge) do_down; rm -rf "$STATE"; say "purged $STATE" ;;
    status) do_status ;;
    stop-node) do_stop_node "${2:-}" ;;
    start-node) do_start_node "${2:-}" ;;
    _containerd) ns_containerd "${2:-}" ;;  # start_containerd's, inside the node's new mount namespace
    *) echo "usage: $0 up|down|purge|status|stop-node NODE|start-node NODE" >&2; exit 64 ;;
esac
