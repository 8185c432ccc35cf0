"""gpupin's promises on a real GPU host with its own Docker Engine, checked from outside: exit codes, the engine's
inspect, NVML, the agent's API. The project's image (GPUPIN_TEST_GPU_IMAGE, default gpupin:test: the Dockerfile on
any base with Python) runs pinned through CDI, and through the nvidia runtime where the engine has it.

Skipped without a real GPU, without an engine at DOCKER_HOST, or without the image (each says which);
GPUPIN_TEST_REQUIRE_GPU_DOCKER=1 makes a missing engine or image a failure. tests/gpu/engine.sh starts an engine of
the tier's own on a host that has none (docs/testing.md, The gpu tier); bench/records/real-gpu.md records a run.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
import uuid as uuidlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.host import HOSTAGENT, real_gpu_count
from tests.support.resident import Resident
from tests.support.wait import wait_for

pytestmark = pytest.mark.gpu
IMAGE = os.environ.get("GPUPIN_TEST_GPU_IMAGE", "gpupin:test")
DOCKER = shutil.which("docker") or "docker"
# A process that opens a CUDA context on its one card and keeps it, without torch: NVML lists it as a compute
# process (the holder the ledger must attribute to its container). It says "ready" once the context is there.
CONTEXT = (
    "import ctypes, time\n"
    "cu = ctypes.CDLL('libcuda.so.1'); d = ctypes.c_int(); c = ctypes.c_void_p()\n"
    "assert cu.cuInit(0) == 0 and cu.cuDeviceGet(ctypes.byref(d), 0) == 0\n"
    "assert cu.cuCtxCreate_v2(ctypes.byref(c), 0, d) == 0\n"
    "print('ready', flush=True); time.sleep(600)\n"
)
# Matrix products on the card until stopped: a holder at 100% utilization.
COMPUTE = (
    "import torch, time\n"
    "x = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\n"
    "print('ready', flush=True)\n"
    "end = time.time() + float(__import__('sys').argv[1])\n"
    "while time.time() < end:\n    y = x @ x; torch.cuda.synchronize()\n"
)


# A rehearsal of the tier's logic on the simulated host and a CDI sandbox (GPUPIN_TEST_GPU_REHEARSE=1 with the
# Makefile's SIMHOST variables): what needs real hardware (torch, a real CUDA context, energy) skips or fails there.
REHEARSE = os.environ.get("GPUPIN_TEST_GPU_REHEARSE") == "1"


def real_env(**extra: str) -> dict[str, str]:
    """The host's own environment: none of the simulated host's variables (kept in a rehearsal)."""
    if REHEARSE:
        return {**os.environ, **extra}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDA_", "GPUPIN_", "FAKEGPU_", "DOCKER_RESOURCE_"))
        and k not in ("LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES")
    }
    env.update(extra)
    return env


def sh(*argv: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), env=real_env(**env), capture_output=True, text=True, timeout=timeout)


def docker(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return sh(DOCKER, *argv, timeout=timeout)


def hostagent(*argv: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return sh(HOSTAGENT, *argv, timeout=timeout, **env)


class Host:
    """The real host's cards (NVML order) and its engine's facts."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.cards = [
                (str(pynvml.nvmlDeviceGetUUID(h)), str(pynvml.nvmlDeviceGetPciInfo(h).busId).upper()) for h in handles
            ]
        finally:
            pynvml.nvmlShutdown()
        info = json.loads(docker("info", "--format", "{{json .}}").stdout)
        self.runtimes = set(info.get("Runtimes") or {})
        self.cgroup = "v2" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "v1"
        self.engine = f"{info.get('ServerVersion')} ({info.get('Driver')}, cgroup {info.get('CgroupVersion')})"
        torch = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", IMAGE, "-c", "import torch")
        self.torch = torch.returncode == 0

    def vias(self) -> list[str]:
        return ["cdi", *(["nvidia"] if "nvidia" in self.runtimes else [])]


