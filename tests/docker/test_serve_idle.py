"""Idle cards given back (issue 25, item 2), on the sandboxed daemon with a policy's `[idle]` rule: an idle holder is
warned (in the view and in `ls`), then stopped as `docker stop` stops it (its stop signal: it exits 0 by its own
trap) within 5 s of its stop time; a holder with a compute process on its card is never stopped; the label
gpupin.idle=exempt counts only for an owner the policy allows, a real other user under setpriv included; no user
can claim another's uid with a label (gpupin.booking is hostagent's to write). Without a daemon:
tests/unit/test_serve_idle.py."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.host import HOSTAGENT
from tests.support.processes import on_cards
from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.users import as_other, reach_env, setpriv
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")
AGENT_GID = 5100  # the agent socket's group
ALLOWED, REFUSED = 5004, 5002  # the policy lets 5004 exempt, not 5002 (both may use the daemon)
AFTER, GRACE = 2, 3
POLICY = f"""
[idle]
after = "{AFTER}s"
action = "stop"
grace = "{GRACE}s"
exempt = ["{ALLOWED}"]
"""
# Exits 0 on SIGTERM: a container stopped by its stop signal says so with its exit code (a SIGKILL is 137).
TRAPPED = ["sh", "-c", "trap 'exit 0' TERM; sleep 300 & wait"]


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return path


def serve(agent: Agent, env: dict[str, str]) -> Resident:
    """An agent with the policy, whose socket the agent group may reach (as `--group` gives it)."""
    r = Resident(env, "--interval", "0.2")
    os.chmod(r.dir, 0o755)
    os.chown(r.socket, 0, AGENT_GID)
    agent.env["GPUPIN_AGENT_SOCKET"] = r.socket
    return r


@pytest.fixture
def resident(agent: Agent, policy: Path) -> Iterator[Resident]:
    r = serve(agent, {**agent.env, "GPUPIN_POLICY": str(policy)})
    yield r
    r.close()


def run_as(agent: Agent, uid: int | None, name: str, gpu: str, *options: str) -> subprocess.CompletedProcess[str]:
    """`hostagent run -d` through the agent, as root or as a real other user who may use the daemon."""
    docker_gid = os.stat(agent.sandbox.host[len("unix://") :]).st_gid
    argv = [HOSTAGENT, "run", "-d", "--name", name, "--label", f"gpupin.test={agent.tag}", "--gpu", gpu]
    argv += [*options, TEST_IMAGE, *TRAPPED]
    env = {**agent.env, "HOME": "/tmp"}
    if uid is not None:
        argv, env = as_other(setpriv(uid, AGENT_GID, docker_gid), argv), reach_env(env)
    return subprocess.run(
        argv,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def state(agent: Agent, name: str) -> dict[str, Any]:
    out = agent.sandbox.docker("inspect", "-f", "{{json .State}}", name, check=True).stdout
    data: dict[str, Any] = json.loads(out)
    return data


def finished(agent: Agent, name: str) -> float:
    """When the container ended, by the daemon's FinishedAt (RFC 3339, nanoseconds), in seconds since the epoch."""
    from gpupin.hostagent.engine import created_time

    return created_time(state(agent, name)["FinishedAt"])


def test_an_idle_holder_is_warned_then_stopped_within_5s_of_its_time(agent: Agent, resident: Resident) -> None:
    name = f"idle-{uuid.uuid4().hex[:8]}"
    r = run_as(agent, None, name, "0")
    assert r.returncode == 0, r.stderr
    card = wait_for(lambda: (c := resident.card(A800))["idle_warning"] and c, AFTER + 10, "the idle warning")
    warning = card["idle_warning"]
    assert warning["container"] == name and warning["stop_at"] - warning["since"] >= AFTER + GRACE - 1
    table = agent("ls", "--host", resident.url, "--color", "never")
    stop_at = time.strftime("%H:%M:%S", time.localtime(warning["stop_at"]))
    assert f"{name} warned, will be stopped at {stop_at}" in table.stdout, table.stdout + table.stderr
    wait_for(lambda: not state(agent, name)["Running"], GRACE + 15, "the idle holder stopped")
    late = finished(agent, name) - warning["stop_at"]
    print(f"idle stop took effect {late:.2f} s after its time")
    assert -0.5 < late < 5.0, late
    assert state(agent, name)["ExitCode"] == 0  # its stop signal (SIGTERM), trapped: not a SIGKILL
    assert wait_for(lambda: not resident.card(A800)["held"], 5, "the card freed")


def test_a_holder_with_a_compute_process_is_never_stopped(agent: Agent, policy: Path, tmp_path: Path) -> None:
    procs = tmp_path / "p.json"
    procs.write_text("{}")
    r = serve(agent, {**agent.env, "GPUPIN_POLICY": str(policy), "FAKEGPU_PROCESSES": str(procs)})
    try:
        name = f"busy-{uuid.uuid4().hex[:8]}"
        res = run_as(agent, None, name, "1")
        assert res.returncode == 0, res.stderr
        pid = int(agent.sandbox.docker("inspect", "-f", "{{.State.Pid}}", name, check=True).stdout)
        on_cards(procs, {RTX: [pid]})  # its own process, at 0% load: working (waiting on its input)
        deadline = time.monotonic() + AFTER + GRACE + 5
        while time.monotonic() < deadline:
            card = r.card(RTX)
            assert card["idle"] is False and card["idle_warning"] is None, card
            time.sleep(0.5)
        assert state(agent, name)["Running"]
    finally:
        r.close()


def test_the_exempt_label_counts_only_where_the_policy_allows(agent: Agent, resident: Resident) -> None:
    allowed, refused = f"exempt-ok-{uuid.uuid4().hex[:8]}", f"exempt-no-{uuid.uuid4().hex[:8]}"
    for uid, name, gpu in ((ALLOWED, allowed, "0"), (REFUSED, refused, "1")):
        res = run_as(agent, uid, name, gpu, "--label", "gpupin.idle=exempt")
        assert res.returncode == 0, res.stderr
        booked = agent.sandbox.docker("inspect", "-f", '{{index .Config.Labels "gpupin.booking"}}', name).stdout
        assert booked.startswith(f"uid={uid} "), booked
    # A user who names another's uid (root's, who may always exempt) is refused: the agent writes that label.
    forged = run_as(
        agent,
        REFUSED,
        f"forged-{agent.tag}",
        "3",
        "--label",
        "gpupin.idle=exempt",
        "--label",
        "gpupin.booking=uid=0 since=1",
    )
    assert forged.returncode == 64 and "gpupin.booking" in forged.stderr and "Traceback" not in forged.stderr, forged
    wait_for(lambda: not state(agent, refused)["Running"], AFTER + GRACE + 15, "the refused exemption stopped")
    assert state(agent, allowed)["Running"] and resident.card(A800)["idle"] is True
    assert resident.card(A800)["idle_warning"] is None
