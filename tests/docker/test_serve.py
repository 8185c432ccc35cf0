"""`hostagent serve` against the sandboxed daemon (both engines): its /api/ls is `hostagent ls --json`'s object, a
change reaches it within a second, its metrics name each card and holder and keep no stale series, idle holders are
flagged, `ls --host` reads it (one host or several), and a restart of the daemon is survived."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.record import intervals, run_time
from tests.support.resident import Resident
from tests.support.sandbox import SANDBOX_SCRIPT, TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")


@pytest.fixture
def resident(agent: Agent) -> Iterator[Resident]:
    r = Resident(agent.env, "--idle-after", "1s", "--interval", "0.2")
    yield r
    r.close()


def holders(r: Resident, uuid_: str) -> list[str]:
    return [h["name"] for h in r.card(uuid_)["holders"] if h["holds"]]


def pinned(agent: Agent, gpu: str, name: str) -> str:
    """A pinned container that runs until removed (hostagent run -d)."""
    res = agent("run", "-d", "--name", name, "--gpu", gpu, TEST_IMAGE, "sleep", "300")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def samples(r: Resident) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body, ctype = r.get("/metrics")
    assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_api_ls_is_what_ls_json_prints(agent: Agent, resident: Resident) -> None:
    name = f"serve-{uuid.uuid4().hex[:8]}"
    pinned(agent, "0", name)
    wait_for(lambda: holders(resident, A800) == [name], 10, "the holder in the agent's view")
    cli = agent("ls", "--json")
    assert cli.returncode == 0, cli.stderr
    api = resident.ls()
    # The differences, by design: one reading cannot tell idle, so `ls` alone leaves those fields null; and it
    # keeps no record.
    assert all(g["idle"] is None and g["idle_seconds"] is None for g in json.loads(cli.stdout)["gpus"])
    assert json.loads(cli.stdout)["record"] is None and api["record"]["degraded"] is None
    for g in api["gpus"]:
        g["idle"] = g["idle_seconds"] = None
    api["record"] = None
    assert api == json.loads(cli.stdout)
    # The CLI's own client reads the very same object, over the unix socket and over HTTP.
    over_unix = agent("ls", "--json", "--host", f"unix://{resident.socket}")
    over_http = agent("ls", "--json", "--host", resident.url)
    assert over_unix.returncode == over_http.returncode == 0, over_unix.stderr + over_http.stderr
    assert json.loads(over_unix.stdout)["gpus"][0]["holders"][0]["name"] == name
    assert json.loads(over_unix.stdout).keys() == json.loads(cli.stdout).keys()
    status, body, _ = resident.get("/api/ls", unix=True)
    assert status == 200 and json.loads(body)["gpus"][0]["holders"][0]["name"] == name


def test_a_change_reaches_the_view_within_a_second(agent: Agent, resident: Resident) -> None:
    name = f"serve-{uuid.uuid4().hex[:8]}"
    pinned(agent, "1", name)
    started = time.monotonic()
    wait_for(lambda: holders(resident, RTX) == [name], 1.0, "the new holder", interval=0.02)
    seen = time.monotonic() - started
    agent.sandbox.docker("rm", "-f", name, check=True)
    removed = time.monotonic()
    wait_for(lambda: holders(resident, RTX) == [], 1.0, "the holder gone", interval=0.02)
    assert seen < 1.0 and time.monotonic() - removed < 1.0


def test_metrics_per_card_and_holder_and_no_stale_series(agent: Agent, resident: Resident) -> None:
    name = f"serve-{uuid.uuid4().hex[:8]}"
    cid = pinned(agent, "0", name)
    wait_for(lambda: "gpupin_holder_info" in samples(resident), 10, "the holder's series")
    m = samples(resident)
    info = m["gpupin_holder_info"]
    assert [labels for labels, _ in info] == [
        {
            "container": name,
            "container_id": cid,
            "image": TEST_IMAGE,
            "user": "",
            "pinned": "true",
            "verified": "true",
            "UUID": A800,
            "gpu": "0",
            "Hostname": os.uname().nodename,
        }
    ]
    states = {(lab["gpu"], lab["state"]) for lab, v in m["gpupin_gpu_state"] if v == 1}
    # Card 2 runs a host process (pid 4242 in mixed-4) that no container explains: busy.
    assert states == {("0", "held"), ("1", "free"), ("2", "busy"), ("3", "free")}
    card2 = {lab["gpu"]: v for lab, v in m["gpupin_gpu_utilization_percent"]}
    assert card2 == {"0": 0, "1": 0, "2": 87, "3": 0}
    total = {lab["UUID"]: v for lab, v in m["gpupin_gpu_memory_total_bytes"]}
    assert total[RTX] == 24564 * 2**20
    first = m["gpupin_gpu_temperature_celsius"][0][0]
    assert first == {
        "gpu": "0",
        "UUID": A800,
        "pci_bus_id": "00000000:1B:00.0",
        "modelName": "NVIDIA A800-SXM4-80GB",
        "Hostname": os.uname().nodename,
    }
    assert m["gpupin_agent_docker_up"][0][1] == m["gpupin_agent_nvml_up"][0][1] == 1
    agent.sandbox.docker("rm", "-f", cid, check=True)
    wait_for(lambda: "gpupin_holder_info" not in samples(resident), 10, "the holder's series gone")


def test_idle_holders_are_flagged_and_busy_ones_are_not(agent: Agent, resident: Resident) -> None:
    idle = f"serve-idle-{uuid.uuid4().hex[:8]}"
    pinned(agent, "0", idle)
    # Card 2 (87% in mixed-4) held by a container started with docker's own --gpus: held and busy, never idle.
    agent.sandbox.docker(
        "run",
        "-d",
        "--name",
        f"serve-busy-{uuid.uuid4().hex[:8]}",
        "--label",
        f"gpupin.test={agent.tag}",
        "--gpus",
        f"device={A800B}",
        TEST_IMAGE,
        "sleep",
        "300",
        check=True,
    )
    busy = wait_for(lambda: (c := resident.card(A800B))["holders"] and c, 10, "card 2 held")
    assert (busy["idle"], busy["idle_seconds"]) == (False, 0)
    card = wait_for(lambda: (c := resident.card(A800))["idle"] and c, 10, "card 0 idle")
    assert card["idle_seconds"] >= 1
    free = resident.card(RTX)
    assert (free["held"], free["idle"], free["idle_seconds"]) == (False, False, None)
    m = samples(resident)
    assert {lab["gpu"]: v for lab, v in m["gpupin_gpu_idle"]} == {"0": 1, "1": 0, "2": 0, "3": 0}
    table = agent("ls", "--host", resident.url, "--color", "never")
    assert table.returncode == 0 and "IDLE: 0% utilization for" in table.stdout, table.stdout + table.stderr
    # A new holder starts its own stretch: the card is not idle for its predecessor's seconds. The old stretch
    # began at least 1 s before the removal (the card was idle), so it would count more than the time since then.
    agent.sandbox.docker("rm", "-f", idle, check=True)
    removed = time.monotonic()
    pinned(agent, "0", idle + "-next")
    fresh = wait_for(lambda: (c := resident.card(A800))["held"] and c, 10, "the new holder")
    assert [h["name"] for h in fresh["holders"] if h["holds"]] == [idle + "-next"]
    assert fresh["idle_seconds"] <= time.monotonic() - removed


def test_ls_of_several_hosts_is_one_table(agent: Agent, resident: Resident) -> None:
    other = Resident(agent.env)
    try:
        r = agent(
            "ls",
            "--host",
            resident.url,
            "--host",
            f"unix://{other.socket}",
            "--host",
            "127.0.0.1:1",
            "--color",
            "never",
        )
        lines = r.stdout.splitlines()
        host = os.uname().nodename
        assert r.returncode == 0 and lines[0].split()[:3] == ["HOST", "GPU", "NAME"], r.stdout + r.stderr
        assert [ln.split()[:2] for ln in lines[1:9]] == [[host, f"[{i}]"] for i in (0, 1, 2, 3) * 2]
        assert lines[9].startswith("127.0.0.1:1") and "unreachable" in lines[9]
        assert r.stderr.count("WARNING: no agent answers at 127.0.0.1:1") == 1
        j = agent("ls", "--json", "--host", resident.url, "--host", f"unix://{other.socket}")
        data = json.loads(j.stdout)
        assert [len(d["gpus"]) for d in data] == [4, 4] and data[0]["hostname"] == host
        gone = agent("ls", "--host", "127.0.0.1:1")
        assert gone.returncode == 69 and gone.stderr.count("ERROR:") == 1 and "hostagent serve" in gone.stderr
    finally:
        other.close()


def test_a_daemon_restart_is_survived(agent: Agent, resident: Resident) -> None:
    name = f"serve-{uuid.uuid4().hex[:8]}"
    pinned(agent, "0", name)
    wait_for(lambda: holders(resident, A800) == [name], 10, "the holder")
    env = dict(os.environ, GPUPIN_SANDBOX_ENGINE=agent.sandbox.engine)
    began = run_time(agent, name)[0]
    going = time.time()
    subprocess.run([str(SANDBOX_SCRIPT), "down"], env=env, check=True, capture_output=True, timeout=120)
    gone = time.time()
    try:
        view = wait_for(lambda: {} if (v := resident.ls())["docker"]["available"] else v, 10, "Docker unknown")
        # Unknown is not free: no card is free then (card 2 runs mixed-4's pid 4242: busy), none idle.
        assert [g["state"] for g in view["gpus"]] == ["unknown", "unknown", "busy", "unknown"]
        assert all(g["held"] is not False and g["idle"] is None for g in view["gpus"])
        m = samples(resident)
        assert m["gpupin_agent_docker_up"] == [({}, 0.0)] and m["gpupin_agent_nvml_up"] == [({}, 1.0)]
        # The metrics say the same: who holds a card is unknown, not 0, and the cards' readings stay.
        assert {lab["gpu"]: lab["state"] for lab, v in m["gpupin_gpu_state"] if v == 1} == {
            "0": "unknown",
            "1": "unknown",
            "2": "busy",
            "3": "unknown",
        }
        assert "gpupin_gpu_holders" not in m and "gpupin_holder_info" not in m and "gpupin_gpu_idle" not in m
        assert len(m["gpupin_gpu_temperature_celsius"]) == 4
    finally:
        subprocess.run([str(SANDBOX_SCRIPT), "up"], env=env, check=True, capture_output=True, timeout=600)
    wait_for(lambda: resident.ls()["docker"]["available"], 30, "Docker back")
    wait_for(lambda: json.loads(resident.get("/api/agent")[1])["events_followed"], 10, "its events followed again")
    # The record: the holder the daemon's stop ended (the sandbox's daemon comes back without it) is closed once,
    # when it died, as its `die` event or the agent's last sight of it says; nothing while holders were unknown.
    rows = wait_for(lambda: [r for r in intervals(resident.dir / "record.db") if r["end"] is not None], 30, "closed")
    assert len(rows) == 1 and rows[0]["container_name"] == name and abs(rows[0]["start"] - began) < 1.0, rows
    assert going - 1.0 < rows[0]["end"] < gone + 1.0, (rows, going, gone)
    # The event stream is followed again: a new holder appears within a second.
    agent.sandbox.docker("rm", "-f", name)
    second = f"serve-{uuid.uuid4().hex[:8]}"
    pinned(agent, "1", second)
    wait_for(lambda: holders(resident, RTX) == [second], 1.0, "the holder after the restart", interval=0.02)
