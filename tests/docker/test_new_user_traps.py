"""`make shell`: the simulated host's environment for a user's own commands after `make demo` (issue 23, trap 4)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.host import BIN, REPO

SIMULATED = ("DOCKER_HOST", "LD_LIBRARY_PATH", "FAKEGPU_TOPOLOGY")


@pytest.mark.docker
def test_make_shell_is_a_shell_on_the_simulated_host() -> None:
    """Issue 23, trap 4: without DOCKER_HOST, LD_LIBRARY_PATH and FAKEGPU_TOPOLOGY, `.venv/bin/hostagent ls` said
    "NVML Shared Library Not Found". `make shell` gives a shell with them, .venv/bin on PATH, and a prompt that
    says where it is."""
    env = {k: v for k, v in os.environ.items() if k not in SIMULATED}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != str(BIN))
    script = 'command -v hostagent\nhostagent ls --json >/dev/null && echo "ls: $?"\necho "prompt: $PS1"\nexit 3\n'
    r = subprocess.run(
        ["make", "-s", "shell"], cwd=REPO, env=env, input=script, capture_output=True, text=True, timeout=600
    )
    out = r.stdout.splitlines()
    assert str(BIN / "hostagent") in out and "ls: 0" in out, (r.stdout, r.stderr)
    assert any(ln.startswith("prompt: (gpupin simulated host)") for ln in out), out
    assert "simulated GPU host" in r.stderr, r.stderr  # the banner: what this shell is, and how to leave it