def _unavailable() -> str | None:
    if real_gpu_count() == 0 and not REHEARSE:
        return "needs a real NVIDIA GPU"
    if shutil.which(DOCKER) is None:
        return "needs the docker CLI on PATH (tests/gpu/engine.sh: an engine of the tier's own)"
    if docker("version", timeout=30).returncode != 0:
        return f"no Docker Engine answers at {os.environ.get('DOCKER_HOST', 'the default socket')}"
    if docker("image", "inspect", IMAGE, timeout=30).returncode != 0:
        return f"the image {IMAGE} is not on the engine (docker build -t {IMAGE} .: docs/testing.md, The gpu tier)"
    return None


@pytest.fixture(scope="module")
def host() -> Host:
    why = _unavailable()
    if why:
        if why != "needs a real NVIDIA GPU" and os.environ.get("GPUPIN_TEST_REQUIRE_GPU_DOCKER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    h = Host()
    print(f"engine {h.engine}; host cgroup {h.cgroup}; runtimes {sorted(h.runtimes)}; torch in image: {h.torch}")
    return h


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Container names for a test, all removed after it."""
    made: list[str] = []
    yield made
    if made:
        docker("rm", "-f", *made)


def name(names: list[str]) -> str:
    n = f"gpupin-gpu-{uuidlib.uuid4().hex[:8]}"
    names.append(n)
    return n


def inspect(container: str) -> dict[str, Any]:
    out: list[dict[str, Any]] = json.loads(docker("inspect", container).stdout)
    return out[0]


def wait_ready(container: str, timeout: float = 120) -> None:
    def ready() -> bool:
        logs = docker("logs", container)
        if not inspect(container)["State"]["Running"]:
            raise AssertionError(f"{container} ended: {logs.stdout}{logs.stderr}")
        return "ready" in logs.stdout

    wait_for(ready, timeout, f"{container} to say ready")


def pin_of(via: str, uuid: str) -> list[str]:
    return ["--device", f"nvidia.com/gpu={uuid}"] if via == "cdi" else ["--gpus", f"device={uuid}"]


@pytest.mark.parametrize("via", ["cdi", "nvidia"])
def test_run_pins_and_the_entrypoint_proves_the_card_inside(host: Host, names: list[str], via: str) -> None:
    if via not in host.vias():
        pytest.skip(f"the engine has no nvidia runtime (runtimes: {sorted(host.runtimes)})")
    uuid, bus = host.cards[-1]
    if via == "cdi":  # asked nothing, hostagent picks CDI on an engine that serves nvidia.com/gpu by CDI
        dry = hostagent("run", "--dry-run", "--uuid", uuid, IMAGE)
        assert dry.returncode == 0 and f"--device nvidia.com/gpu={uuid}" in dry.stdout, dry
    n = name(names)
    r = hostagent("run", "--via", via, "--name", n, "--uuid", uuid, IMAGE)
    print(r.stdout + r.stderr)
    assert r.returncode == 0, r.stderr
    assert f"cuda:0 = {uuid} at {bus}" in r.stdout and "as expected" in r.stdout, r.stdout
    c = inspect(n)
    env = dict(e.split("=", 1) for e in c["Config"]["Env"])
    assert uuid in env["GPUPIN_EXPECT"], env
    requests = c["HostConfig"]["DeviceRequests"] or []
    if via == "cdi":
        assert [r["Driver"] for r in requests] == ["cdi"] and requests[0]["DeviceIDs"] == [f"nvidia.com/gpu={uuid}"]
    else:
        assert [r["DeviceIDs"] for r in requests] == [[uuid]], requests
    if REHEARSE:  # the simulated host's containers have no nvidia-smi
        return
    # and the container sees that card alone (nvidia-smi, bound in by CDI or the runtime)
    seen = docker("run", "--rm", "--network", "none", *pin_of(via, uuid), "--entrypoint", "nvidia-smi", IMAGE, "-L")
    assert seen.returncode == 0 and seen.stdout.count("UUID: GPU-") == 1 and uuid in seen.stdout, seen


def test_torch_runs_on_the_pinned_card(host: Host) -> None:
    if not host.torch:
        pytest.skip(f"no torch in {IMAGE}")
    uuid, _ = host.cards[-1]
    code = (
        "import torch; p = torch.cuda.get_device_properties(0); x = torch.ones(64, device='cuda'); "
        "print('torch', p.uuid, int(x.sum()))"
    )
    r = hostagent("run", "--rm", "--uuid", uuid, "-e", "GPUPIN_VERIFY=torch", IMAGE, "python3", "-c", code)
    print(r.stdout + r.stderr)
    assert r.returncode == 0 and f"torch {uuid[4:]} 64" in r.stdout, r


def test_a_second_run_on_a_held_card_is_75(host: Host, names: list[str]) -> None:
    uuid, _ = host.cards[-1]
    holder = name(names)
    r = hostagent("run", "-d", "--name", holder, "--uuid", uuid, IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    second = name(names)
    r = hostagent("run", "--rm", "--name", second, "--uuid", uuid, IMAGE, "echo", "WORKLOAD-STARTED")
    print(r.stderr)
    errors = [line for line in r.stderr.splitlines() if "ERROR:" in line]
    assert r.returncode == 75 and len(errors) == 1 and holder in errors[0], r
    assert "WORKLOAD-STARTED" not in r.stdout and docker("inspect", second).returncode != 0  # nothing created


def test_a_wrong_expectation_is_78_before_the_workload(host: Host) -> None:
    uuid, _ = host.cards[-1]
    via = host.vias()[0]
    for expect in (f"{uuid}@00000000:FF:1F.0", "GPU-00000000-0000-0000-0000-000000000000"):
        r = docker(
            "run", "--rm", "--network", "none", *pin_of(via, uuid), "-e", f"GPUPIN_EXPECT={expect}", IMAGE,
            "sh", "-c", "echo WORKLOAD-STARTED",
        )  # fmt: skip
        print(r.stderr)
        assert r.returncode == 78 and "WORKLOAD-STARTED" not in r.stdout, r
        assert "ERROR:" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("cgroup", ["v1", "v2"])
def test_the_containers_process_is_attributed_by_its_cgroup(host: Host, names: list[str], cgroup: str) -> None:
    if cgroup != host.cgroup:
        pytest.skip(f"this host's cgroups are {host.cgroup}")
    uuid, _ = host.cards[-1]
    n = name(names)
    r = hostagent("run", "-d", "--name", n, "--uuid", uuid, IMAGE, "python3", "-c", CONTEXT)
    assert r.returncode == 0, r.stderr
    wait_ready(n)
    cid = inspect(n)["Id"]
    ls = hostagent("ls", "--json")
    assert ls.returncode == 0, ls.stderr
    card = next(g for g in json.loads(ls.stdout)["gpus"] if g["uuid"] == uuid)
    procs = [p for p in card["processes"] if p["type"] in ("C", "C+G")]
    print(json.dumps({"state": card["state"], "holders": [h["id"][:12] for h in card["holders"]], "procs": procs}))
    assert [h["id"] for h in card["holders"]] == [cid]
    assert len(procs) == 1 and procs[0]["container_id"] == cid and not procs[0]["foreign"], procs
    assert card["state"] == "held", card["state"]  # its own holder's process: held, not busy
    # what the ledger read: the process's cgroup names the container (v2: one line "0::/...ID...")
    lines = Path(f"/proc/{procs[0]['pid']}/cgroup").read_text().splitlines()
    assert any(cid in line for line in lines), lines
    assert (lines[0].startswith("0::/") and len(lines) == 1) == (cgroup == "v2"), lines


def resident(tmp_path: Path, policy: str) -> Resident:
    """An agent of the test's own: its record and its policy in tmp_path."""
    (tmp_path / "policy.toml").write_text(policy)
    return Resident(real_env(), "--policy", str(tmp_path / "policy.toml"), "--record", str(tmp_path / "record.db"))


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Resident]:
    a = resident(tmp_path, "")
    yield a
    a.stop()


