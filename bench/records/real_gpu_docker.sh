#!/bin/bash
# The gpu tier on a lent GPU host (no Docker, no registry), as it runs for bench/records/real-gpu.md: the engine of
# tests/gpu/engine.sh, the project's image on a base made of the host's own root, the tier, the benchmarks. It runs
# from a folder (its argument) holding engine.tar.xz (bin/: dockerd, containerd, the shim, docker, runc, tini; lib/:
# libseccomp), src.tar (the checkout) and wheels/ (gpupin[host] and its needs); OUT is where its logs go.
#
#   real_gpu_docker.sh CARRY [STAGES]   STAGES: any of setup, tier, bench, authz (default: setup tier bench authz)
#
# A lent machine gives one command a few minutes: the stages can be run in calls of their own on the same warm
# machine (the engine, the image and the venvs stay from the setup).
C=$(cd "${1:?usage: real_gpu_docker.sh CARRY_FOLDER [STAGES]}" && pwd)
STAGES=${2:-setup tier bench authz}
exec > >(tee -a "$OUT/session.log") 2>&1
T0=$(date +%s)
el() { echo "[+$(( $(date +%s) - T0 )) s] $*"; }
show() { printf '\n$ %s\n' "$*"; "$@"; printf '(exit %s)\n' "$?"; }
export PYTHONUNBUFFERED=1 DOCKER_HOST=unix:///run/gpupin-gpu/docker.sock PATH=/tmp/engine/bin:$PATH

