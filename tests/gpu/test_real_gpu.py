"""The entrypoint against real NVML, the real CUDA driver and torch: skipped on machines without NVIDIA GPUs.

What only a real host can show: that the driver's own enumeration under the environment the entrypoint sets is
what NVML says, and that the refusals fire against real data. bench/records/real-gpu.md records a run of these.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.support.host import REPO, children_of, real_gpu_count
from tests.support.wait import wait_for

pytestmark = pytest.mark.gpu
CARDS = real_gpu_count()


def need(n: int) -> None:
    if n > CARDS:
        pytest.skip(f"needs {n} real NVIDIA GPU(s); this machine has {CARDS}")


def real_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CUDA_", "GPUPIN_", "FAKEGPU_", "DOCKER_RESOURCE_"))
        and k not in ("LD_LIBRARY_PATH", "NVIDIA_VISIBLE_DEVICES")
    }
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def cards() -> list[tuple[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        env=real_env(),
    ).stdout
    return [tuple(x.strip() for x in line.split(",")) for line in out.splitlines() if line.strip()]  # type: ignore[misc]


def entrypoint(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpupin.entrypoint.cli", *args],
        env=real_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def saw(out: str) -> list[str]:
    return [line.split()[2] for line in out.splitlines() if line.startswith("cuda:") and "as expected" in line]


def test_each_card_aligned_execs_and_the_workload_sees_it() -> None:
    need(1)
    for uuid, bus in cards():
        r = entrypoint(sys.executable, "-m", "gpupin.entrypoint", GPUPIN_EXPECT=f"{uuid}@{bus}")
        assert r.returncode == 0, r.stderr
        assert saw(r.stdout) == [uuid]


def test_uuid_of_one_card_with_the_bus_of_the_other_is_refused() -> None:
    need(2)
    (u0, _b0), (_u1, b1) = cards()[:2]
    r = entrypoint("sh", "-c", "echo WORKLOAD-STARTED", GPUPIN_EXPECT=f"{u0}@{b1}")
    assert r.returncode == 78, r.stderr
    assert "WORKLOAD-STARTED" not in r.stdout


def test_reversed_pair_gives_1_0_and_cuda0_is_the_first_expected() -> None:
    need(2)
    (u0, b0), (u1, b1) = cards()[:2]
    r = entrypoint(sys.executable, "-m", "gpupin.entrypoint", GPUPIN_EXPECT=f"{u1}@{b1},{u0}@{b0}")
    assert r.returncode == 0, r.stderr
    assert "CUDA_VISIBLE_DEVICES=1,0" in r.stderr
    assert saw(r.stdout) == [u1, u0]


def test_torch_level_when_torch_is_there() -> None:
    need(1)
    pytest.importorskip("torch")
    uuid, bus = cards()[-1]
    code = "import torch; p = torch.cuda.get_device_properties(0); print('torch-uuid', p.uuid)"
    r = entrypoint("--verify", "torch", sys.executable, "-c", code, GPUPIN_EXPECT=f"{uuid}@{bus}")
    assert r.returncode == 0, r.stderr
    assert f"torch-uuid {uuid[4:]}" in r.stdout


def test_assert_pinned_in_a_torch_workload_catches_a_rewritten_cuda_visible_devices() -> None:
    need(2)
    pytest.importorskip("torch")
    u1, b1 = cards()[1]
    code = (
        "import os; os.environ['CUDA_VISIBLE_DEVICES'] = '0'\n"
        "import torch; torch.cuda.init()\n"
        "from gpupin.entrypoint import assert_pinned\n"
        "try:\n    assert_pinned()\n    print('not caught')\n"
        "except Exception as e:\n    print('caught', type(e).__name__, e.exit_code)\n"
    )
    r = entrypoint("--quiet", sys.executable, "-c", code, GPUPIN_EXPECT=f"{u1}@{b1}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "caught MisalignedError 78", r.stdout


def test_require_without_expectation_is_refused() -> None:
    need(1)
    r = entrypoint("--require", "true")
    assert r.returncode == 78
    r = entrypoint("--json")
    assert r.returncode == 0
    data: dict[str, Any] = json.loads(r.stdout)
    assert [d["uuid"] for d in data["devices"]] == [u for u, _ in cards()]


def minors() -> list[tuple[str, int]]:
    """(UUID, minor number) of each card, from the real NVML."""
    import pynvml

    pynvml.nvmlInit()
    try:
        return [
            (str(pynvml.nvmlDeviceGetUUID(h)), int(pynvml.nvmlDeviceGetMinorNumber(h)))
            for h in (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount()))
        ]
    finally:
        pynvml.nvmlShutdown()


def test_slurms_allocation_is_read_through_the_real_minor_numbers() -> None:
    need(2)
    (u0, m0), (u1, m1) = minors()[:2]
    # No gres.conf (a host without Slurm, or a container without the node's): Slurm's number is read as the minor
    # number, as `File=/dev/nvidia[0-N]` makes it. SLURM_CONF keeps a gres.conf this host may have out of it.
    for uuid, minor in ((u0, m0), (u1, m1)):
        r = entrypoint(
            sys.executable,
            "-m",
            "gpupin.entrypoint",
            SLURM_STEP_GPUS=str(minor),
            CUDA_VISIBLE_DEVICES=str(minor),
            SLURM_LOCALID="0",
            SLURM_CONF="/nonexistent/slurm.conf",
        )
        assert r.returncode == 0, r.stderr
        assert saw(r.stdout) == [uuid], r.stdout
        assert f"minor number {minor}" in r.stderr
    # a launcher's reordering within the allocation is followed
    r = entrypoint(
        sys.executable,
        "-m",
        "gpupin.entrypoint",
        SLURM_STEP_GPUS=f"{m0},{m1}",
        CUDA_VISIBLE_DEVICES=f"{m1},{m0}",
        SLURM_LOCALID="0",
        SLURM_CONF="/nonexistent/slurm.conf",
    )
    assert r.returncode == 0 and saw(r.stdout) == [u1, u0], r.stderr
    # a job script that points CUDA_VISIBLE_DEVICES at a card outside the allocation is refused
    r = entrypoint(
        "sh",
        "-c",
        "echo WORKLOAD-STARTED",
        SLURM_STEP_GPUS=str(m1),
        CUDA_VISIBLE_DEVICES=str(m0),
        SLURM_LOCALID="0",
        SLURM_CONF="/nonexistent/slurm.conf",
    )
    assert r.returncode == 78 and "WORKLOAD-STARTED" not in r.stdout, r.stderr


def test_slurms_numbers_through_a_gres_conf_that_lists_the_cards_backwards(tmp_path: Any) -> None:
    # A node whose gres.conf lists the second card first: Slurm's GPU 0 is that card. The device files are the
    # driver's own /dev/nvidiaN, stat'ed for their minor numbers.
    need(2)
    (_, m0), (u1, m1) = minors()[:2]
    (tmp_path / "gres.conf").write_text(f"Name=gpu File=/dev/nvidia{m1}\nName=gpu File=/dev/nvidia{m0}\n")
    r = entrypoint(
        sys.executable,
        "-m",
        "gpupin.entrypoint",
        SLURM_STEP_GPUS="0",
        CUDA_VISIBLE_DEVICES="0",
        SLURM_LOCALID="0",
        SLURM_CONF=str(tmp_path / "slurm.conf"),
    )
    assert r.returncode == 0 and saw(r.stdout) == [u1], r.stderr
    assert f"Slurm's GPU 0 = /dev/nvidia{m1})" in r.stderr and "positions in" in r.stderr


def test_sigterm_during_the_cuda_probe_ends_the_entrypoint_promptly() -> None:
    need(1)
    import signal
    import time

    expect = ",".join(u for u, _ in cards())
    p = subprocess.Popen(
        [sys.executable, "-m", "gpupin.entrypoint.cli", "sh", "-c", "echo WORKLOAD-STARTED"],
        env=real_env(GPUPIN_EXPECT=expect),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(lambda: children_of(p.pid), 60, "the CUDA probe to start", interval=0.005)  # SIGTERM lands in it
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    took = time.monotonic() - sent
    print(f"SIGTERM to exit: {took * 1000:.0f} ms; rc {p.returncode}; {err.strip().splitlines()[-1:]}")
    if p.returncode == 0:
        pytest.skip(f"the probe had already finished when SIGTERM came ({out.strip()})")
    assert p.returncode == 128 + signal.SIGTERM and "WORKLOAD-STARTED" not in out, err
    assert took < 2.0


def test_a_hostile_pythonpath_does_not_reach_the_entrypoint(tmp_path: Any) -> None:
    need(1)
    for name in ("pynvml", "json", "subprocess", "entrypoint"):
        (tmp_path / f"{name}.py").write_text("raise SystemExit('hostile module imported')\n")
    uuid, bus = cards()[0]
    env = real_env(GPUPIN_EXPECT=f"{uuid}@{bus}")
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from gpupin.entrypoint.cli import main; sys.exit(main())",
            "sh",
            "-c",
            "echo WORKLOAD-STARTED",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "WORKLOAD-STARTED" in r.stdout, r.stderr
