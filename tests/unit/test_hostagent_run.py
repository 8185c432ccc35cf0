"""`hostagent run`'s own description of itself (--version, --help), and what it says first when NVML and the daemon
both refuse. The run itself, on the sandbox: tests/docker/test_hostagent_run.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.host import HOSTAGENT


def test_version_and_help_describe_image_and_command() -> None:
    r = subprocess.run([HOSTAGENT, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("hostagent ")
    r = subprocess.run([HOSTAGENT, "run", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert "IMAGE" in r.stdout and "COMMAND" in r.stdout and "passed untouched" in r.stdout
    assert "--gpu-capabilities" in r.stdout and "--restart" in r.stdout


def test_nvml_refuses_first_though_it_is_read_beside_the_daemon(tmp_path: Path) -> None:
    """Without the agent, NVML is read on a thread while the daemon is asked (hostagent.run.launch.CardReading): a
    card that is not there, or no NVML, is still the run's one refusal, as when NVML was read before anything."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/nowhere.sock", "GPUPIN_AGENT": "0"}
    argv = [HOSTAGENT, "run", "--rm", "--gpu", "9", "img", "true"]
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 64 and r.stderr.count("ERROR") == 1 and "GPU index 9 is out of range" in r.stderr, r.stderr
    r = subprocess.run(argv, env={**env, "LD_LIBRARY_PATH": ""}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 69 and r.stderr.count("ERROR") == 1 and "Failed to initialize NVML" in r.stderr, r.stderr
