"""The resident agent's robustness on the simulated host, without a daemon (tests/docker/test_serve_robust.py has
the daemon's share): SIGTERM ends it with exit 0 within 5 s while clients hold connections and while a read waits
on a Docker daemon that does not answer, even before its first view; one card lost, or one reading failing, is
shown unknown while the other cards answer, never as the last value read, and is read again once it answers; a
daemon that hangs delays who holds which card, not the cards' readings."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.host import HOSTAGENT, simhost_env
from tests.support.resident import STOP_LIMIT, Resident
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

NO_DOCKER = "unix:///nonexistent/docker.sock"
A800, RTX, A800B, A800C = uuids("mixed-4")
READINGS = (
    "gpupin_gpu_utilization_percent",
    "gpupin_gpu_memory_used_bytes",
    "gpupin_gpu_memory_total_bytes",
    "gpupin_gpu_power_watts",
    "gpupin_gpu_temperature_celsius",
    "gpupin_gpu_processes",
)


class Wedged:
    """A Docker socket that accepts every connection and never answers: a daemon wedged (or a proxy in front of
    one). `accepted` counts the connections, kept open until the end."""

    def __init__(self, path: Path) -> None:
        self.host = f"unix://{path}"
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(64)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.held.append(conn)

    @property
    def accepted(self) -> int:
        return len(self.held)

    def close(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def wedged(tmp_path: Path) -> Iterator[Wedged]:
    w = Wedged(tmp_path / "docker.sock")
    yield w
    w.close()


def series(agent: Resident) -> dict[str, dict[str, float]]:
    """Every gpupin series of /metrics: name -> {card index (and state/health), value}."""
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(agent.get("/metrics")[1].decode()):
        for s in fam.samples:
            key = "/".join(s.labels[k] for k in ("gpu", "state", "health") if k in s.labels)
            out.setdefault(s.name, {})[key] = s.value
    return out


def uuid_of(agent: Resident, gpu: str) -> str:
    """The UUID label of card `gpu`'s state series."""
    text = agent.get("/metrics")[1].decode()
    return next(
        s.labels["UUID"]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "gpupin_gpu_state" and s.labels["gpu"] == gpu
    )


def cards_if(agent: Resident, ok: Callable[[list[dict[str, Any]]], bool]) -> list[dict[str, Any]]:
    """The agent's cards when `ok` says so of them, else nothing (to wait on)."""
    cards: list[dict[str, Any]] = agent.ls()["gpus"]
    return cards if ok(cards) else []


