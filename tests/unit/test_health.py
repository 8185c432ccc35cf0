"""Card health end to end: each fault planted on the simulated host (the fault file $FAKEGPU_FAULTS, or the
topology), read by hostagent's real CLI: naming the card is 69 with the reason and a hint, and `ls` says why
(table, --json, --format). Health NVML cannot tell is unknown, never healthy. That `run --count` never takes such a
card needs a ledger that can be read (unknown is not free): tests/docker/test_health.py.

These tests point DOCKER_HOST at a socket that does not exist (`cli`): `ls` lists the cards without holders, and a
named card is refused for its health before the ledger is read, so what changes is health alone.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gpupin.core import health
from gpupin.core.health import MemoryHealth
from tests.support.host import HOSTAGENT, simhost_env
from tests.support.sandbox import TEST_IMAGE
from tests.support.scenarios import fault_file, scenario, topology, uuids

A800, RTX, A800B, A800C = uuids("mixed-4")  # --count 1 takes A800 (index 0) on a healthy mixed-4

# (fault on the card at index 0, the reason hostagent gives)
FAULTS = {
    "xid": ({"xid": [79]}, "XID 79 (fallen off the bus)"),
    "xid-ecc": ({"xid": [13, 48]}, "XID 48 (double-bit ECC error)"),
    "ecc": ({"ecc": {"volatile_uncorrected": 2}}, "2 volatile uncorrectable ECC errors"),
    "remap-failure": ({"remap": {"failure": True}}, "row remapping failed"),
    "remap-pending": ({"remap": {"pending": True}}, "row remapping pending until a reset"),
    "retired-pending": (
        {"row_remapping": False, "retired_pages_pending": True},
        "page retirement pending until a reset",
    ),
    "lost": ({"lost": True}, "lost to NVML"),
}


NO_DAEMON = "unix:///nonexistent/gpupin-health/docker.sock"


def cli(
    *args: str, faults: Path | None = None, topo: Path | str | None = None, docker_host: str = NO_DAEMON
) -> subprocess.CompletedProcess[str]:
    env = simhost_env("mixed-4", DOCKER_HOST=docker_host)
    if topo is not None:
        env["FAKEGPU_TOPOLOGY"] = str(topo)
    if faults is not None:
        env["FAKEGPU_FAULTS"] = str(faults)
    return subprocess.run([HOSTAGENT, *args], env=env, capture_output=True, text=True, timeout=60)


def chosen(r: subprocess.CompletedProcess[str]) -> str:
    """The card a `run --dry-run` line pins."""
    assert r.returncode == 0, r.stderr
    return r.stdout.split("GPUPIN_EXPECT=", 1)[1].split("@", 1)[0]


def listing(faults: Path | None = None, topo: Path | None = None) -> list[dict[str, Any]]:
    r = cli("ls", "--json", faults=faults, topo=topo)
    assert r.returncode == 0, r.stderr
    gpus: list[dict[str, Any]] = json.loads(r.stdout)["gpus"]
    return gpus


@pytest.mark.parametrize("kind", FAULTS)
def test_each_fault_is_refused_and_shown(fakegpu: Path, tmp_path: Path, kind: str) -> None:
    fault, reason = FAULTS[kind]
    faults = fault_file(tmp_path, {A800: fault} if kind != "lost" else {"0": fault})

    # Named: 69, the reason, what to do; a lost card's UUID is no longer known to NVML, but it is most likely it.
    for flag, spec in (("--gpu", "0"), ("--uuid", A800)):
        r = cli("run", "--dry-run", flag, spec, TEST_IMAGE, faults=faults)
        assert r.returncode == 69 and r.stdout == "", r
        line = r.stderr.splitlines()[-1]
        assert line.startswith("hostagent: ERROR: ") and "HINT: see `nvidia-smi -q -d ECC,ROW_REMAPPER -i 0`" in line
        assert (reason in line) if (kind != "lost" or flag == "--gpu") else ("most likely that one" in line), line

    card = listing(faults)[0]
    assert card["health"] == {"healthy": False, "reasons": [reason], "since": card["health"]["since"]}
    assert (card["health"]["since"] is not None) == kind.startswith("xid")  # only an XID has a time: when seen
    table = cli("ls", faults=faults).stdout.splitlines()
    if kind == "lost":
        assert "[0] UNHEALTHY: lost to NVML (GPU is lost)" in table
    else:
        assert table[1].startswith("[0] NVIDIA A800-SXM4-80GB") and table[1].endswith("UNHEALTHY")
        # An XID's time is when this run saw it (the table's run is not the JSON's).
        label, shown = table[3].split(None, 1)
        since = r"  since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ" if kind.startswith("xid") else ""
        assert label == "UNHEALTHY" and re.fullmatch(re.escape(reason) + since, shown), shown
    r = cli("ls", "--format", "{index}|{healthy}|{health_reasons}", faults=faults)
    assert r.stdout.splitlines() == [f"0|false|{reason}", "1|true|", "2|true|", "3|true|"]


def test_planted_in_the_topology(fakegpu: Path, tmp_path: Path) -> None:
    data = topology("mixed-4")
    for gpu in data["gpus"]:
        if gpu["uuid"] == A800:
            gpu["ecc"] = {"volatile_uncorrected": 1}
    topo = tmp_path / "topo.json"
    topo.write_text(json.dumps(data))
    assert listing(topo=topo)[0]["health"]["reasons"] == ["1 volatile uncorrectable ECC error"]


def test_an_application_xid_leaves_the_card_healthy(fakegpu: Path, tmp_path: Path) -> None:
    faults = fault_file(tmp_path, {A800: {"xid": [13, 31, 43, 45, 68, 109]}})
    assert listing(faults)[0]["health"] == {"healthy": True, "reasons": [], "since": None}


def test_unknown_health_is_not_healthy(fakegpu: Path, tmp_path: Path) -> None:
    faults = fault_file(tmp_path, {A800: {"memory_query_error": 999}})
    card = listing(faults)[0]
    assert card["health"]["healthy"] is None
    assert card["health"]["reasons"] == ["NVML could not read its memory errors: Unknown Error"]
    r = cli("run", "--dry-run", "--gpu", "0", TEST_IMAGE, faults=faults)  # named: started, with a warning
    assert chosen(r) == A800 and f"hostagent: warning: the health of {A800} is unknown" in r.stderr
    assert cli("ls", "--format", "{index} {healthy}", faults=faults).stdout.splitlines()[0] == "0 N/A"
    table = cli("ls", faults=faults).stdout.splitlines()
    assert table[3].split(None, 1) == ["health", "unknown: NVML could not read its memory errors: Unknown Error"]


def test_fault_file_changes_between_runs(fakegpu: Path, tmp_path: Path) -> None:
    """The file is read when the run reads the cards: a card broken or healed between two runs is seen so."""
    faults = fault_file(tmp_path, {A800: {"lost": True}})
    assert listing(faults)[0]["health"]["healthy"] is False
    faults.write_text("{}")
    assert listing(faults)[0]["health"]["healthy"] is True


@pytest.mark.parametrize(
    ("memory", "xids", "expected"),
    [
        ({}, [], (True, [])),
        ({}, [79, 79, 13], (False, ["XID 79 (fallen off the bus)"])),
        (
            {"ecc_uncorrected": 1, "remap_pending": True, "remap_failure": True},
            [],
            (False, ["1 volatile uncorrectable ECC error", "row remapping failed"]),
        ),
        ({"error": "Unknown Error"}, [], (None, ["NVML could not read its memory errors: Unknown Error"])),
        ({"error": "Unknown Error"}, [95], (False, ["XID 95 (uncontained ECC error)"])),  # bad is bad, read or not
        ({"lost": True, "error": "GPU is lost"}, [], (False, ["lost to NVML"])),
    ],
)
def test_judge(memory: dict[str, Any], xids: list[int], expected: tuple[bool | None, list[str]]) -> None:
    m = MemoryHealth()
    for k, v in memory.items():
        setattr(m, k, v)
    h = health.judge(m, xids, "2026-12-01T00:00:00Z")
    assert (h.healthy, h.reasons) == expected


def test_the_shipped_health_scenario(fakegpu: Path) -> None:
    """fault-health: ECC errors on 1B, ECC off on the 4090 (healthy: nothing to count), a failed row remap on 86,
    health unknown on AF (its golden table: tests/golden/ls-fault-health.txt); --count on it:
    tests/docker/test_health.py."""
    topo = scenario("fault-health")
    assert [(g["health"]["healthy"], g["health"]["reasons"]) for g in listing(topo=topo)] == [
        (False, ["2 volatile uncorrectable ECC errors"]),
        (True, []),
        (False, ["row remapping failed"]),
        (None, ["NVML could not read its memory errors: Unknown Error"]),
    ]