@pytest.fixture
def idle_agent(tmp_path: Path) -> Iterator[Resident]:
    """With an idle rule that stops: 20 s at 0% with no compute process, then 5 s of grace."""
    a = resident(tmp_path, '[idle]\nafter = "20s"\naction = "stop"\ngrace = "5s"\n')
    yield a
    a.stop()


def running(container: str) -> bool:
    return bool(inspect(container)["State"]["Running"])


def test_idle_stop_spares_a_computing_holder(host: Host, names: list[str], idle_agent: Resident) -> None:
    agent = idle_agent
    if not host.torch:
        pytest.skip(f"no torch in {IMAGE}: nothing to compute with")
    uuid, _ = host.cards[-1]
    busy = name(names)
    r = hostagent("run", "-d", "--name", busy, "--uuid", uuid, IMAGE, "python3", "-c", COMPUTE, "45")
    assert r.returncode == 0, r.stderr
    wait_ready(busy)
    time.sleep(32)  # past after + grace, computing all along
    card = agent.card(uuid)
    print("computing:", {k: card[k] for k in ("utilization_gpu", "idle", "idle_seconds", "state")})
    assert running(busy) and card["idle"] is False, card
    docker("rm", "-f", busy)
    idle = name(names)
    r = hostagent("run", "-d", "--name", idle, "--uuid", uuid, IMAGE, "sleep", "600")
    assert r.returncode == 0, r.stderr
    started = time.monotonic()
    wait_for(lambda: not running(idle), 90, "the idle holder to be stopped")
    print(f"idle holder stopped after {time.monotonic() - started:.0f} s (rule: 20 s idle, 5 s grace)")


