"""Record what each reading `gpupin-entrypoint --watch` could make per check costs on a real host: CPU and wall time.

Run on a host with NVIDIA GPUs:  python3 bench/records/watch_costs.py > watch-costs.jsonl
(watch-costs-H200-2026-12-01.jsonl: one H200, driver 580.159.04, persistence mode on)
It decides which readings the watcher can afford at a 5 s interval within 0.1% of a core (5 ms of CPU per check).
"""

from __future__ import annotations

import contextlib
import json
import os
import time

import pynvml as nv


def cost(what: str, call: object, n: int) -> None:
    assert callable(call)
    call()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        call()
    c1, w1 = time.process_time(), time.perf_counter()
    print(
        json.dumps(
            {"what": what, "n": n, "cpu_us": round((c1 - c0) / n * 1e6, 1), "wall_us": round((w1 - w0) / n * 1e6, 1)}
        ),
        flush=True,
    )


def main() -> None:
    t0 = time.perf_counter()
    nv.nvmlInit()
    print(
        json.dumps(
            {
                "first nvmlInit_ms": round((time.perf_counter() - t0) * 1000, 2),
                "driver": nv.nvmlSystemGetDriverVersion(),
            }
        )
    )
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    uuid = nv.nvmlDeviceGetUUID(handle)
    print(json.dumps({"persistence_mode": nv.nvmlDeviceGetPersistenceMode(handle)}))
    cost("handle by UUID + PCI info", lambda: nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByUUID(uuid)), 2000)
    eset = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, eset)

    def wait0() -> None:
        with contextlib.suppress(nv.NVMLError_Timeout):
            nv.nvmlEventSetWait_v2(eset, 0)

    cost("event set wait, 0 ms", wait0, 2000)
    cost(
        "volatile uncorrected ECC + remapped rows",
        lambda: (nv.nvmlDeviceGetTotalEccErrors(handle, 1, 0), nv.nvmlDeviceGetRemappedRows(handle)),
        2000,
    )
    for node in ("/dev/nvidiactl", "/dev/nvidia0"):
        if os.path.exists(node):
            cost(f"open+close {node}", lambda n=node: os.close(os.open(n, os.O_RDWR | os.O_CLOEXEC)), 2000)
    cost("nvmlInit + nvmlShutdown, refcount 1 -> 2 -> 1", lambda: (nv.nvmlInit(), nv.nvmlShutdown()), 500)
    nv.nvmlEventSetFree(eset)
    nv.nvmlShutdown()
    cost(
        "nvmlInit + nvmlShutdown from zero (no other client in this process)",
        lambda: (nv.nvmlInit(), nv.nvmlShutdown()),
        50,
    )

    def init_register() -> None:
        nv.nvmlInit()
        s = nv.nvmlEventSetCreate()
        nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByUUID(uuid), nv.nvmlEventTypeXidCriticalError, s)
        nv.nvmlEventSetFree(s)
        nv.nvmlShutdown()

    cost("nvmlInit from zero + event set + register + free + shutdown", init_register, 50)


if __name__ == "__main__":
    main()
