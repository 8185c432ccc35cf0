"""The fixtures and hooks every tier shares: the simulated GPU host (the fake driver libraries), the sandboxed Docker
daemons, hostagent against them; and the tiers themselves (README.md in this folder), checked at collection.

Tests that need the daemon use the `sandbox` fixture (or `sandboxes`, `agent`). It skips when no sandbox answers,
except under CI=true or GPUPIN_TEST_REQUIRE_DOCKER=1 (what `make test` sets), where a missing daemon is a failure.
The fixture is parametrized over the Docker engines (ids "20.10", "26", "28.5"; GPUPIN_TEST_ENGINES picks some, as
`make test ENGINES=...` does): every docker-path test runs once per engine, each engine on its own sandbox. Podman
("podman", only where named) is one more: its sandbox is the sandboxed podman service (tests/support/sandbox.py).
What the tests share besides fixtures is in tests/support.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.engines import engine_for, engine_free_name, on_this_engine, skip_what_the_engine_lacks
from tests.support.host import FAKEGPU, REPO, lock_dir, record_path, required
from tests.support.hypo import BASE
from tests.support.sandbox import Agent, Sandbox, Sandboxes, agent_on, engines_under_test, serves_cdi
from tests.support.spawn import default_signals_at_exec
from tests.support.watch import Running

# Hypothesis's profiles (tests/support/hypo.py scales each test's example count by the profile's max_examples):
# `ci`, what CI and the make targets that require the daemons run, half each test's examples, the same ones on
# every run (a failure is one to reproduce, not luck), its blob printed; `fuzz` (`make fuzz`,
# --hypothesis-profile=fuzz) twenty times the examples, at random. No deadline: the machines are shared and loaded,
# and a slow example is not a wrong one. A run with neither (a developer's, `dev`) takes each test's count, at random.
settings.register_profile("ci", derandomize=True, max_examples=BASE // 2, deadline=None, print_blob=True)
settings.register_profile("fuzz", max_examples=20 * BASE, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if required() else "dev")


def pytest_configure(config: pytest.Config) -> None:
    # What the processes the tests start inherit: the default dispositions, even where this run was started with
    # some ignored (nohup, CI without standard input): tests/support/spawn.py.
    default_signals_at_exec()
    # The ledger's local lock, taken in this process and in those that inherit its environment, in the run's own
    # folder: root's default, /run/gpupin, is the host's.
    os.environ["GPUPIN_LOCK_DIR"] = lock_dir()
    # So is an agent's record: root's default, /var/lib/gpupin, is the host's.
    os.environ["GPUPIN_RECORD"] = record_path()


@pytest.fixture(autouse=True)
def _daemon_address_read_per_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """hostagent reads where the daemon is once per process (gpupin.hostagent.engine.address); a test that calls
    its main() in this process is a run of its own, with its own DOCKER_HOST, and must not inherit another's."""
    from gpupin.hostagent.engine import address

    monkeypatch.setattr(address, "_ENDPOINT", None)


@pytest.fixture(scope="session")
def fakegpu() -> Path:
    """The built fake libraries and hook (built here if `make fakegpu` has not run)."""
    # The top-level target, so that the hook's interpreter is the same as `make test` gives it.
    subprocess.run(["make", "-s", "-C", str(REPO), "fakegpu"], check=True, stdout=subprocess.DEVNULL)
    for f in ("lib/libnvidia-ml.so.1", "lib/libcuda.so.1", "bin/nvidia-container-runtime-hook"):
        assert (FAKEGPU / f).exists(), f"the fake GPU build lacks {f}"
    return FAKEGPU


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


@pytest.fixture
def agent(mixed4_sandbox: Sandbox) -> Iterator[Agent]:
    yield from agent_on(mixed4_sandbox)


