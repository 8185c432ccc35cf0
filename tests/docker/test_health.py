"""Card health on the sandbox: `run --count` never takes an unhealthy card or one of unknown health (each fault, and
several), `run --count 1` starts its container on a healthy card, on both engines, and naming an unhealthy one is
69 with the reason. The faults without a daemon: tests/unit/test_health.py. The CLI reads the idle mixed-4 here
(no process on card 2), so that what changes the choice is health alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.host import idle_topology, saw
from tests.support.sandbox import TEST_IMAGE, Agent, Sandbox
from tests.support.scenarios import fault_file, scenario, uuids
from tests.unit.test_health import FAULTS, chosen, cli

A800, RTX, A800B, A800C = uuids("mixed-4")


def test_count_skips_an_unhealthy_card_on_the_daemon(agent: Agent, tmp_path: Path) -> None:
    faults = fault_file(tmp_path, {A800: {"xid": [79]}})
    r = agent("run", "--rm", "--count", "1", TEST_IMAGE, FAKEGPU_FAULTS=str(faults))
    assert r.returncode == 0, r.stderr
    assert saw(r.stdout) == [A800C]
    r = agent("run", "--rm", "--uuid", A800, TEST_IMAGE, FAKEGPU_FAULTS=str(faults))
    assert r.returncode == 69 and "which is unhealthy: XID 79 (fallen off the bus)" in r.stderr, r.stderr
    assert agent.containers() == []  # refused before anything was created


def count(sandbox: Sandbox, n: int = 1, faults: Path | None = None) -> tuple[int, str]:
    r = cli(
        "run", "--dry-run", "--count", str(n), TEST_IMAGE, faults=faults, topo=idle_topology(), docker_host=sandbox.host
    )
    return r.returncode, (chosen(r) if r.returncode == 0 else r.stderr)


@pytest.mark.parametrize("kind", FAULTS)
def test_count_never_takes_a_faulty_card(mixed4_sandbox: Sandbox, tmp_path: Path, kind: str) -> None:
    fault, _ = FAULTS[kind]
    faults = fault_file(tmp_path, {A800: fault} if kind != "lost" else {"0": fault})
    assert count(mixed4_sandbox) == (0, A800)
    # The idle topology's cards read idle: the next A800 by index (A800B, all 80 GiB free, as A800C) is taken.
    assert count(mixed4_sandbox, faults=faults) == (0, A800B)


def test_several_faults_and_count(mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    faults = fault_file(tmp_path, {A800: {"xid": [79]}, A800C: {"ecc": {"volatile_uncorrected": 3}}})
    # The best card left: the A800 at 86 (80 GiB free, idle) before the 4090 (24 GiB).
    assert count(mixed4_sandbox, faults=faults) == (0, A800B)
    rc, err = count(mixed4_sandbox, 3, faults)
    assert rc == 69, err
    assert (
        "--count 3: only 2 of the 4 whole card(s) are fit for use (unhealthy or of unknown health: "
        "0: XID 79 (fallen off the bus), 3: 3 volatile uncorrectable ECC errors)"
    ) in err
    assert count(mixed4_sandbox, 5, faults)[0] == 64  # more than there are


def test_count_skips_unknown_health_and_keeps_application_xids(mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    assert count(mixed4_sandbox, faults=fault_file(tmp_path, {A800: {"memory_query_error": 999}})) == (0, A800B)
    app = tmp_path / "app"
    app.mkdir()
    assert count(mixed4_sandbox, faults=fault_file(app, {A800: {"xid": [13, 31, 43, 45, 68, 109]}})) == (0, A800)


def test_compose_counts_skip_unhealthy_cards(mixed4_sandbox: Sandbox, tmp_path: Path) -> None:
    compose = tmp_path / "compose.yml"
    compose.write_text("services:\n  train:\n    image: img\n    x-gpupin: {count: 4}\n")
    host = mixed4_sandbox.host
    assert cli("compose", "check", str(compose), topo=idle_topology(), docker_host=host).returncode == 0
    r = cli(
        "compose",
        "check",
        str(compose),
        faults=fault_file(tmp_path, {"0": {"xid": [79]}}),
        topo=idle_topology(),
        docker_host=host,
    )
    # The cards are unavailable, not the file wrong: 69, as render and `run --count 4` have it (docs/exit-codes.md)
    assert r.returncode == 69, r.stdout + r.stderr
    assert (
        "service train: count: 4: only 3 of the 4 whole card(s) are fit for use (unhealthy or of unknown "
        "health: 0: XID 79 (fallen off the bus))"
    ) in r.stdout + r.stderr


def test_only_the_4090_of_the_shipped_health_scenario_is_fit(mixed4_sandbox: Sandbox) -> None:
    r = cli(
        "run", "--dry-run", "--count", "1", TEST_IMAGE, topo=scenario("fault-health"), docker_host=mixed4_sandbox.host
    )
    assert chosen(r) == RTX
