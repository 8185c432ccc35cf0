"""Shared fixtures: the simulated GPU host (fake driver libraries, topologies) and the sandboxed Docker daemon.

Tests that need the daemon use the `sandbox` fixture. It skips when no sandbox answers, except under CI=true or
GPUPIN_TEST_REQUIRE_DOCKER=1 (what `make test` sets), where a missing daemon is a failure: a broken setup must
never pass as "all skipped". Tests that need a real GPU are marked `gpu` and skip without one.

The fixture is parametrized over the Docker engines (ids "20.10" and "26"; GPUPIN_TEST_ENGINES picks some, as
`make test ENGINES=...` does): every docker-path test runs once per engine, each engine on its own sandbox.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"  # the console scripts of the editable install
HOSTAGENT = str(BIN / "hostagent")
ENTRYPOINT = str(BIN / "gpupin-entrypoint")
FAKEGPU = REPO / "build" / "fakegpu"
SCENARIOS = REPO / "tests" / "fakegpu" / "scenarios"
SANDBOX_SCRIPT = REPO / "tests" / "sandbox" / "sandbox.sh"
TEST_IMAGE = "gpupin:test"
# The engines' ids, as GPUPIN_SANDBOX_ENGINE names them; the first is the default engine.
ENGINES = ("20.10", "26")


def engines_under_test() -> list[str]:
    """The engines this run tests: GPUPIN_TEST_ENGINES (space- or comma-separated), else all."""
    wanted = os.environ.get("GPUPIN_TEST_ENGINES", "").replace(",", " ").split()
    unknown = sorted(set(wanted) - set(ENGINES))
    if unknown:
        raise pytest.UsageError(f"GPUPIN_TEST_ENGINES: unknown engine {' '.join(unknown)}; the engines are "
                                f"{' '.join(ENGINES)}")
    return [e for e in ENGINES if e in wanted] if wanted else list(ENGINES)


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
    from gpupin.core.identity import BusId

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


def idle_topology(name: str = "mixed-4") -> str:
    """The scenario with no process on any card (written under build/), for the tests of the ledger and its lock
    that need every card free: a process is a holder (gpupin.hostagent.ledger.uses), and mixed-4 runs pid 4242 on
    card 2. The sandbox's hook keeps the scenario itself: the cards are the same."""
    topo = topology(name)
    for g in topo["gpus"]:
        g.pop("processes", None)
    path = REPO / "build" / "test-topologies" / f"{name}-idle.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(topo)
    if not path.exists() or path.read_text() != text:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)  # whole, for a test running beside this one
    return str(path)


