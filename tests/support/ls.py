"""`hostagent ls` as the tests run it on the simulated host, and the golden files (tests/golden) its table is checked
against exactly (unit tier: every shipped scenario; docker tier: holders of every kind)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.host import HOSTAGENT, REPO, simhost_env
from tests.support.scenarios import topology

GOLDEN = REPO / "tests" / "golden"
GOLDEN_HOST = "gpu-host"


def ls(*args: str, scenario_name: str = "mixed-4", **env: str) -> subprocess.CompletedProcess[str]:
    """`hostagent ls ARGS` on the simulated host with that scenario's cards."""
    return subprocess.run(
        [HOSTAGENT, "ls", *args], env=simhost_env(scenario_name, **env), capture_output=True, text=True, timeout=60
    )


def by_uuid(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["uuid"]: g for g in listing["gpus"] if g["uuid"]}


def write_topology(tmp_path: Path, name: str, pid: int, used: int | None = 512) -> Path:
    """The scenario with one more process on card 1 (NVML order: the 4090 in mixed-4)."""
    topo = topology(name)
    topo["gpus"][1]["processes"] = [{"pid": pid, "used_memory_mib": used}]
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topo))
    return path


def on_golden_host() -> tuple[str, ...]:
    """The command that execs the rest with the host name GOLDEN_HOST, in pid and UTS namespaces of its own."""
    enter = ["unshare", "--uts", "--pid", "--fork", "--mount-proc"]
    if os.geteuid() != 0:
        enter.insert(1, "--map-root-user")  # unprivileged: a user namespace gives the right to name the host
    rename = f"import os, socket, sys; socket.sethostname({GOLDEN_HOST!r}); os.execv(sys.argv[1], sys.argv[1:])"
    return (*enter, sys.executable, "-c", rename)


def ls_on_golden_host(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real CLI on the golden host (on_golden_host)."""
    return subprocess.run(
        [*on_golden_host(), HOSTAGENT, "ls", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def shown(r: subprocess.CompletedProcess[str]) -> str:
    """What a golden file holds: stdout, then stderr and the exit code where there are any."""
    text = r.stdout
    if r.stderr:
        text += "--- stderr ---\n" + r.stderr
    if r.returncode:
        text += f"--- exit {r.returncode} ---\n"
    return text


def check_golden(request: pytest.FixtureRequest, name: str, text: str) -> None:
    path = GOLDEN / name
    if request.config.getoption("--update-golden"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no golden file {path.relative_to(REPO)}: `make golden` writes it (review the diff)"
    assert text == path.read_text(), (
        f"hostagent ls differs from {path.relative_to(REPO)} (`make golden` rewrites it when the change is meant)"
    )
