"""Shared fixtures: the simulated GPU host (fake driver libraries, topologies) and the sandboxed Docker daemon.

Tests that need the daemon use the `sandbox` fixture. It skips when no sandbox answers, except under CI=true or
GPUPIN_TEST_REQUIRE_DOCKER=1 (what `make test` sets), where a missing daemon is a failure: a broken setup must
never pass as "all skipped". Tests that need a real GPU are marked `gpu` and skip without one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
FAKEGPU = REPO / "build" / "fakegpu"
SCENARIOS = REPO / "tests" / "fakegpu" / "scenarios"
SANDBOX_SCRIPT = REPO / "tests" / "sandbox" / "sandbox.sh"
# GPUPIN_SANDBOX_NAME selects one more sandbox beside the default one (as sandbox.sh and the Makefile do).
SANDBOX_NAME = os.environ.get("GPUPIN_SANDBOX_NAME", "")
SANDBOX_RUN = Path("/run/gpupin-sandbox" + (f"-{SANDBOX_NAME}" if SANDBOX_NAME else ""))
SANDBOX_HOST = f"unix://{SANDBOX_RUN}/docker.sock"
TEST_IMAGE = "gpupin:test"
DOCKER_CLI = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else (shutil.which("docker") or "docker")


def _truthy(name: str) -> bool:
    return os.environ.get(name, "").lower() not in ("", "0", "false", "no")


def docker_required() -> bool:
    return _truthy("CI") or _truthy("GPUPIN_TEST_REQUIRE_DOCKER")


def scenario(name: str) -> Path:
    return SCENARIOS / f"{name}.json"


def topology(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(scenario(name).read_text())
    return data


def gpu_uuids(name: str) -> list[str]:
    """The scenario's card UUIDs in NVML order (by bus id), as NVML would list them."""
    from gpupin.entrypoint.identity import BusId

    gpus = sorted(topology(name)["gpus"], key=lambda g: BusId.parse(g["bus_id"]).key())
    return [g["uuid"] for g in gpus]


@pytest.fixture(scope="session")
def fakegpu() -> Path:
    """The built fake libraries and hook (built here if `make fakegpu` has not run)."""
    # The top-level target, so that the hook's interpreter is the same as `make test` gives it.
    subprocess.run(["make", "-s", "-C", str(REPO), "fakegpu"], check=True, stdout=subprocess.DEVNULL)
    for f in ("lib/libnvidia-ml.so.1", "lib/libcuda.so.1", "bin/nvidia-container-runtime-hook"):
        assert (FAKEGPU / f).exists(), f"the fake GPU build lacks {f}"
    return FAKEGPU


