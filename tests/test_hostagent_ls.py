"""`hostagent ls`: the cards from NVML, the holders from Docker, and graceful degradation of each."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TEST_IMAGE, Sandbox, gpu_uuids, serves_cdi, simhost_env

A800, RTX, A800B, A800C = gpu_uuids("mixed-4")
HOSTAGENT = str(REPO / ".venv" / "bin" / "hostagent")


def ls(*args: str, scenario_name: str = "mixed-4", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HOSTAGENT, "ls", *args], env=simhost_env(scenario_name, **env), capture_output=True,
                          text=True, timeout=60)


def by_uuid(listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["uuid"]: g for g in listing["gpus"] if g["uuid"]}


def test_without_docker_the_cards_are_listed_and_the_listing_says_so(fakegpu: Path, tmp_path: Path) -> None:
    r = ls("--json", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["docker"]["available"] is False and "does not answer" in data["docker"]["error"]
    assert [(g["index"], g["uuid"], g["bus_id"], g["name"]) for g in data["gpus"]] == [
        (0, A800, "00000000:1B:00.0", "NVIDIA A800-SXM4-80GB"),
        (1, RTX, "00000000:3B:00.0", "NVIDIA GeForce RTX 4090"),
        (2, A800B, "00000000:86:00.0", "NVIDIA A800-SXM4-80GB"),
        (3, A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB"),
    ]
    busy = by_uuid(data)[A800B]
    assert (busy["memory_total_mib"], busy["memory_used_mib"], busy["memory_free_mib"]) == (81920, 40962, 40958)
    assert (busy["utilization_gpu"], busy["compute_processes"], busy["mig_mode"]) == (87, 1, False)
    assert r.stderr.startswith(f"hostagent: WARNING: Docker unavailable at unix://{tmp_path}/none.sock (")
    plain = ls(DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    table = plain.stdout  # the listing only: the diagnostic is on stderr
    assert table.splitlines()[0].split()[:4] == ["IDX", "UUID", "BUS", "ID"] and len(table.splitlines()) == 5
    assert "Docker unavailable" not in table and "who holds which card is unknown" in plain.stderr


def test_a_lost_card_is_shown_not_a_crash(fakegpu: Path, tmp_path: Path) -> None:
    r = ls("--json", scenario_name="fault-lost", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    assert r.returncode == 0, r.stderr
    gpus = json.loads(r.stdout)["gpus"]
    assert [g["error"] for g in gpus] == [None, None, "GPU is lost", None]
    assert "ERROR: GPU is lost" in ls(scenario_name="fault-lost", DOCKER_HOST=f"unix://{tmp_path}/n.sock").stdout


def test_nvml_unusable_is_69(fakegpu: Path) -> None:
    r = ls(scenario_name="fault-nvml-unknown")
    assert r.returncode == 69
    assert "Failed to initialize NVML: Unknown Error" in r.stderr and "HINT:" in r.stderr


def test_mig_devices_are_listed_under_their_card(fakegpu: Path, tmp_path: Path) -> None:
    r = ls("--json", scenario_name="mig", DOCKER_HOST=f"unix://{tmp_path}/none.sock")
    mig = [g for g in json.loads(r.stdout)["gpus"] if g["mig_mode"]]
    assert len(mig) == 1 and len(mig[0]["mig_devices"]) == 2
    assert all(m["uuid"].startswith("MIG-") for m in mig[0]["mig_devices"])


@pytest.fixture
def tagged(mixed4_sandbox: Sandbox) -> Iterator[str]:
    tag = uuid.uuid4().hex[:12]
    yield tag
    ids = mixed4_sandbox.docker("ps", "-aq", "--filter", f"label=gpupin.test={tag}").stdout.split()
    if ids:
        mixed4_sandbox.docker("rm", "-f", *ids)


def test_holders_pinned_and_foreign(mixed4_sandbox: Sandbox, tagged: str) -> None:
    sb = mixed4_sandbox
    env = simhost_env("mixed-4", DOCKER_HOST=sb.host)
    run = [HOSTAGENT, "run", "-d", "--label", f"gpupin.test={tagged}"]
    pinned = subprocess.run([*run, "--name", f"pinned-{tagged}", "--gpu", "1", TEST_IMAGE, "sleep", "60"], env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([HOSTAGENT, "run", "--label", f"gpupin.test={tagged}", "--name", f"done-{tagged}", "--gpu",
                    "3", TEST_IMAGE, "true"], env=env, capture_output=True, check=True)
    sb.docker("run", "-d", "--name", f"legacy-{tagged}", "--label", f"gpupin.test={tagged}", "--gpus", "1",
              TEST_IMAGE, "sleep", "60", check=True)
    sb.docker("run", "-d", "--name", f"bydevice-{tagged}", "--label", f"gpupin.test={tagged}", "--gpus",
              "device=2", TEST_IMAGE, "sleep", "60", check=True)
    r = ls("--json", DOCKER_HOST=sb.host)
    assert r.returncode == 0, r.stderr
    cards = by_uuid(json.loads(r.stdout))
    who = {u: sorted((h["name"], h["state"], h["how"], h["via"], h["holds"]) for h in g["holders"])
           for u, g in cards.items()}
    way = "CDI" if serves_cdi(sb) else "--gpus"  # which way the daemon gave hostagent's containers their cards
    assert who[RTX] == [(f"pinned-{tagged}", "running", "gpupin", way, True)]
    assert who[A800] == [(f"legacy-{tagged}", "running", "--gpus 1", "--gpus", True)]
    assert who[A800B] == [(f"bydevice-{tagged}", "running", "--gpus device=2", "--gpus", True)]
    assert who[A800C] == [(f"done-{tagged}", "exited", "gpupin", way, False)]
    assert [cards[u]["held"] for u in (A800, RTX, A800B, A800C)] == [True, True, True, False]
    assert cards[RTX]["holders"][0]["id"] == pinned
    table = ls(DOCKER_HOST=sb.host).stdout
    assert f"pinned-{tagged} ({pinned[:12]}, running, gpupin via {way})" in table
    assert f"legacy-{tagged}" in table and "--gpus 1" in table and "[+1 stopped]" in table
