"""The docker tier's fixtures: gpupin-entrypoint in a container on each engine's sandbox, for the tests the unit tier
runs on the simulated host (tests/unit/conftest.py); the docker tier's modules collect those tests again."""

from __future__ import annotations

import pytest

from tests.support.entrypoint import Entrypoint, in_container
from tests.support.sandbox import Sandboxes, engines_under_test


@pytest.fixture(params=engines_under_test(), ids=str)
def ep(request: pytest.FixtureRequest, sandboxes: Sandboxes) -> Entrypoint:
    """gpupin-entrypoint in `gpupin:test` on the sandbox of each engine, serving mixed-4."""
    return in_container(sandboxes, request.param)


@pytest.fixture(params=engines_under_test(), ids=str)
def on_mig(request: pytest.FixtureRequest, sandboxes: Sandboxes) -> Entrypoint:
    """The mig box: `--gpus all` gives the container the view bare metal has."""
    return in_container(sandboxes, request.param, "mig")


@pytest.fixture(params=engines_under_test(), ids=str)
def on_shared_prefix(request: pytest.FixtureRequest, sandboxes: Sandboxes) -> Entrypoint:
    return in_container(sandboxes, request.param, "mig-shared-prefix")