def simhost_env(name: str = "mixed-4", **extra: str) -> dict[str, str]:
    """The environment of a process on the simulated host: the fake libraries, the topology, nothing CUDA."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "GPUPIN_", "NVIDIA_", "DOCKER_RESOURCE_"))}
    env["LD_LIBRARY_PATH"] = str(FAKEGPU / "lib")
    env["FAKEGPU_TOPOLOGY"] = str(scenario(name))
    env.update(extra)
    return env


class Sandbox:
    """The sandboxed daemon, driven by the real docker CLI; records what tests create, removes it after."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.env = dict(os.environ, DOCKER_HOST=host)

    def docker(self, *args: str, check: bool = False, timeout: float = 120,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([DOCKER_CLI, *args], env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout, input=input)

    def restart(self, scenario_name: str) -> None:
        """Run the sandbox with another topology (the hook reads it from dockerd's environment)."""
        env = dict(os.environ, FAKEGPU_TOPOLOGY=str(scenario(scenario_name)))
        subprocess.run([str(SANDBOX_SCRIPT), "up"], env=env, check=True, capture_output=True, timeout=600)

    def topology_name(self) -> str:
        config = (SANDBOX_RUN / "config").read_text().split()
        return Path(config[1]).stem


def _fail_or_skip(why: str) -> None:
    if docker_required():
        pytest.fail(f"the sandboxed Docker daemon is required here (CI): {why}", pytrace=False)
    pytest.skip(f"no sandboxed Docker daemon: {why} (start it with `make sandbox-up`)")


@pytest.fixture(scope="session")
def sandbox(fakegpu: Path) -> Iterator[Sandbox]:
    host = os.environ.get("GPUPIN_TEST_DOCKER_HOST", SANDBOX_HOST)
    sb = Sandbox(host)
    try:
        ping = sb.docker("version", "--format", "{{.Server.Version}}", timeout=20)
    except (OSError, subprocess.TimeoutExpired) as err:
        _fail_or_skip(str(err))
        raise
    if ping.returncode != 0:
        _fail_or_skip(ping.stderr.strip().splitlines()[-1] if ping.stderr.strip() else "no answer")
    if sb.docker("image", "inspect", TEST_IMAGE).returncode != 0:
        _fail_or_skip(f"the image {TEST_IMAGE} is missing (`make image-test` builds it)")
    yield sb
    # Whatever a test changed, leave the sandbox on the default topology for the next one.
    if (SANDBOX_RUN / "config").exists() and sb.topology_name() != "mixed-4":
        sb.restart("mixed-4")


@pytest.fixture
def mixed4_sandbox(sandbox: Sandbox) -> Sandbox:
    if sandbox.topology_name() != "mixed-4":
        sandbox.restart("mixed-4")
    return sandbox


DOCKER_FIXTURES = frozenset({"sandbox", "mixed4_sandbox"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that needs the daemon, from the fixtures it uses (directly or through another fixture), so
    that `-m "not docker"` (make test-unit) is a true daemon-free run."""
    for item in items:
        if DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.docker)


def real_gpu_count() -> int:
    """Cards on a real NVIDIA host (0 here: the fakes are never on the default library path)."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


# --- hostagent on the simulated host, against the sandbox (shared by every hostagent test file) ---------------

HOSTAGENT = str(REPO / ".venv" / "bin" / "hostagent")


class Agent:
    """Runs the hostagent CLI on the simulated host, against the sandbox; tags what it creates."""

    def __init__(self, sandbox: Sandbox, tag: str) -> None:
        self.sandbox = sandbox
        self.tag = tag
        self.env = simhost_env("mixed-4", DOCKER_HOST=sandbox.host)

    def argv(self, *args: str) -> list[str]:
        if args and args[0] == "run":
            return [HOSTAGENT, "run", "--label", f"gpupin.test={self.tag}", *args[1:]]
        return [HOSTAGENT, *args]

    def __call__(self, *args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env={**self.env, **env}, capture_output=True, text=True,
                              timeout=timeout)

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(*args), env={**self.env, **env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def containers(self, state: str | None = None) -> list[dict[str, str]]:
        args = ["ps", "-a", "--no-trunc", "--filter", f"label=gpupin.test={self.tag}", "--format", "{{json .}}"]
        if state:
            args[2:2] = ["--filter", f"status={state}"]
        out = self.sandbox.docker(*args, check=True).stdout
        return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def agent(mixed4_sandbox: Sandbox) -> Iterator[Agent]:
    busy = mixed4_sandbox.docker("ps", "-q", "--filter", "label=gpupin.devices", check=True).stdout.split()
    assert not busy, f"pinned containers left running by an earlier test: {busy}"
    a = Agent(mixed4_sandbox, uuid.uuid4().hex[:12])
    yield a
    ids = mixed4_sandbox.docker("ps", "-aq", "--filter", f"label=gpupin.test={a.tag}").stdout.split()
    if ids:
        mixed4_sandbox.docker("rm", "-f", *ids)


def saw(out: str) -> list[str]:
    """The UUIDs the workload saw at cuda:0, cuda:1, ... (from `python3 -m gpupin.entrypoint`)."""
    return re.findall(r"^cuda:\d+ = (\S+) at .*, as expected$", out, re.M)
