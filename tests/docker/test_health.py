"""Card health on the sandbox: `run --count 1` starts its container on a healthy card, on both engines, and naming
an unhealthy one is 69 with the reason. The faults without a daemon: tests/unit/test_health.py."""

from __future__ import annotations

from pathlib import Path

from tests.support.host import saw
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import fault_file, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")


def test_count_skips_an_unhealthy_card_on_the_daemon(agent: Agent, tmp_path: Path) -> None:
    faults = fault_file(tmp_path, {A800: {"xid": [79]}})
    r = agent("run", "--rm", "--count", "1", TEST_IMAGE, FAKEGPU_FAULTS=str(faults))
    assert r.returncode == 0, r.stderr
    assert saw(r.stdout) == [A800C]
    r = agent("run", "--rm", "--uuid", A800, TEST_IMAGE, FAKEGPU_FAULTS=str(faults))
    assert r.returncode == 69 and "which is unhealthy: XID 79 (fallen off the bus)" in r.stderr, r.stderr
    assert agent.containers() == []  # refused before anything was created
