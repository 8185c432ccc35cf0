"""A container runtime that misbehaves, on the sandbox: the entrypoint must refuse, and say why.

Each scenario restarts the sandboxed daemon with a fault topology (the fake hook reads it from dockerd's
environment); the `sandbox` fixture puts mixed-4 back afterwards.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.support.host import REPO, simhost_env
from tests.support.sandbox import TEST_IMAGE, Sandbox
from tests.support.scenarios import uuids

# Every engine runs these (each engine reports the runtime's failures in its own words): docs/testing.md, The engines.
pytestmark = [pytest.mark.per_engine, pytest.mark.needs("gpus")]  # the faults are the hook's, reached by --gpus

A800, RTX, A800B, A800C = uuids("mixed-4")


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if "ERROR:" in ln]
    assert len(lines) == 1, err
    return lines[0]


def test_a_runtime_that_exposes_another_card_is_refused_with_78(sandbox: Sandbox) -> None:
    sandbox.restart("fault-misroute")  # asking for the 4090 exposes the A800 at 86:00.0
    r = sandbox.docker("run", "--rm", "--gpus", f"device={RTX}", TEST_IMAGE, "sh", "-c", "echo WORKLOAD-STARTED")
    assert r.returncode == 78, r.stderr
    assert "WORKLOAD-STARTED" not in r.stdout
    line = error_line(r.stderr)
    assert RTX in line and A800B in line and "NVIDIA_VISIBLE_DEVICES" in line
    # through hostagent too: the container's 78 is hostagent's exit code
    agent = subprocess.run(
        [str(REPO / ".venv/bin/hostagent"), "run", "--rm", "--uuid", RTX, TEST_IMAGE],
        env=simhost_env("fault-misroute", DOCKER_HOST=sandbox.host),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert agent.returncode == 78, agent.stderr
    assert f"GPUPIN_EXPECT asks for {RTX}@00000000:3B:00.0 at cuda:0" in agent.stderr


def test_nvml_unknown_error_in_the_container_is_69_with_the_daemon_reload_hint(sandbox: Sandbox) -> None:
    sandbox.restart("fault-nvml-unknown")
    r = sandbox.docker("run", "--rm", "--gpus", f"device={RTX}", TEST_IMAGE, "sh", "-c", "echo WORKLOAD-STARTED")
    assert r.returncode == 69, r.stderr
    line = error_line(r.stderr)
    assert "Failed to initialize NVML: Unknown Error" in line and "daemon-reload" in line
    assert "WORKLOAD-STARTED" not in r.stdout


def test_a_lost_card_in_the_container_is_69(sandbox: Sandbox) -> None:
    sandbox.restart("fault-lost")  # the card at 86:00.0 fell off the bus
    r = sandbox.docker("run", "--rm", "--gpus", f"device={A800B}", TEST_IMAGE, "true")
    assert r.returncode == 69, r.stderr
    assert "GPU is lost" in error_line(r.stderr)
    ok = sandbox.docker("run", "--rm", "--gpus", f"device={A800C}", TEST_IMAGE)
    assert ok.returncode == 0 and f"cuda:0 = {A800C}" in ok.stdout, ok.stderr