def simhost_env(name: str = "mixed-4", **extra: str) -> dict[str, str]:
    """The environment of a process on the simulated host: the fake libraries, the topology, nothing CUDA."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "GPUPIN_", "NVIDIA_", "DOCKER_RESOURCE_"))}
    env["LD_LIBRARY_PATH"] = str(FAKEGPU / "lib")
    env["FAKEGPU_TOPOLOGY"] = str(scenario(name))
    env.update(extra)
    return env


def sandbox_env(engine: str) -> dict[str, str]:
    """What sandbox.sh says a client of this engine's sandbox needs (DOCKER_HOST, its docker CLI, its run folder;
    DOCKER_CONFIG for Engine 26, whose CLI finds the compose plugin through it). GPUPIN_SANDBOX_NAME selects one
    more sandbox beside the default one, as in sandbox.sh and the Makefile."""
    out = subprocess.run([str(SANDBOX_SCRIPT), "env"], env=dict(os.environ, GPUPIN_SANDBOX_ENGINE=engine),
                         capture_output=True, text=True, check=True, timeout=30).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


class Sandbox:
    """One engine's sandboxed daemon, driven by that engine's own docker CLI and compose; records what tests
    create, removes it after."""

    def __init__(self, engine: str) -> None:
        info = sandbox_env(engine)
        self.engine = engine
        self.host = info["DOCKER_HOST"]
        self.run_dir = Path(info["GPUPIN_SANDBOX_RUN"])
        self.docker_cli = info["GPUPIN_SANDBOX_DOCKER"]
        self.env = dict(os.environ, DOCKER_HOST=self.host)
        if "DOCKER_CONFIG" in info:
            self.env["DOCKER_CONFIG"] = info["DOCKER_CONFIG"]
        # docker-compose 1.29 (Debian 12) beside 20.10; the compose v2 CLI plugin (Debian 13) beside Engine 26.
        self.compose_cli: Sequence[str] = (
            [shutil.which("docker-compose") or "/usr/bin/docker-compose"] if engine == "20.10"
            else [self.docker_cli, "compose"])

    def docker(self, *args: str, check: bool = False, timeout: float = 120,
               input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.docker_cli, *args], env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout, input=input)

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """This engine's compose, with the flags both generations read (`--ansi never`, not 1.x's `--no-ansi`)."""
        return subprocess.run([*self.compose_cli, "--ansi", "never", *args], env=self.env, capture_output=True,
                              text=True, timeout=timeout)

    def restart(self, scenario_name: str) -> None:
        """Run the sandbox with another topology (the hook reads it from dockerd's environment; Engine 26 also
        gets the CDI spec of the new topology)."""
        env = dict(os.environ, FAKEGPU_TOPOLOGY=str(scenario(scenario_name)), GPUPIN_SANDBOX_ENGINE=self.engine)
        subprocess.run([str(SANDBOX_SCRIPT), "up"], env=env, check=True, capture_output=True, timeout=600)

    def topology_name(self) -> str:
        config = (self.run_dir / "config").read_text().split()
        return Path(config[1]).stem

    def use(self, scenario_name: str) -> Sandbox:
        """This sandbox on that topology (restarted only when it runs another)."""
        if self.topology_name() != scenario_name:
            self.restart(scenario_name)
        return self


def _fail_or_skip(why: str) -> NoReturn:
    if docker_required():
        pytest.fail(f"the sandboxed Docker daemon is required here (CI): {why}", pytrace=False)
    pytest.skip(f"no sandboxed Docker daemon: {why} (`make image-test` starts every engine's)")


class Sandboxes:
    """Every engine's sandbox, checked once per session. Tests take one through the `sandbox` fixture (one run
    per engine); a fixture that decides at run time whether it needs a daemon asks here by engine (pytest cannot
    hand it a parametrized fixture then)."""

    def __init__(self) -> None:
        self._checked: dict[str, Sandbox | str] = {}

    def get(self, engine: str) -> Sandbox:
        if engine not in self._checked:
            try:
                self._checked[engine] = self._check(Sandbox(engine))
            except subprocess.CalledProcessError as err:  # sandbox.sh refused the name or the engine
                self._checked[engine] = str(err.stderr).strip() or str(err)
        got = self._checked[engine]
        if isinstance(got, str):
            _fail_or_skip(got)
        return got

    @staticmethod
    def _check(sb: Sandbox) -> Sandbox | str:
        """The sandbox, or why it cannot serve."""
        try:
            ping = sb.docker("version", "--format", "{{.Server.Version}}", timeout=20)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"Engine {sb.engine} at {sb.host}: {err}"
        if ping.returncode != 0:
            why = ping.stderr.strip().splitlines()[-1] if ping.stderr.strip() else "no answer"
            return f"Engine {sb.engine} at {sb.host}: {why}"
        if sb.docker("image", "inspect", TEST_IMAGE).returncode != 0:
            return f"the image {TEST_IMAGE} is missing on Engine {sb.engine} (`make image-test` builds it)"
        return sb

    def restore(self) -> None:
        """Whatever a test changed, leave each sandbox on the default topology for the next run."""
        for sb in self._checked.values():
            if isinstance(sb, Sandbox) and (sb.run_dir / "config").exists():
                sb.use("mixed-4")


@pytest.fixture(scope="session")
def sandboxes(fakegpu: Path) -> Iterator[Sandboxes]:
    pool = Sandboxes()
    yield pool
    pool.restore()


@pytest.fixture(scope="session", params=engines_under_test(), ids=str)
def sandbox(request: pytest.FixtureRequest, sandboxes: Sandboxes) -> Sandbox:
    return sandboxes.get(request.param)


@pytest.fixture
def mixed4_sandbox(sandbox: Sandbox) -> Sandbox:
    return sandbox.use("mixed-4")


DOCKER_FIXTURES = frozenset({"sandboxes", "sandbox", "mixed4_sandbox"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite the golden files under tests/golden from the real output (`make golden`) "
                          "instead of comparing with them")


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


def agent_on(sandbox: Sandbox) -> Iterator[Agent]:
    """An Agent on this sandbox (mixed-4), and the removal of what it tagged."""
    sandbox.use("mixed-4")
    busy = sandbox.docker("ps", "-q", "--filter", "label=gpupin.devices", check=True).stdout.split()
    assert not busy, f"pinned containers left running by an earlier test: {busy}"
    a = Agent(sandbox, uuid.uuid4().hex[:12])
    yield a
    ids = sandbox.docker("ps", "-aq", "--filter", f"label=gpupin.test={a.tag}").stdout.split()
    if ids:
        sandbox.docker("rm", "-f", *ids)


@pytest.fixture
def agent(mixed4_sandbox: Sandbox) -> Iterator[Agent]:
    yield from agent_on(mixed4_sandbox)


@pytest.fixture
def agent26(sandboxes: Sandboxes) -> Iterator[Agent]:
    """An Agent on Engine 26's sandbox alone: for what only an engine with CDI does."""
    if "26" not in engines_under_test():
        pytest.skip("Engine 26 is not among GPUPIN_TEST_ENGINES")
    yield from agent_on(sandboxes.get("26"))


def serves_cdi(sandbox: Sandbox) -> bool:
    """Whether the sandbox's daemon serves nvidia.com/gpu by CDI (Engine 26's runs with CDI on and the fake
    `nvidia-ctk cdi generate` spec), so that hostagent pins through CDI there (the assertion; hostagent asks the
    daemon itself)."""
    return sandbox.engine == "26"


def saw(out: str) -> list[str]:
    """The UUIDs the workload saw at cuda:0, cuda:1, ... (from `python3 -m gpupin.entrypoint`)."""
    return re.findall(r"^cuda:\d+ = (\S+) at .*, as expected$", out, re.M)