@pytest.fixture
def agent_any(request: pytest.FixtureRequest, sandboxes: Sandboxes) -> Iterator[Agent]:
    """An Agent on one engine, the one that takes this test (engine_for): for what hostagent decides before it asks
    the daemon anything (its argument handling, its own refusals)."""
    engine = engine_for(engine_free_name(request.node))
    assert engine is not None, "an agent_any test is kept only where a Docker engine takes it"
    yield from agent_on(sandboxes.get(engine))


@pytest.fixture
def agent_cdi(sandbox: Sandbox) -> Iterator[Agent]:
    """An Agent on the sandbox of each engine with CDI (26, 28.5): for what only such an engine does; skipped on
    the others."""
    if not serves_cdi(sandbox):
        pytest.skip(f"Engine {sandbox.engine} has no CDI")
    yield from agent_on(sandbox)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    """The watched workloads a test started (tests/support/watch.py `start`), ended after it, passed or not."""
    started: list[Running] = []
    yield started
    for r in started:
        r.close()


@pytest.fixture
def sleeper() -> Iterator[Callable[[], int]]:
    """Host processes: sleeper() starts one and gives its pid; all are ended after the test."""
    started: list[subprocess.Popen[bytes]] = []

    def start() -> int:
        p = subprocess.Popen(["sleep", "300"])
        started.append(p)
        return p.pid

    yield start
    for p in started:
        p.kill()
        p.wait()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files under tests/golden from the real output (`make golden`) "
        "instead of comparing with them",
    )


# --- the tiers ----------------------------------------------------------------------------------------------------
# A test's tier is the most a test needs, by its markers and its fixtures (directly or through another fixture);
# it must be the tier of its folder, and carries that tier's marker, so that `-m` selects what the folder holds.
NEEDS = ("gpu", "swarm", "slurm", "docker")  # most demanding first
FIXTURE_NEEDS = {
    "sandboxes": "docker",
    "sandbox": "docker",
    "mixed4_sandbox": "docker",
    "agent": "docker",
    "agent_cdi": "docker",
    "agent_any": "docker",
    "swarm": "swarm",
    "slurm": "slurm",
    "slurm_cluster": "slurm",
}
FOLDERS = {"unit": {"unit"}, "docker": {"docker"}, "cluster": {"swarm", "slurm"}, "gpu": {"gpu"}}
WHERE = {
    "unit": "tests/unit",
    "docker": "tests/docker",
    "swarm": "tests/cluster",
    "slurm": "tests/cluster",
    "gpu": "tests/gpu",
}
TESTS = Path(__file__).resolve().parent


def tier_of(item: pytest.Item) -> str:
    needs = {m.name for m in item.iter_markers()}
    needs |= {FIXTURE_NEEDS[f] for f in getattr(item, "fixturenames", ()) if f in FIXTURE_NEEDS}
    return next((n for n in NEEDS if n in needs), "unit")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with its tier (docker, swarm, slurm, gpu; none for unit) and refuse a test filed in another
    tier's folder: `make test-unit` must never need a daemon, `make test-docker` never a cluster."""
    # A test module outside the tier folders is never collected (pyproject's testpaths): refuse it instead.
    misplaced = [
        f"{p.relative_to(TESTS.parent)} is in no tier's folder: move it to the tier of what it needs"
        for p in sorted(TESTS.glob("test_*.py"))
    ]
    for item in items:
        tier = tier_of(item)
        folder = item.path.relative_to(TESTS).parts[0] if item.path.is_relative_to(TESTS) else ""
        if folder in FOLDERS and tier not in FOLDERS[folder]:
            misplaced.append(
                f"{item.nodeid} needs {tier if tier != 'unit' else 'nothing'}: it belongs in {WHERE[tier]}/"
            )
        if tier != "unit":
            item.add_marker(getattr(pytest.mark, tier))
    if misplaced:
        raise pytest.UsageError(
            "tests filed in the wrong tier's folder (docs/testing.md, The tiers):\n  " + "\n  ".join(misplaced)
        )
    for item in items:
        skip_what_the_engine_lacks(item)
    elsewhere = [item for item in items if not on_this_engine(item)]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if on_this_engine(item)]
