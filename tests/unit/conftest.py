"""The unit tier's fixtures: gpupin-entrypoint on the simulated host, where the docker tier (tests/docker/conftest.py)
runs the same tests in a container."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.entrypoint import Entrypoint, on_host


@pytest.fixture
def ep(fakegpu: Path) -> Entrypoint:
    """gpupin-entrypoint on bare metal (mixed-4; a test names another scenario in each run)."""
    return on_host()


@pytest.fixture
def on_mig(fakegpu: Path) -> Entrypoint:
    """The mig box on bare metal: NVML sees the MIG-mode A100 and the whole one."""
    return on_host()


@pytest.fixture
def on_shared_prefix(fakegpu: Path) -> Entrypoint:
    return on_host()
