"""Does `hostagent run`'s SDK import hide behind NVML's reads? Up to the ledger lock, run needs the cards (NVML) and
a docker client (the SDK's import, then /_ping). Measured here in fresh processes, interleaved, medians:

  nvml     the cards alone (pynvml's import, nvmlInit, the queries)
  sdk      the client alone (the SDK's import and a /_ping to an address where no daemon listens)
  serial   the cards, then the client: what run does
  overlap  the client on a thread of its own while the cards are read: a variant of run, tried and not kept

Run on a real host (`python3 bench/records/overlap_probe.py [N]`); DOCKER_HOST is pointed at a socket that does not
exist, so the ping fails at once and the figure is the import's.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

CASES = {
    "nvml": "from gpupin.entrypoint import nvml; nvml.list_cards(detail=False, mig=True, tolerate_lost=True)",
    "sdk": "from gpupin.hostagent import engine\ntry: engine.connect()\nexcept Exception: pass",
    "serial": "from gpupin.entrypoint import nvml; from gpupin.hostagent import engine\n"
    "nvml.list_cards(detail=False, mig=True, tolerate_lost=True)\n"
    "try: engine.connect()\nexcept Exception: pass",
    "overlap": "import threading; from gpupin.entrypoint import nvml; from gpupin.hostagent import engine\n"
    "def connect():\n"
    "    try: engine.connect()\n"
    "    except Exception: pass\n"
    "th = threading.Thread(target=connect, daemon=True); th.start()\n"
    "nvml.list_cards(detail=False, mig=True, tolerate_lost=True)\n"
    "th.join()",
}
TIMED = "import time\nt = time.perf_counter()\n{body}\nprint((time.perf_counter() - t) * 1000)"


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 15
    env = dict(os.environ, DOCKER_HOST="unix:///nonexistent/gpupin-probe.sock")
    times: dict[str, list[float]] = {k: [] for k in CASES}
    for _ in range(n):
        for name, body in CASES.items():
            out = subprocess.run(
                [sys.executable, "-c", TIMED.format(body=body)], env=env, capture_output=True, text=True, check=True
            ).stdout
            times[name].append(float(out.strip().splitlines()[-1]))
    print(f"{os.cpu_count()} CPU(s), python {sys.version.split()[0]}, medians of {n} interleaved fresh processes:")
    for name, v in times.items():
        print(f"  {name:8s} {statistics.median(v):7.1f} ms")
    saved = statistics.median(times["serial"]) - statistics.median(times["overlap"])
    print(f"  overlap saves {saved:.1f} ms of serial")
    return 0


if __name__ == "__main__":
    sys.exit(main())
