"""A crash of the resident agent loses no hold (both engines): the holds are the daemon's containers, not the
agent's memory, so an agent killed with SIGKILL and started again shows every one held at once (/api/ls, /metrics),
and `hostagent run` refuses a held card (75) while it is down and after, a container in the middle of its start
included; a held card lost to NVML keeps its holder in the view. The daemon's own restart is
tests/docker/test_serve.py's; the agent without a daemon, tests/unit/test_serve_robust.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.support.host import REPO
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")
HOOK_DELAY_S = 45  # the second run's start: longer than the crash, the refused runs and the restart, shorter than
# the 60 s a client waits for the daemon's answer to a call (the start call waits on the hook)


def holds(r: Resident) -> dict[str, list[str]]:
    """Each held card's holders, by UUID, in the agent's view."""
    out = {g["uuid"]: [h["name"] for h in g["holders"] if h["holds"]] for g in r.ls()["gpus"]}
    return {u: names for u, names in out.items() if names}


def metric(r: Resident, name: str) -> list[tuple[dict[str, str], float]]:
    text = r.get("/metrics")[1].decode()
    return [(s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def refused(agent: Agent, gpu: str, socket: str) -> str:
    """`hostagent run` on a held card, told where the agent's socket is: refused 75 (its one line)."""
    r = agent("run", "--rm", "--gpu", gpu, TEST_IMAGE, "true", GPUPIN_AGENT_SOCKET=socket)
    errors = [ln for ln in r.stderr.splitlines() if "ERROR:" in ln]
    assert r.returncode == 75 and len(errors) == 1, (gpu, r.returncode, r.stderr)
    return errors[0]


def test_sigkill_and_a_restart_of_the_agent_lose_no_hold(agent: Agent) -> None:
    resident = Resident(agent.env, "--interval", "0.2")
    starting: Any = None
    try:
        running = f"robust-{agent.tag}"
        r = agent("run", "-d", "--name", running, "--gpu", "0", TEST_IMAGE, "sleep", "300")
        assert r.returncode == 0, r.stderr
        # A second client's container, created and still starting (its hook is slow): its client lives, it holds.
        starting = agent.popen(
            "run",
            "--rm",
            "--via",
            "nvidia",
            "--gpu",
            "1",
            "-e",
            f"FAKEGPU_HOOK_DELAY_S={HOOK_DELAY_S}",
            TEST_IMAGE,
            "true",
            GPUPIN_AGENT="0",
        )
        created = wait_for(lambda: agent.containers("created"), 60, "the second run's container created")
        held = {A800: [running], RTX: [created[0]["Names"]]}
        wait_for(lambda: holds(resident) == held, 10, "both holds in the agent's view")
        resident.kill()
        # While it is down: its socket file is left, nothing answers there; the CLI goes to the daemon, and the
        # holds are the daemon's containers.
        assert "being started by hostagent" in refused(agent, "1", resident.socket)
        assert running in refused(agent, "0", resident.socket)
        resident.restart()
        # Its first view is read before it listens: the holds are there at once, not after an event.
        assert holds(resident) == held
        info = {lab["UUID"]: lab["container"] for lab, v in metric(resident, "gpupin_holder_info") if v == 1}
        assert info == {A800: running, RTX: created[0]["Names"]}
        states = {lab["gpu"]: lab["state"] for lab, v in metric(resident, "gpupin_gpu_state") if v == 1}
        assert states == {"0": "held", "1": "held", "2": "busy", "3": "free"}
        assert running in refused(agent, "0", resident.socket)
        assert "being started by hostagent" in refused(agent, "1", resident.socket)
        assert starting.poll() is None, "the slow start ended before the checks: its hold was not proven"
        _, err = starting.communicate(timeout=HOOK_DELAY_S + 60)
        assert starting.returncode == 0, err
    finally:
        resident.close()
        if starting is not None and starting.poll() is None:
            starting.kill()
            starting.communicate()


def test_a_held_card_lost_to_nvml_keeps_its_holder_and_its_identity(agent: Agent, tmp_path: Path) -> None:
    faults = tmp_path / "faults.json"  # the fake NVML re-reads it at every call: the card is lost under the agent
    resident = Resident({**agent.env, "FAKEGPU_FAULTS": str(faults)}, "--interval", "0.2")
    try:
        name = f"robust-{agent.tag}"
        r = agent("run", "-d", "--name", name, "--gpu", "3", TEST_IMAGE, "sleep", "300")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: holds(resident) == {A800C: [name]}, 10, "the holder")
        (tmp_path / "new.json").write_text(json.dumps({"cards": {A800C: {"lost": True}}}))
        os.replace(tmp_path / "new.json", faults)
        wait_for(lambda: resident.card(A800C)["error"] == "GPU is lost", 10, "card 3 lost")
        card = resident.card(A800C)
        # Held still (the listing's word for who holds it, as `hostagent ls` says it), and unhealthy.
        assert (card["state"], card["health"]["healthy"], card["index"]) == ("held", False, 3)
        assert card["utilization_gpu"] is None and card["temperature_c"] is None
        assert holds(resident) == {A800C: [name]}  # who held it when it was lost: what its owner asks first
        info = [(lab["UUID"], lab["container"]) for lab, v in metric(resident, "gpupin_holder_info") if v == 1]
        assert info == [(A800C, name)]
        assert {lab["gpu"]: lab["state"] for lab, v in metric(resident, "gpupin_gpu_state") if v == 1}[
            "3"
        ] == "unhealthy"
        os.unlink(faults)
        wait_for(lambda: resident.card(A800C)["error"] is None, 10, "card 3 back")
        assert resident.card(A800C)["state"] == "held"
    finally:
        resident.close()


PROXY = [sys.executable, str(REPO / "tests" / "support" / "daemon_proxy.py")]


def proxy_to(agent: Agent, sock: Path) -> subprocess.Popen[str]:
    """Another address in front of the sandbox's daemon, to take the daemon away and give it back."""
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    p = subprocess.Popen(
        [*PROXY, "--listen", f"unix://{sock}", "--to", str(agent.sandbox.run_dir / "docker.sock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def test_an_agent_whose_log_is_gone_still_sees_the_daemon_come_back(agent: Agent, tmp_path: Path) -> None:
    """Issue 24: a log write that fails (its stderr pipe closed) is dropped; it must not end the ledger's thread,
    which alone notices that the daemon answers again."""
    sock = tmp_path / "d.sock"
    proxy = proxy_to(agent, sock)
    resident = Resident({**agent.env, "DOCKER_HOST": f"unix://{sock}"}, "--interval", "0.2")
    try:
        wait_for(lambda: resident.ls()["docker"]["available"], 10, "the daemon in the view")
        # Following the daemon's events: the stream's end is what tells it the daemon is gone.
        wait_for(lambda: json.loads(resident.get("/api/agent")[1])["events_followed"], 10, "the event stream")
        time.sleep(0.5)  # its start-up lines are out
        assert resident.proc.stderr is not None
        resident.proc.stderr.close()  # the log's reader is gone: every write now fails (EPIPE)
        resident.proc.stderr = None
        proxy.kill()
        proxy.wait()
        wait_for(lambda: not resident.ls()["docker"]["available"], 10, "the daemon gone from the view")
        proxy = proxy_to(agent, sock)
        wait_for(lambda: resident.ls()["docker"]["available"], 5, "the daemon back in the view")
    finally:
        proxy.kill()
        proxy.wait()
        resident.close()