setup() {
    uname -r; grep PRETTY /etc/os-release; nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version --format=csv
    python3 -c 'import sys; print(sys.version.split()[0], sys.prefix, sys.base_prefix)'; readlink -f "$(command -v python3)"
    stat -fc %T /sys/fs/cgroup; head -3 /proc/self/cgroup; nproc
    du -sh /opt/torch 2>/dev/null; mount | grep -E ' on /(opt|usr|) ' | head
    mkdir -p /tmp/engine /tmp/src && tar -C /tmp/src -xf "$C/src.tar"
    tar -C /tmp/engine -xJf "$C/engine.tar.xz" 2>/dev/null || python3 -c \
        "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$C/engine.tar.xz" /tmp/engine
    el unpacked
    cd /tmp/src || return 1
    bash tests/gpu/engine.sh up /tmp/engine || { tail -n 40 /run/gpupin-gpu/*.log; return 1; }
    docker info --format '{{.ServerVersion}} {{.Driver}} cgroup={{.CgroupVersion}}/{{.CgroupDriver}} cdi={{json .CDISpecDirs}} runtimes={{json .Runtimes}}'
    el engine up
    local BP SP dirs ex
    BP=$(python3 -c 'import sys; print(sys.base_prefix)')
    dirs=(bin sbin lib lib64 usr etc opt/torch var/lib/dpkg)
    case "$BP" in /usr|/usr/*) ;; *) dirs+=("${BP#/}") ;; esac
    SP=$(python3 -c 'import site; print(site.getsitepackages()[0])'); SP=${SP#/}
    ex=(--exclude=usr/local/nvidia --exclude=usr/local/cuda --exclude='usr/local/cuda-*' --exclude=usr/share/doc
        --exclude=usr/share/man --exclude="$SP/jax*" --exclude="$SP/cupy*" --exclude="$SP/onnx*" --exclude="$SP/tensorflow*"
        --exclude="$SP/transformers" --exclude="$SP/torch_geometric" --exclude="$SP/cv2" --exclude="$SP/opencv*")
    tar -C / -cf - "${ex[@]}" "${dirs[@]}" 2>/dev/null | timeout 300 docker import \
        --change "ENV PATH=$(dirname "$(command -v python3)"):/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        - gpupin-base:host >/dev/null
    el base imported; docker images
    mkdir -p build/wheels && cp "$C"/wheels/gpupin-*.whl "$C"/wheels/nvidia_ml_py-*.whl build/wheels/
    DOCKER_BUILDKIT=0 docker build -q --build-arg BASE_IMAGE=gpupin-base:host -t gpupin:test . 2>&1 | tail -3
    el image built
    show docker run --rm --device "nvidia.com/gpu=$(last_uuid)" gpupin:test
    # the CLI for the tests and the benchmarks: a clean venv (no .pth files of the machine's Python)
    python3 -m venv --without-pip .venv && python3 -m pip --python .venv/bin/python install -q --no-index \
        --find-links "$C/wheels" 'gpupin[host]' || { echo "clean venv failed"; }
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$C"/wheels/gpupin-*.whl "$C"/wheels/docker-*.whl \
        "$C"/wheels/ruamel_yaml-*.whl
    el venvs
    show .venv/bin/hostagent run --dry-run --uuid "$(last_uuid)" gpupin:test
}

last_uuid() { nvidia-smi --query-gpu=uuid --format=csv,noheader | tail -1; }

tier() {
    cd /tmp/src || return 1
    PYTHONPATH=/tmp/site:/tmp/src timeout ${TIER_S:-330} python3 -m pytest -p no:cacheprovider -m gpu tests/gpu -v -rs -s \
        -o addopts="" --timeout 200 2>&1 | tee "$OUT/test-gpu.log" | grep -vE '^\s*$' | tail -150
    el tier done
    docker ps -aq | xargs -r docker rm -f >/dev/null
}

bench() {
    cd /tmp/src || return 1
    PATH=/tmp/src/.venv/bin:$PATH timeout 300 .venv/bin/python bench/run.py -n "${BENCH_N:-12}" --expect "$(last_uuid)" \
        --json "$OUT/bench.json" entrypoint run
    el bench done
    tail -n 5 /run/gpupin-gpu/dockerd.log
}

# The authorization plugin on the real card (docs/authz.md): the agent and `hostagent authz` beside the engine, the
# engine reloaded with the plugin; a plain create on a card held through gpupin, and the granted run; then what the
# plugin costs a `docker run` (plugin on against off, interleaved blocks).
authz() {
    cd /tmp/src || return 1
    local H=/tmp/src/.venv/bin/hostagent A=/tmp/authz U i mode
    export GPUPIN_AGENT_SOCKET=$A/agent.sock GPUPIN_POLICY=$A/policy.toml
    mkdir -p $A && printf '[enforce]\nmode = "on"\n' >"$GPUPIN_POLICY"
    setsid "$H" serve --socket "$GPUPIN_AGENT_SOCKET" --http none --record none >$A/agent.log 2>&1 </dev/null &
    echo $! >$A/agent.pid
    setsid "$H" authz --agent-socket "$GPUPIN_AGENT_SOCKET" --policy "$GPUPIN_POLICY" >$A/plugin.log 2>&1 </dev/null &
    echo $! >$A/plugin.pid
    for i in $(seq 100); do [ -S /run/docker/plugins/gpupin.sock ] && [ -S "$GPUPIN_AGENT_SOCKET" ] && break; sleep 0.1; done
    plugin() {  # on|off: the engine's daemon.json, reloaded (SIGHUP), waited for in its log
        local before; before=$(grep -c "Reloaded configuration" /run/gpupin-gpu/dockerd.log)
        python3 -c "import json,sys; p='/run/gpupin-gpu/daemon.json'; d=json.load(open(p)); d.pop('authorization-plugins', None)
if sys.argv[1] == 'on': d['authorization-plugins'] = ['gpupin']
json.dump(d, open(p, 'w'))" "$1"
        kill -HUP "$(cat /run/gpupin-gpu/dockerd.pid)"
        for i in $(seq 100); do [ "$(grep -c "Reloaded configuration" /run/gpupin-gpu/dockerd.log)" -gt "$before" ] && break; sleep 0.1; done
    }
    plugin on
    show "$H" setup authz --check --daemon-json /run/gpupin-gpu/daemon.json --pidfile /run/gpupin-gpu/dockerd.pid
    U=$(last_uuid)
    show "$H" run -d --name held-by-gpupin --uuid "$U" gpupin:test sleep 600
    show docker run --rm --device "nvidia.com/gpu=$U" gpupin:test true
    show docker run --rm --gpus all gpupin:test true
    show docker rm -f held-by-gpupin
    show docker run --rm --device "nvidia.com/gpu=$U" gpupin:test true
    show "$H" run --rm --uuid "$U" gpupin:test
    show docker run --rm --entrypoint true gpupin:test
    el "authz checks done"
    # the cost: a non-GPU run, and a GPU run on a free card (grants off, so a plain create may take it)
    printf '[enforce]\nmode = "on"\ngrants = false\n' >"$GPUPIN_POLICY"
    kill -HUP "$(cat $A/agent.pid)"; sleep 1  # the agent reads its policy again on SIGHUP (the plugin, on a change)
    : >$A/times
    .venv/bin/python bench/authz_bench.py --calls /run/docker/plugins/gpupin.sock --calls-threads 8 --gpu "$U" --json "$OUT/authz-calls.json"
    # Three ways in turn: gpupin's plugin judging (on), no plugin (off), and the plugin on with the policy's mode
    # off (null: it allows everything unread but a create's answer), which is what the daemon's authorization
    # mechanism costs with a plugin that decides nothing; on - null is then gpupin's rules.
    on_policy='[enforce]\nmode = "on"\ngrants = false\n'
    for block in $(seq "${AUTHZ_BLOCKS:-12}"); do
        mode=$(echo on off null | cut -d' ' -f$(( (block - 1) % 3 + 1 )))
        if [ $mode = null ]; then printf '[enforce]\nmode = "off"\n' >"$GPUPIN_POLICY"; else printf "$on_policy" >"$GPUPIN_POLICY"; fi
        plugin "$([ $mode = off ] && echo off || echo on)"
        for i in $(seq "${AUTHZ_N:-6}"); do
            for what in plain gpu; do
                t0=$(date +%s%N)
                if [ $what = plain ]; then docker run --rm --entrypoint true gpupin:test >/dev/null 2>&1
                else docker run --rm --device "nvidia.com/gpu=$U" --entrypoint true gpupin:test >/dev/null 2>&1; fi
                echo "$mode $what $? $(( ($(date +%s%N) - t0) / 1000 )) $block" >>$A/times
            done
        done
    done
    plugin off
    python3 - $A/times <<'PY' | tee "$OUT/authz-cost.txt"
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for what in ("plain", "gpu"):
    t = {m: [int(r[3]) / 1000 for r in rows if r[0] == m and r[1] == what and r[2] == "0"] for m in ("on", "off", "null")}
    if not all(t.values()):
        print(f"docker run ({what}): no run succeeded with {[m for m, v in t.items() if not v]}")
        continue
    med = {m: statistics.median(v) for m, v in t.items()}
    blocks = sorted({int(r[4]) for r in rows})
    per = {b: statistics.median([int(r[3]) / 1000 for r in rows if int(r[4]) == b and r[1] == what and r[2] == "0"]) for b in blocks}
    cycles = [b for b in blocks if (b - 1) % 3 == 0 and b + 2 in per]  # on, off, null in turn
    def span(d): return f"median {statistics.median(d):+.1f} ms, from {min(d):+.1f} to {max(d):+.1f}"
    print(f"docker run ({what}): plugin on {med['on']:.1f} ms, off {med['off']:.1f} ms, null {med['null']:.1f} ms "
          f"(n={len(t['on'])}, {len(t['off'])}, {len(t['null'])}); added {med['on'] - med['off']:+.1f} ms, of which "
          f"the daemon's mechanism with a plugin that decides nothing {med['null'] - med['off']:+.1f} ms; "
          f"cycles on-off: {span([per[b] - per[b + 1] for b in cycles])}; null-off: {span([per[b + 2] - per[b + 1] for b in cycles])}")
PY
    tail -n 20 $A/plugin.log; tail -n 20 $A/agent.log
    kill "$(cat $A/agent.pid)" "$(cat $A/plugin.pid)" 2>/dev/null
    el "authz done"
}

for stage in $STAGES; do
    el "stage $stage"
    "$stage" || { el "stage $stage failed"; exit 1; }
done