def replace(path: Path, content: object) -> None:
    """Write the fake's fault or process file atomically, as it asks (a half-written file reads as malformed)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(json.dumps(content))
    os.replace(tmp, path)


def test_sigterm_while_the_first_read_waits_on_a_wedged_daemon_is_exit_0_within_5_s(
    wedged: Wedged, tmp_path: Path
) -> None:
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(
        [HOSTAGENT, "serve", "--socket", str(sock), "--http", "none"],
        env=simhost_env(DOCKER_HOST=wedged.host),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: wedged.accepted, 30, "the agent's first ledger read to reach the daemon")
        assert proc.poll() is None
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=STOP_LIMIT + 10)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and took < STOP_LIMIT, (proc.returncode, took, err)
    assert "stopping before the first view was read" in err and not sock.exists(), err


def test_sigterm_with_clients_connected_and_a_read_waiting_on_the_daemon_is_exit_0_within_5_s(wedged: Wedged) -> None:
    agent = Resident(simhost_env(DOCKER_HOST=wedged.host), "--interval", "0.2")
    clients: list[socket.socket] = []
    try:
        view = agent.ls()  # the first read gave up on the daemon: holders unknown, cards read
        assert view["docker"]["available"] is False and len(view["gpus"]) == 4
        # A dashboard's stream on each listener, a request cut off in its headers, a connection that says nothing.
        for unix in (False, True):
            s = socket.socket(socket.AF_UNIX) if unix else socket.create_connection(("127.0.0.1", agent.port))
            if unix:
                s.connect(agent.socket)
            s.sendall(b"GET /api/events HTTP/1.0\r\n\r\n")
            assert s.recv(12).startswith(b"HTTP/1.0 200")
            clients.append(s)
        half = socket.create_connection(("127.0.0.1", agent.port))
        half.sendall(b"GET /api/ls HTTP/1.1\r\nHost: agent\r\n")
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(agent.socket)
        clients += [half, silent]
        # A read of the ledger in flight now (the daemon holds it until the client's timeout).
        now = wedged.accepted
        wait_for(lambda: wedged.accepted > now, 30, "another ledger read to reach the daemon")
    finally:
        agent.close()  # exit 0 within 5 s, its socket removed
        for s in clients:
            s.close()


def test_a_wedged_daemon_delays_who_holds_which_card_never_the_cards_readings(wedged: Wedged, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    agent = Resident(simhost_env(DOCKER_HOST=wedged.host, FAKEGPU_FAULTS=str(faults)), "--interval", "0.2")
    try:
        now = wedged.accepted
        wait_for(lambda: wedged.accepted > now, 30, "a ledger read waiting on the daemon")
        replace(faults, {"cards": {"3": {"lost": True}}})
        # Each ledger read waits 10 s for the daemon; the cards are read every 0.2 s all the same.
        wait_for(lambda: agent.ls()["gpus"][3]["error"] == "GPU is lost", 3, "the card's loss, within 3 s")
        assert agent.ls()["docker"]["available"] is False
    finally:
        agent.close()


def test_one_card_lost_while_the_others_answer_is_unhealthy_without_stale_readings(tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"
    agent = Resident(simhost_env(DOCKER_HOST=NO_DOCKER, FAKEGPU_FAULTS=str(faults)), "--interval", "0.2")
    try:
        assert series(agent)["gpupin_gpu_temperature_celsius"]["3"] == 30
        replace(faults, {"cards": {"3": {"lost": True}}})
        lost = wait_for(lambda: cards_if(agent, lambda v: v[3]["error"] is not None), 10, "card 3 lost")[3]
        assert lost["error"] == "GPU is lost" and lost["health"]["reasons"] == ["lost to NVML"]
        # The agent read it before: it keeps its identity, so that its holders and series stay its own.
        assert (lost["uuid"], lost["bus_id"], lost["name"]) == (A800C, "00000000:AF:00.0", "NVIDIA A800-SXM4-80GB")
        assert lost["health"]["healthy"] is False and lost["state"] != "free"
        assert all(
            lost[k] is None
            for k in (
                "utilization_gpu",
                "memory_used_mib",
                "temperature_c",
                "power_draw_w",
                "compute_processes",
                "idle",
                "idle_seconds",
            )
        )
        others = agent.ls()["gpus"][:3]
        assert [g["error"] for g in others] == [None] * 3 and others[2]["utilization_gpu"] == 87
        m = series(agent)
        assert m["gpupin_agent_nvml_up"][""] == 1  # NVML answers: only that card is unknown
        for name in READINGS:  # the lost card's readings are gone, not the last ones read; the others' stay
            assert "3" not in m[name] and {"0", "1", "2"} <= m[name].keys(), name
        assert m["gpupin_gpu_state"]["3/unhealthy"] == m["gpupin_gpu_health"]["3/unhealthy"] == 1
        assert uuid_of(agent, "3") == A800C
        os.unlink(faults)  # the card answers again (a reset, in life): read again at the next refresh
        back = wait_for(lambda: cards_if(agent, lambda v: v[3]["error"] is None), 10, "card 3 back")[3]
        assert back["uuid"] == A800C and back["health"]["healthy"] is True and back["temperature_c"] == 30
        assert series(agent)["gpupin_gpu_health"]["3/healthy"] == 1
    finally:
        agent.close()


def test_a_reading_that_fails_is_unknown_for_that_card_alone(tmp_path: Path) -> None:
    faults, procs = tmp_path / "faults.json", tmp_path / "procs.json"
    agent = Resident(
        simhost_env(DOCKER_HOST=NO_DOCKER, FAKEGPU_FAULTS=str(faults), FAKEGPU_PROCESSES=str(procs)),
        "--interval",
        "0.2",
    )
    try:
        # Card 2's process list fails (its other readings answer); card 3's memory-error counters fail.
        replace(procs, {A800B: "unknown_error"})
        replace(faults, {"cards": {A800C: {"memory_query_error": 999}}})
        gpus = wait_for(
            lambda: cards_if(agent, lambda v: v[2]["compute_processes"] is None and v[3]["health"]["healthy"] is None),
            10,
            "both readings unknown",
        )
        assert gpus[2]["processes"] == [] and gpus[2]["utilization_gpu"] == 87 and gpus[2]["state"] != "free"
        assert gpus[3]["health"]["reasons"] == ["NVML could not read its memory errors: Unknown Error"]
        m = series(agent)
        assert "2" not in m["gpupin_gpu_processes"] and m["gpupin_gpu_processes"]["0"] == 0
        assert m["gpupin_gpu_health"]["3/unknown"] == 1 and m["gpupin_gpu_health"]["3/healthy"] == 0
        assert m["gpupin_gpu_utilization_percent"]["2"] == 87 and m["gpupin_agent_nvml_up"][""] == 1
        os.unlink(procs)
        os.unlink(faults)
        gpus = wait_for(
            lambda: cards_if(agent, lambda v: v[2]["compute_processes"] == 1 and v[3]["health"]["healthy"] is True),
            10,
            "both readings back",
        )
        assert [p["pid"] for p in gpus[2]["processes"]] == [4242]
    finally:
        agent.close()