def test_for_ends_the_booking_and_the_agent_stops_the_container(host: Host, names: list[str], agent: Resident) -> None:
    uuid, _ = host.cards[-1]
    n = name(names)
    r = hostagent("run", "-d", "--for", "15s", "--name", n, "--uuid", uuid, IMAGE, "sleep", "600",
                  GPUPIN_AGENT_SOCKET=agent.socket)  # fmt: skip
    assert r.returncode == 0, r.stderr
    label = inspect(n)["Config"]["Labels"].get("gpupin.booking", "")
    assert "until=" in label, label
    holder = agent.card(uuid)["holders"][0]
    assert holder["booking"] and 0 < holder["booking"]["left_s"] <= 15, holder
    started = time.monotonic()
    wait_for(lambda: not running(n), 60, "the agent to stop the container at its booking's end")
    took = time.monotonic() - started
    # `docker stop`'s 10 s grace: the workload (sleep, PID 1) ignores SIGTERM and is killed at its end
    print(f"stopped {took:.1f} s after create (booked 15 s; docker stop's grace 10 s)")
    assert took > 10


def test_the_record_holds_the_energy_the_card_drew(host: Host, names: list[str], agent: Resident) -> None:
    if not host.torch:
        pytest.skip(f"no torch in {IMAGE}: nothing to draw energy with")
    import pynvml

    uuid, _ = host.cards[-1]
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        before = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # mJ
        n = name(names)
        r = hostagent("run", "-d", "--name", n, "--uuid", uuid, IMAGE, "python3", "-c", COMPUTE, "20")
        assert r.returncode == 0, r.stderr
        cid = inspect(n)["Id"]
        wait_for(lambda: not running(n), 120, "the workload to end")
        after = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    finally:
        pynvml.nvmlShutdown()
    db = str(agent.dir / "record.db")

    def closed() -> tuple[float, float, float] | None:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            row = conn.execute(
                "SELECT energy_j, start, end FROM intervals WHERE container_id = ? AND end IS NOT NULL", (cid,)
            ).fetchone()
        return tuple(row) if row else None

    wait_for(closed, 60, "the interval to be closed in the record")
    energy, start, end = closed() or (0.0, 0.0, 0.0)
    drawn = (after - before) / 1000
    print(f"record: {energy / 1000:.1f} kJ over {end - start:.0f} s; NVML's counter: {drawn / 1000:.1f} kJ meanwhile")
    assert energy > 0 and energy <= drawn * 1.05, (energy, drawn)
    assert energy >= drawn * 0.5, (energy, drawn)  # the holder's interval is most of the counter's growth
    usage = hostagent("usage", "--record", db, "--by", "card")
    print(usage.stdout)
    assert usage.returncode == 0, usage


def test_watch_on_a_lost_card(host: Host) -> None:
    # A card is lost only by taking it from its driver (unbinding it, a reset, a fault): nothing a test may do to a
    # host it shares or borrows. The simulated host loses cards on purpose (tests/docker/test_entrypoint_watch*.py).
    pytest.skip("losing a real card needs unbinding or resetting it, which this tier never does to a host")
