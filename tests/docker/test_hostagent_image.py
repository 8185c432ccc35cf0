"""The image a run needs, on the sandbox, where no registry can be reached: the missing-image paths. The pull's
progress rendered from a recorded pull stream: tests/unit/test_hostagent_image.py."""

from __future__ import annotations

import pytest

from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent

# Every engine runs these (each engine builds and runs the image with its own CLI): docs/testing.md, The engines.
pytestmark = pytest.mark.per_engine


@pytest.mark.parametrize(
    ("pull", "says"),
    [
        ("missing", "not found locally and could not be pulled"),
        ("always", "could not be pulled"),
        ("never", "not found locally (--pull never)"),
    ],
)
def test_a_missing_image_is_125_and_creates_nothing(agent: Agent, pull: str, says: str) -> None:
    r = agent("run", "--pull", pull, "--gpu", "1", "gpupin-test/absent:1")
    assert r.returncode == 125, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert len(errors) == 1 and says in errors[0], r.stderr
    if pull == "missing":
        assert "Unable to find image 'gpupin-test/absent:1' locally" in r.stderr
    assert agent.containers() == []


def test_pull_always_on_a_local_image_still_asks_the_registry(agent: Agent) -> None:
    # gpupin:test exists only here: `--pull always` must try the registry (and fail, there being none).
    r = agent("run", "--pull", "always", "--gpu", "1", TEST_IMAGE)
    assert r.returncode == 125 and "could not be pulled" in r.stderr, r.stderr
    assert agent.containers() == []


@pytest.mark.parametrize("pull", ["missing", "always"])
def test_through_the_agent_the_caller_pulls_and_the_agent_makes_the_run(agent: Agent, pull: str) -> None:
    """The agent leaves only the pull to the caller (its registry credentials, its terminal), then would make the
    run itself, with its booking and grant: the caller reads no card and creates nothing of its own (there being no
    registry here, the pull fails as without the agent)."""
    resident = Resident(agent.env)
    trace = resident.dir / "trace"
    try:
        image = "gpupin-test/absent:1" if pull == "missing" else TEST_IMAGE
        r = agent("run", "--pull", pull, "--gpu", "1", image, GPUPIN_AGENT_SOCKET=resident.socket,
                  GPUPIN_TRACE=str(trace))  # fmt: skip
        assert r.returncode == 125 and "could not be pulled" in r.stderr, r.stderr
        marks = trace.read_text().split()
        assert "cards" not in marks, marks  # pulled here, the run not made here: the agent was to make it
        assert ("asking" in marks) == (pull == "missing"), marks  # --pull always pulls before it asks
        assert agent.containers() == []
    finally:
        resident.close()
