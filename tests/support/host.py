"""The simulated GPU host: the checkout's paths, the environment a process there gets (the fake driver libraries,
a scenario's cards), the CLIs run there, and whether this run requires the daemons and clusters (CI)."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.scenarios import scenario, topology

REPO = Path(__file__).resolve().parent.parent.parent
BIN = REPO / ".venv" / "bin"  # the console scripts of the editable install
HOSTAGENT = str(BIN / "hostagent")
ENTRYPOINT = str(BIN / "gpupin-entrypoint")
FAKEGPU = REPO / "build" / "fakegpu"


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").lower() not in ("", "0", "false", "no")


def required() -> bool:
    """Whether the sandboxed daemons and the test clusters must be there (CI=true, or GPUPIN_TEST_REQUIRE_DOCKER=1
    as `make test` sets): then a missing one fails its tests instead of skipping them, so that a broken setup never
    passes as "all skipped"."""
    return _truthy("CI") or _truthy("GPUPIN_TEST_REQUIRE_DOCKER")


def idle_topology(name: str = "mixed-4") -> str:
    """The scenario with no process on any card and each card's readings idle (written under build/), for the tests
    of the ledger and its lock that need every card free: a process is a holder (gpupin.hostagent.ledger.processes),
    and mixed-4 runs pid 4242 on card 2 (40962 MiB, 87%: without the process, use NVML names no one for, busy too).
    The sandbox's hook keeps the scenario itself: the cards are the same."""
    topo = topology(name)
    for g in topo["gpus"]:
        g.pop("processes", None)
        g.update(memory_used_mib=0, utilization_gpu=0)
    path = REPO / "build" / "test-topologies" / f"{name}-idle.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(topo)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)  # whole, for a test running beside this one
    return str(path)


@functools.cache
def lock_dir() -> str:
    """The folder of the ledger's local locks (GPUPIN_LOCK_DIR) for this pytest process, removed when it exits:
    root's default is the host's own /run/gpupin, which the tests leave as they found it."""
    folder = tempfile.mkdtemp(prefix="gpupin-locks-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


@functools.cache
def record_path() -> str:
    """The record (GPUPIN_RECORD) of an agent a test starts without --record, for this pytest process: in a private
    folder of its own, removed when it exits. Root's default, /var/lib/gpupin, is the host's."""
    folder = tempfile.mkdtemp(prefix="gpupin-record-")
    atexit.register(shutil.rmtree, folder, True)
    return os.path.join(folder, "record.db")


def simhost_env(name: str = "mixed-4", **extra: str) -> dict[str, str]:
    """The environment of a process on the simulated host: the fake libraries, the topology, the test run's lock
    folder and record, nothing CUDA."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "GPUPIN_", "NVIDIA_", "DOCKER_RESOURCE_"))}
    env["GPUPIN_LOCK_DIR"] = lock_dir()
    env["GPUPIN_RECORD"] = record_path()
    env["LD_LIBRARY_PATH"] = str(FAKEGPU / "lib")
    env["FAKEGPU_TOPOLOGY"] = str(scenario(name))
    env.update(extra)
    return env


def hostagent(
    *args: str, scenario_name: str = "mixed-4", timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """The hostagent CLI on the simulated host with that scenario's cards (`env` added to its environment)."""
    return subprocess.run(
        [HOSTAGENT, *args], env=simhost_env(scenario_name, **env), capture_output=True, text=True, timeout=timeout
    )


def doctor_on(root: Path, docker_host: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`hostagent doctor` on the simulated host's mixed-4, with `root` as the host's root and that daemon."""
    return subprocess.run(
        [HOSTAGENT, "doctor", "--root", str(root), *args],
        env=simhost_env("mixed-4", DOCKER_HOST=docker_host, **env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def saw(out: str) -> list[str]:
    """The UUIDs the workload saw at cuda:0, cuda:1, ... (from `python3 -m gpupin.entrypoint`)."""
    return re.findall(r"^cuda:\d+ = (\S+) at .*, as expected$", out, re.M)


def real_gpu_count() -> int:
    """Cards on a real NVIDIA host, as its own driver lists them (0 here: the fakes are never on the default library
    path, and are taken off it here when `make test` put them there)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH" and not k.startswith("FAKEGPU_")}
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def children_of(pid: int) -> list[int]:
    """The pids of the process's children (from /proc): a probe it started, say."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out
