#!/usr/bin/env bash
# Real-GPU session 2 (hardened entrypoint, Slurm reader, hostagent run/ls without Docker) on a host with two
# NVIDIA GPUs and no Docker. Run from the repository root with the wheels in .whl/ (`make wheels`, then the
# docker SDK's: `pip download --no-deps docker==7.1.0 requests urllib3 idna charset-normalizer certifi -d .whl`):
#   bash bench/records/real_gpu_session_2.sh 2>&1 | tee real-gpu-2.log
. "$(dirname "$0")/host.sh"   # set -u, the wheels installed, show, U0/B0 U1/B1

show nvidia-smi --query-gpu=index,uuid,pci.bus_id,name,driver_version --format=csv
python3 -c 'import pynvml as n; n.nvmlInit(); [print("minor", n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetHandleByIndex(i)), n.nvmlDeviceGetUUID(n.nvmlDeviceGetHandleByIndex(i))) for i in range(n.nvmlDeviceGetCount())]'

echo; echo "### 1. aligned, reversed, misaligned (the hardened entrypoint)"
show env GPUPIN_EXPECT="$U1@$B1" gpupin-entrypoint python3 -m gpupin.entrypoint
show env GPUPIN_EXPECT="$U1,$U0" gpupin-entrypoint python3 -m gpupin.entrypoint
show env GPUPIN_EXPECT="$U0@$B1" gpupin-entrypoint sh -c 'echo WORKLOAD-STARTED'

echo; echo "### 2. Slurm: SLURM_STEP_GPUS as minor numbers, in CUDA_VISIBLE_DEVICES' order"
mapfile -t MINORS < <(python3 -c 'import pynvml as n; n.nvmlInit(); [print(n.nvmlDeviceGetMinorNumber(n.nvmlDeviceGetHandleByIndex(i))) for i in range(n.nvmlDeviceGetCount())]')
M0=${MINORS[0]} M1=${MINORS[1]}
show env SLURM_STEP_GPUS="$M0,$M1" CUDA_VISIBLE_DEVICES="$M1,$M0" SLURM_LOCALID=0 gpupin-entrypoint python3 -m gpupin.entrypoint
show env SLURM_STEP_GPUS="$M1" CUDA_VISIBLE_DEVICES="$M0" SLURM_LOCALID=1 gpupin-entrypoint sh -c 'echo WORKLOAD-STARTED'

echo; echo "### 3. a hostile PYTHONPATH (pynvml.py, json.py, subprocess.py, entrypoint.py that exit) does not reach it"
mkdir -p /tmp/hostile && for m in pynvml json subprocess entrypoint; do echo "raise SystemExit('hostile $m')" >/tmp/hostile/$m.py; done
show env PYTHONPATH=/tmp/hostile:/tmp/site GPUPIN_EXPECT="$U0@$B0" gpupin-entrypoint sh -c 'echo WORKLOAD-STARTED'

echo; echo "### 4. SIGTERM while the CUDA probe runs (two cards: cuInit ~0.4 s)"
for delay in 0.10 0.20 0.30; do
  env GPUPIN_EXPECT="$U0,$U1" gpupin-entrypoint sh -c 'echo WORKLOAD-STARTED' & pid=$!
  sleep "$delay"; t0=$(date +%s%N); kill -TERM "$pid"; wait "$pid"; rc=$?; t1=$(date +%s%N)
  echo "SIGTERM after ${delay}s: exit $rc, $(( (t1 - t0) / 1000000 )) ms from the signal to the exit"
done

echo; echo "### 5. start-up against its floor (bench/run.py entrypoint, medians of interleaved runs)"
show python3 bench/run.py entrypoint -n 20 --expect "$U1@$B1"
show python3 bench/run.py entrypoint -n 20 --expect "$U1,$U0"

echo; echo "### 6. hostagent on a host without Docker: ls, run's dry run (CDI or nvidia form), completion's GPU specs"
show hostagent ls
show hostagent ls --json
show hostagent run --dry-run --gpu 1 --gpu-capabilities compute,utility --rm my-train:latest python3 train.py --lr 3
show hostagent run --dry-run --json --gpu "$U0" -p 8080:80 --shm-size 8g my-train:latest
show hostagent __complete gpus
show hostagent run --gpu 1 my-train:latest

echo; echo "### 7. the real-GPU tests"
show python3 -m pytest -q -p no:cacheprovider -m gpu -rs tests/gpu/test_real_gpu.py
