"""`make bench`'s watch part: what `gpupin-entrypoint --watch` costs; how soon it sees a loss.

  cpu      the watcher (the entrypoint, staying as the workload's parent) over a window of a sleeping workload:
           its CPU time, read from the kernel (/proc/PID/task/*/schedstat, nanoseconds), as a share of one core.
           Target: at most 0.1% at a 5 s interval.
  latency  on the simulated host only (the fake NVML's fault file, FAKEGPU_FAULTS): a fault planted under the
           running workload at a random moment of the interval (a lost card, XID 79, an uncorrectable ECC error, in
           turn), until the entrypoint's loss line. Target: at most the interval + 1 s, for the slowest trial.

The CPU window starts once the workload runs (the verification is `bench entrypoint`'s), so it holds only checks
and the wait between them.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BIN = Path(sys.executable).parent
FAULTS: tuple[dict[str, object], ...] = ({"lost": True}, {"xid": [79]}, {"ecc": {"volatile_uncorrected": 1}})


def _entrypoint() -> str:
    return shutil.which("gpupin-entrypoint") or str(BIN / "gpupin-entrypoint")


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid` so far, in nanoseconds (schedstat's first field)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        total += int((task / "schedstat").read_text().split()[0])
    return total


def _workload_started(pid: int, timeout: float = 120) -> None:
    """Wait until the entrypoint has its child: the verification is over and the watch has begun."""
    deadline = time.monotonic() + timeout
    while not Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        if time.monotonic() > deadline:
            raise SystemExit("bench: the watched workload never started")
        time.sleep(0.01)


def _start(interval: float, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [_entrypoint(), "--verify", "nvml", "--watch", f"{interval:g}", "sleep", "100000"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def bench_cpu(interval: float, seconds: float, env: dict[str, str], results: dict[str, object]) -> None:
    p = _start(interval, env)
    try:
        _workload_started(p.pid)
        c0, t0 = _cpu_ns(p.pid), time.monotonic()
        time.sleep(seconds)  # the measured window itself
        c1, t1 = _cpu_ns(p.pid), time.monotonic()
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=60)
    share = (c1 - c0) / 1e9 / (t1 - t0) * 100
    checks = int((t1 - t0) // interval)
    met = share <= 0.1
    print(
        f"{'entrypoint --watch ' + format(interval, 'g') + ': CPU of the watcher':<44} {share:8.4f}% of a core "
        f"over {t1 - t0:.0f} s ({checks} checks, {(c1 - c0) / 1e6:.1f} ms of CPU)   (target <= 0.1%) "
        f"{'ok' if met else 'MISSED'}",
        flush=True,
    )
    results[f"entrypoint --watch {interval:g}: CPU of the watcher"] = {
        "cpu_percent": round(share, 5),
        "cpu_ms": round((c1 - c0) / 1e6, 2),
        "window_s": round(t1 - t0, 1),
        "checks": checks,
        "target_percent": 0.1,
        "met": met,
    }


def _trial(interval: float, env: dict[str, str], folder: Path, fault: dict[str, object], uuid: str) -> float:
    path = folder / "faults.json"
    path.unlink(missing_ok=True)
    p = _start(interval, {**env, "FAKEGPU_FAULTS": str(path), "GPUPIN_WATCH_GRACE": "1"})
    reported: list[float] = []

    def read() -> None:
        assert p.stderr is not None
        for line in p.stderr:
            if "a pinned card was lost" in line:
                reported.append(time.monotonic())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _workload_started(p.pid)
        time.sleep(random.uniform(0, interval))  # a random moment of the interval
        tmp = folder / ".faults.json.tmp"
        tmp.write_text(json.dumps({"cards": {uuid: fault}}))
        os.replace(tmp, path)
        planted = time.monotonic()
        code = p.wait(timeout=interval + 60)
        reader.join(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if code != 79 or not reported:
        raise SystemExit(f"bench: the watcher did not report {fault} (exit {code})")
    return reported[0] - planted


def bench_latency(interval: float, trials: int, env: dict[str, str], uuid: str, results: dict[str, object]) -> None:
    with tempfile.TemporaryDirectory(prefix="gpupin-bench-watch-") as folder:
        delays = [_trial(interval, env, Path(folder), FAULTS[i % len(FAULTS)], uuid) for i in range(trials)]
    worst = max(delays)
    met = worst <= interval + 1
    print(
        f"{'entrypoint --watch ' + format(interval, 'g') + ': loss detected after':<44} {worst:8.2f} s at most, "
        f"median {sorted(delays)[len(delays) // 2]:.2f} s ({trials} trials)   (target <= {interval + 1:g} s) "
        f"{'ok' if met else 'MISSED'}",
        flush=True,
    )
    results[f"entrypoint --watch {interval:g}: loss detection"] = {
        "max_s": round(worst, 3),
        "delays_s": [round(d, 3) for d in delays],
        "target_s": interval + 1,
        "met": met,
    }


def bench_watch(results: dict[str, object], expect: str | None, interval: float, seconds: float, trials: int) -> None:
    env = {**os.environ, "GPUPIN_QUIET": "1"}
    if expect:
        env["GPUPIN_EXPECT"] = expect
    bench_cpu(interval, seconds, env, results)
    if os.environ.get("FAKEGPU_TOPOLOGY") and expect:
        bench_latency(interval, trials, env, expect.split(",")[0].split("@")[0], results)
