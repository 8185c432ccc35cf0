"""A torch workload for the --watch overhead measurement: bf16 8192x8192 matmuls on cuda:0 for SECONDS after a
warm-up, printing TFLOP/s. Run bare and under `gpupin-entrypoint --watch 5`, alternately
(real_gpu_session_5.sh)."""

import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
n = 8192
a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda:0")
b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda:0")
for _ in range(20):
    a @ b
torch.cuda.synchronize()
done = 0
start = time.perf_counter()
while time.perf_counter() - start < seconds:
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()
    done += 50
elapsed = time.perf_counter() - start
print(f"{2 * n**3 * done / elapsed / 1e12:.1f}")
