#!/usr/bin/env bash
# Real-GPU session 3 (the end of the session's work): the real-GPU tests, `hostagent ls` as it now looks on real
# NVML (temperature, power, processes with user), --format, and the entrypoint's start-up against its floor.
# Run from the repository root with the wheels in .whl/ (as real_gpu_session_2.sh):
#   bash bench/records/real_gpu_session_3.sh 2>&1 | tee real-gpu-3.log
. "$(dirname "$0")/host.sh"   # set -u, the wheels installed, show, U0/B0 U1/B1

echo "### 1. the real-GPU tests"
show python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/gpu/test_real_gpu.py

echo; echo "### 2. hostagent ls on real NVML, with a process on card 1"
python3 -c 'import torch, time; x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda:1"); time.sleep(20)' &
sleep 8
show hostagent ls --color never
show hostagent ls --format '{index} {uuid} {temperature_c} {power_draw_w}/{power_limit_w} {memory_used_mib}/{memory_total_mib} {processes}'
show hostagent ls --json
wait

echo; echo "### 3. start-up against its floor (bench/run.py entrypoint, medians of interleaved runs)"
show python3 bench/run.py entrypoint -n 20 --expect "$U1@$B1"
show python3 bench/run.py entrypoint -n 20 --expect "$U1,$U0"
