"""gpupin-entrypoint against hostile and odd input in a container on each engine's sandbox: the tests of
tests/unit/test_entrypoint_hostile.py that a container adds to, run here again with this tier's fixtures
(tests/docker/conftest.py): the image's wheel install under the workload's modules, the runtime's hook exposing
MIG devices; and what only a container has: the image's user site, `docker stop` of PID 1 while it verifies. The
checks of odd values (variables, options, probe timeouts) decide before anything a container changes, and run in
the unit tier only.
"""

from __future__ import annotations

import time
from pathlib import Path

from tests.support.entrypoint import STARTED, Entrypoint, device, hung_driver, only_error_line, plant
from tests.support.sandbox import TEST_IMAGE, Sandbox
from tests.support.scenarios import uuids
from tests.support.wait import wait_for
from tests.unit import test_entrypoint_hostile as unit
from tests.unit.test_entrypoint_hostile import (  # noqa: F401  (collected here again, with this tier's `ep`)
    test_a_sitecustomize_that_loaded_a_hostile_module_first_does_not_leak_into_the_entrypoint,
    test_hostile_modules_on_pythonpath_are_not_imported_and_the_workload_keeps_its_path,
)

RTX = uuids("mixed-4")[1]


def test_hostile_modules_in_the_working_directory_are_not_imported(ep: Entrypoint, tmp_path: Path) -> None:
    """The image's wheel install with the workload's modules in its working directory (the unit tier runs each
    PYTHONPATH that puts it on sys.path)."""
    unit.test_hostile_modules_in_the_working_directory_are_not_imported(ep, tmp_path, None)


# The MIG box through the hook (`--gpus all`), at one level each: the unit tier runs every level.
def test_a_whole_card_beside_a_mig_mode_card_is_the_card_the_workload_gets(on_mig: Entrypoint) -> None:
    unit.test_a_whole_card_beside_a_mig_mode_card_is_the_card_the_workload_gets(on_mig, "cuda")


def test_a_mig_device_and_a_whole_card_together(on_mig: Entrypoint) -> None:
    unit.test_a_mig_device_and_a_whole_card_together(on_mig, "cuda")


def test_a_whole_card_in_mig_mode_is_refused_with_78(on_mig: Entrypoint) -> None:
    unit.test_a_whole_card_in_mig_mode_is_refused_with_78(on_mig, "nvml")


def test_an_old_style_mig_uuid_is_resolved_to_its_device(on_mig: Entrypoint) -> None:
    unit.test_an_old_style_mig_uuid_is_resolved_to_its_device(on_mig, "cuda")


def test_hostile_modules_in_the_user_site_are_not_imported(mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    # Container only: the image's Python reads root's user site; a venv (host mode here) has none.
    user_site = mixed4_sandbox.docker(
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        TEST_IMAGE,
        "-c",
        "import site; print(site.getusersitepackages())",
        check=True,
    ).stdout.strip()
    site_dir = plant(tmp_path / "site")
    site_dir.chmod(0o755)
    r = mixed4_sandbox.docker(
        "run",
        "--rm",
        "--gpus",
        device(RTX),
        "-e",
        f"GPUPIN_EXPECT={RTX}",
        "-v",
        f"{site_dir}:{user_site}:ro",
        TEST_IMAGE,
        "--verify",
        "cuda",
        "python3",
        "-c",
        "import importlib.util as u; print(u.find_spec('pynvml').origin)",
    )
    assert r.returncode == 0, r
    assert "HOSTILE" not in r.stderr and f"cuda:0  {RTX}" in r.stderr, r.stderr
    assert r.stdout.strip() == f"{user_site}/pynvml.py"  # the workload's Python still has its user site


def test_docker_stop_during_the_probe_stops_the_container_promptly_with_143(
    mixed4_sandbox: Sandbox, tmp_path: Path
) -> None:
    # The entrypoint is PID 1: without a handler the kernel drops SIGTERM, and docker stop waits for its SIGKILL.
    topo = hung_driver(tmp_path, keep=RTX)
    r = mixed4_sandbox.docker(
        "run",
        "-d",
        "--gpus",
        device(RTX),
        "-e",
        f"GPUPIN_EXPECT={RTX}",
        "-e",
        "FAKEGPU_TOPOLOGY=/hung/topology.json",
        "-v",
        f"{topo.parent}:/hung:ro",
        TEST_IMAGE,
        *STARTED,
        check=True,
    )
    cid = r.stdout.strip()
    try:
        wait_for(
            lambda: "cudaprobe" in mixed4_sandbox.docker("top", cid, "-o", "pid,args").stdout,
            60,
            "the CUDA probe to start",
        )
        t0 = time.monotonic()
        mixed4_sandbox.docker("stop", "-t", "30", cid, check=True)
        assert time.monotonic() - t0 < 10
        assert mixed4_sandbox.docker("wait", cid, check=True).stdout.strip() == "143"
        logs = mixed4_sandbox.docker("logs", cid)
        assert "WORKLOAD-STARTED" not in logs.stdout
        assert "stopped by SIGTERM while verifying the GPU pin" in only_error_line(logs.stderr)
    finally:
        mixed4_sandbox.docker("rm", "-f", cid)
