"""`hostagent run`'s own description of itself (--version, --help). The run itself, on the sandbox:
tests/docker/test_hostagent_run.py."""

from __future__ import annotations

import subprocess

from tests.support.host import HOSTAGENT


def test_version_and_help_describe_image_and_command() -> None:
    r = subprocess.run([HOSTAGENT, "--version"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and r.stdout.startswith("hostagent ")
    r = subprocess.run([HOSTAGENT, "run", "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0
    assert "IMAGE" in r.stdout and "COMMAND" in r.stdout and "passed untouched" in r.stdout
    assert "--gpu-capabilities" in r.stdout and "--restart" in r.stdout
