#!/usr/bin/env bash
# `make demo`: what gpupin is for, in a few screens, on the simulated mixed-4 box (no GPU needed).
# The Makefile has started the sandboxed daemon and built gpupin:test; this script only drives them.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SANDBOX=$REPO/tests/sandbox/sandbox.sh
export DOCKER_HOST=${DOCKER_HOST:-unix:///run/gpupin-sandbox${GPUPIN_SANDBOX_NAME:+-$GPUPIN_SANDBOX_NAME}/docker.sock}
export LD_LIBRARY_PATH=$REPO/build/fakegpu/lib
export FAKEGPU_TOPOLOGY=${FAKEGPU_TOPOLOGY:-$REPO/tests/fakegpu/scenarios/mixed-4.json}
export PATH=$REPO/.venv/bin:$PATH
DOCKER=/usr/bin/docker
[ -x "$DOCKER" ] || DOCKER=docker
IMAGE=gpupin:test
uuid_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gpus'][int(sys.argv[2])]['uuid'])" \
    "$FAKEGPU_TOPOLOGY" "$1"; }
RTX=$(uuid_of 1)

bold() { printf '\n\033[1m== %s ==\033[0m\n' "$*"; }
note() { printf '\033[2m# %s\033[0m\n' "$*"; }
run() { printf '\033[36m$ %s\033[0m\n' "$*"; "$@"; printf '\033[2m(exit %s)\033[0m\n' "$?"; }
docker() { "$DOCKER" "$@"; }

bold "1. The box: an A800, an RTX 4090 and two more A800s, in PCI order (what nvidia-smi numbers 0-3)"
run hostagent ls

bold "2. The naive way: ask for nvidia-smi's GPU 1 (the 4090) with CUDA_VISIBLE_DEVICES=1"
note "CUDA's default order is FASTEST_FIRST: the 4090 (compute capability 8.9) is CUDA's 0, so CUDA's 1 is the"
note "A800 at 1B:00.0. Nothing errors; the job just lands on the wrong card:"
run docker run --rm --gpus all -e CUDA_VISIBLE_DEVICES=1 --entrypoint python3 "$IMAGE" -m gpupin.entrypoint

bold "3. The same container through gpupin-entrypoint, told which card was meant"
note "It sets CUDA_DEVICE_ORDER=PCI_BUS_ID, derives CUDA_VISIBLE_DEVICES, and asks the CUDA driver what cuda:0 is:"
run docker run --rm --gpus all -e CUDA_VISIBLE_DEVICES=1 -e "GPUPIN_EXPECT=$RTX" "$IMAGE"

bold "4. Pinned the gpupin way: hostagent starts it with --gpus device=UUID and the expectation"
run hostagent run --rm --uuid "$RTX" "$IMAGE"
run hostagent run --dry-run --gpu 3b:00.0 --gpu 0 "$IMAGE" python3 train.py

bold "5. Two jobs, one card: the second is refused (75) instead of silently sharing"
run hostagent run -d --rm --name demo-holder --gpu 1 "$IMAGE" sleep 4
run hostagent run --rm --gpu 1 "$IMAGE"
note "with --wait it runs as soon as the card is free:"
run hostagent run --rm --gpu 1 --wait 30 "$IMAGE" --quiet python3 -m gpupin.entrypoint

bold "6. A container runtime that exposes another card than the one asked for"
note "restarting the sandbox with the fault-misroute topology: asking for the 4090 exposes the A800 at 86:00.0"
FAKEGPU_TOPOLOGY=$REPO/tests/fakegpu/scenarios/fault-misroute.json "$SANDBOX" up >/dev/null
run docker run --rm --gpus "device=$RTX" "$IMAGE" python3 train.py
"$SANDBOX" up >/dev/null
note "refused with 78 before train.py ran; the sandbox is back on mixed-4"

if [ -f "$REPO/compose/two-services.yml" ] && hostagent compose --help >/dev/null 2>&1; then
    bold "7. A compose pair, each service pinned to its own card"
    rendered=$(mktemp --suffix=.yml)
    run hostagent compose check "$REPO/compose/wrong-way-count.yml"
    run hostagent compose render "$REPO/compose/two-services.yml" -o "$rendered"
    run docker-compose -p gpupin-demo -f "$rendered" up --abort-on-container-exit
    docker-compose -p gpupin-demo -f "$rendered" down -v >/dev/null 2>&1
    rm -f "$rendered"
fi
echo
