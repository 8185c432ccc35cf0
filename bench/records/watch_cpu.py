"""Runs a command under `gpupin-entrypoint --watch INTERVAL` and reports the supervising entrypoint's own CPU time
(utime + stime from /proc, read each 0.2 s until it exits; its children's time is not in it) and the command's
output: the watcher's cost on a real host (real_gpu_session_5.sh). The total includes the verification before the
workload starts; `steady` is the CPU from SETTLE seconds on (the watcher alone) over that time."""

import os
import subprocess
import sys
import time

SETTLE = 3.0
interval, cmd = sys.argv[1], sys.argv[2:]
tick = os.sysconf("SC_CLK_TCK")
t0 = time.monotonic()
p = subprocess.Popen(["gpupin-entrypoint", "--quiet", "--watch", interval, *cmd], stdout=subprocess.PIPE, text=True)
cpu = 0.0
settled: tuple[float, float] | None = None  # (time, cpu) once the start-up is over
while p.poll() is None:
    try:
        with open(f"/proc/{p.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    except OSError:
        pass
    if settled is None and time.monotonic() - t0 >= SETTLE:
        settled = (time.monotonic(), cpu)
    time.sleep(0.2)
out = p.stdout.read().strip() if p.stdout else ""
end = time.monotonic()
wall = end - t0
steady = ""
if settled is not None:
    span = end - settled[0]
    used = cpu - settled[1]
    steady = f" steady_cpu_s={used:.3f} over {span:.1f} s = {100 * used / span:.4f}% of a core"
print(f"watched {out} rc={p.returncode} entrypoint_cpu_s={cpu:.3f} wall_s={wall:.1f}{steady}")
