#!/usr/bin/env bash
# Real-GPU session 5 (2026-12-01, after the gpupin.core restructure, card health, doctor and --watch): the
# real-GPU tests, card health read from the real NVML through gpupin.core, `hostagent doctor` on a real host (no
# Docker there), `gpupin-entrypoint --watch 5` around a torch workload (throughput bare vs watched, the watcher's
# own CPU), and the entrypoint's start-up. Run from the repository root with the wheels in .whl/ (`make wheels`,
# copied there): bash bench/records/real_gpu_session_5.sh 2>&1 | tee real-gpu-5.log
. "$(dirname "$0")/host.sh"   # set -u, the wheels installed, show, U0/B0 (U1/B1 on a second card)
export GPUPIN_EXPECT="$U0@$B0"
nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,persistence_mode,driver_version --format=csv

echo "### 1. the real-GPU tests"
show python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/test_real_gpu.py

echo; echo "### 2. card health from the real NVML (gpupin.core.readings / health)"
show python3 bench/records/real_health.py

echo; echo "### 3. hostagent doctor on a real GPU host without Docker"
show hostagent doctor
show hostagent doctor --json

echo; echo "### 4. --watch 5 around a torch workload: bf16 matmul TFLOP/s, bare then watched, three times"
for r in 1 2 3; do
  echo "bare $(python3 bench/records/watch_torch.py 20)"
  python3 bench/records/watch_cpu.py 5 python3 bench/records/watch_torch.py 20
done

echo; echo "### 5. start-up against its floor (bench/run.py entrypoint, medians of interleaved runs)"
show python3 bench/run.py entrypoint -n 20 --expect "$U0@$B0"
