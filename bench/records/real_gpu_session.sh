#!/usr/bin/env bash
# The real-GPU session behind bench/records/real-gpu.md: gpupin against real NVML, the real CUDA driver and torch on a host
# with two NVIDIA GPUs and no Docker. Run from the repository root, with the gpupin and docker wheels in .whl/
# (`make wheels`, then `pip download --no-deps docker==7.1.0 -d .whl`):
#   bash bench/records/real_gpu_session.sh 2>&1 | tee real-gpu.log
. "$(dirname "$0")/host.sh"   # set -u, the wheels installed, show, U0/B0 U1/B1

show nvidia-smi --query-gpu=index,uuid,pci.bus_id,name --format=csv
python3 -c 'import importlib.metadata as m; print("nvidia-ml-py", m.version("nvidia-ml-py"), "torch", m.version("torch"))'
WHO='import torch; [print(f"workload: cuda:{k} = GPU-{torch.cuda.get_device_properties(k).uuid}") for k in range(torch.cuda.device_count())]'

echo; echo "### 1. aligned: the second card, by UUID and bus id"
show env GPUPIN_EXPECT="$U1@$B1" gpupin-entrypoint python3 -m gpupin.entrypoint
echo; echo "### 2. misaligned: the first card's UUID with the second card's bus id"
show env GPUPIN_EXPECT="$U0@$B1" gpupin-entrypoint python3 -c 'print("WORKLOAD STARTED")'
echo; echo "### 3. two cards in reversed order"
show env GPUPIN_EXPECT="$U1,$U0" gpupin-entrypoint python3 -c "$WHO"
echo; echo "### 4. the torch level, and an inherited CUDA_VISIBLE_DEVICES that meant the other card"
show env GPUPIN_EXPECT="$U1@$B1" CUDA_VISIBLE_DEVICES=0 gpupin-entrypoint --verify torch python3 -c "$WHO"
echo; echo "### 5. a launcher that rewrites CUDA_VISIBLE_DEVICES after the entrypoint: assert_pinned() catches it"
show env GPUPIN_EXPECT="$U1@$B1" gpupin-entrypoint --quiet sh -c \
    'CUDA_VISIBLE_DEVICES=0 python3 -c "import torch; torch.cuda.init(); from gpupin.entrypoint import assert_pinned; assert_pinned()" 2>&1 | tail -1'
echo; echo "### 6. no expectation: the mapping is reported; --require refuses"
show gpupin-entrypoint --verify cuda true
show gpupin-entrypoint --require true

echo; echo "### 7. wall time to exec true, against its floor (bench/run.py entrypoint, medians of interleaved runs)"
show python3 bench/run.py entrypoint -n 20 --expect "$U1@$B1"
show python3 bench/run.py entrypoint -n 20 --expect "$U1,$U0"
echo "torch level, 5 runs (s):"
for i in 1 2 3 4 5; do
    /usr/bin/time -f '%e' env GPUPIN_EXPECT="$U1@$B1" GPUPIN_QUIET=1 gpupin-entrypoint --verify torch true
done

echo; echo "### 8. hostagent on a host without Docker"
show hostagent ls
show hostagent ls --json
show hostagent run --dry-run --gpu 1 --rm my-train:latest python3 train.py
show hostagent run --dry-run --json --gpu 1 my-train:latest

echo; echo "### 9. the real-GPU tests"
show python3 -m pytest -q -p no:cacheprovider -m gpu tests/gpu/test_real_gpu.py
