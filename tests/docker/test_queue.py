"""The agent's fair queue against the sandboxed daemon (both engines): `hostagent run --wait` with the agent up
is served first come, first served; a `--count 2` at the head is not overtaken by later `--count 1`s; named
requests for other cards go ahead; `hostagent queue` lists the waiters; Ctrl-C leaves at once; a restarted agent
keeps the order, and a waiter whose agent is gone for good says so and still gets its card."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.resident import Resident
from tests.support.sandbox import TEST_IMAGE, Agent
from tests.support.scenarios import uuids
from tests.support.wait import wait_for

A800, RTX, A800B, A800C = uuids("mixed-4")  # A800B: a host process (pid 4242) uses it, never free


@pytest.fixture
def resident(agent: Agent) -> Iterator[Resident]:
    r = Resident(agent.env, "--interval", "0.2")
    agent.env["GPUPIN_AGENT_SOCKET"] = r.socket  # the clients find this agent
    yield r
    r.close()


def tag() -> str:
    return uuid.uuid4().hex[:8]


def hold(agent: Agent, gpu: str) -> str:
    name = f"holder-{tag()}"
    res = agent("run", "-d", "--name", name, "--gpu", gpu, TEST_IMAGE, "sleep", "300")
    assert res.returncode == 0, res.stderr
    return name


def free(agent: Agent, name: str) -> None:
    agent.sandbox.docker("rm", "-f", name, check=True)


def waiters(r: Resident) -> list[dict[str, Any]]:
    status, body, _ = r.get("/api/queue")
    assert status == 200, body
    listed: list[dict[str, Any]] = json.loads(body)["waiters"]
    return listed


def names(r: Resident) -> list[str | None]:
    return [w["name"] for w in waiters(r)]


class Waiter:
    """`hostagent run --wait` in the background; its container prints when it started and what it was given."""

    def __init__(self, agent: Agent, r: Resident, *request: str, work: str = "true") -> None:
        self.name = f"waiter-{tag()}"
        self.proc = agent.popen(
            "run",
            "--rm",
            "--name",
            self.name,
            *request,
            "--wait",
            "120",
            TEST_IMAGE,
            "--quiet",
            "sh",
            "-c",
            f"date +%s.%N; echo $GPUPIN_EXPECT; {work}",
        )
        wait_for(lambda: self.name in names(r) or self.proc.poll() is not None, 60, f"{self.name} in the queue")
        assert self.proc.poll() is None, self.proc.communicate()
        self.started = 0.0
        self.expect = ""
        self.stderr = ""

    def says(self, text: str) -> None:
        """Read its stderr until a line says `text` (kept for `finish`)."""
        assert self.proc.stderr is not None
        while True:
            line = self.proc.stderr.readline()
            assert line, f"{self.name} ended without saying {text!r}: {self.stderr}"
            self.stderr += line
            if text in line:
                return

    def finish(self, timeout: float = 120) -> Waiter:
        """Wait for it to end; it must have run its container (exit 0)."""
        out, err = self.proc.communicate(timeout=timeout)
        self.stderr += err
        assert self.proc.returncode == 0, (self.proc.returncode, self.stderr)
        started, self.expect = out.split("\n")[:2]
        self.started = float(started)
        return self

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture
def started() -> Iterator[list[Waiter]]:
    """The waiters a test started, ended after it, passed or not."""
    out: list[Waiter] = []
    yield out
    for w in out:
        w.kill()


def test_first_come_first_served_and_hostagent_queue_lists_them(
    agent: Agent, resident: Resident, started: list[Waiter]
) -> None:
    holder = hold(agent, "1")
    for _ in range(3):
        started.append(Waiter(agent, resident, "--gpu", "1", work="sleep 0.3"))
    first, second, third = started
    listed = waiters(resident)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert [(w["position"], w["name"], w["user"], w["request"], w["turn"]) for w in listed] == [
        (n, w.name, me, "--gpu 1", False) for n, w in enumerate(started, 1)
    ]
    assert listed[0]["since"] < listed[1]["since"] < listed[2]["since"] <= time.time()
    metrics = resident.get("/metrics")[1].decode()
    assert "\ngpupin_queue_waiters 3.0\n" in metrics and "\ngpupin_queue_oldest_wait_seconds " in metrics
    cli = agent("queue", "--json")
    assert cli.returncode == 0, cli.stderr
    assert [w["name"] for w in json.loads(cli.stdout)["waiters"]] == [w.name for w in started]
    table = agent("queue")
    assert table.returncode == 0, table.stderr
    head, *rows = table.stdout.splitlines()
    assert head.split() == ["#", "NAME", "USER", "REQUEST", "IMAGE", "WAITING", "TURN"]
    assert [r.split()[:5] for r in rows] == [[str(n), w.name, me, "--gpu", "1"] for n, w in enumerate(started, 1)]
    assert all(TEST_IMAGE in r and "(since " in r for r in rows), rows
    free(agent, holder)
    for w in started:
        w.finish()
    assert first.started < second.started < third.started
    assert all(RTX in w.expect for w in started)
    assert "in the queue of the agent at unix://" in first.stderr
    wait_for(lambda: waiters(resident) == [], 5, "the queue to empty")
    assert agent("queue").stdout == "no request is waiting\n"


def test_a_count_2_at_the_head_is_not_overtaken_by_later_count_1s(
    agent: Agent, resident: Resident, started: list[Waiter]
) -> None:
    holders = [hold(agent, gpu) for gpu in ("0", "1", "3")]  # card 2 is a host process's: never free
    pair = Waiter(agent, resident, "--count", "2", work="sleep 2")
    started += [pair, Waiter(agent, resident, "--count", "1"), Waiter(agent, resident, "--count", "1")]
    assert [w["request"] for w in waiters(resident)] == ["--count 2", "--count 1", "--count 1"]
    free(agent, holders[0])
    wait_for(lambda: resident.card(A800)["state"] == "free", 10, "card 0 free in the agent's view")
    # A newcomer that finds the card free does not take it either: it queues behind the count.
    late = Waiter(agent, resident, "--count", "1")
    started.append(late)
    # One card is free, and three later requests could take it: the count 2 at the head holds them back.
    until = time.monotonic() + 3
    while time.monotonic() < until:
        assert all(w.proc.poll() is None for w in started), [w.proc.communicate() for w in started]
        assert resident.card(A800)["state"] == "free" and len(waiters(resident)) == 4
        time.sleep(0.2)
    free(agent, holders[1])
    for w in started:
        w.finish()
    assert sorted(pair.expect.replace("@", ",").split(",")[::2]) == sorted([A800, RTX])
    assert pair.started < min(w.started for w in started[1:])
    assert "waiting in the queue of the agent at unix://" in late.stderr and "waiting: " not in late.stderr


def test_named_requests_for_other_cards_go_ahead(agent: Agent, resident: Resident, started: list[Waiter]) -> None:
    on0, on1 = hold(agent, "0"), hold(agent, "1")
    started += [Waiter(agent, resident, "--gpu", "0"), Waiter(agent, resident, "--gpu", "1")]
    head, later = started
    free(agent, on1)
    later.finish(timeout=60)
    assert RTX in later.expect
    assert head.proc.poll() is None and names(resident) == [head.name]
    free(agent, on0)
    assert A800 in head.finish().expect


def test_ctrl_c_leaves_the_queue_at_once(agent: Agent, resident: Resident, started: list[Waiter]) -> None:
    holder = hold(agent, "1")
    started += [Waiter(agent, resident, "--gpu", "1"), Waiter(agent, resident, "--gpu", "1")]
    gone, stays = started
    gone.proc.send_signal(signal.SIGINT)
    wait_for(lambda: names(resident) == [stays.name], 1.0, "the interrupted waiter out of the queue", interval=0.02)
    _, err = gone.proc.communicate(timeout=10)
    assert gone.proc.returncode == 130, err
    assert "SIGINT before the container started: nothing left behind" in err
    assert agent.sandbox.docker("ps", "-aq", "--filter", f"name=^{gone.name}$", check=True).stdout == ""
    free(agent, holder)
    stays.finish()


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "restart"])
def test_a_restarted_agent_keeps_the_order(
    agent: Agent, resident: Resident, started: list[Waiter], stop: signal.Signals
) -> None:
    holder = hold(agent, "1")
    started += [Waiter(agent, resident, "--gpu", "1", work="sleep 0.3") for _ in range(3)]
    before = [(w["name"], w["since"]) for w in waiters(resident)]
    resident.kill(stop)
    again = Resident(agent.env, "--interval", "0.2", directory=resident.dir)
    try:
        wait_for(lambda: len(waiters(again)) == 3, 30, "the waiters back in the restarted agent's queue")
        assert [(w["name"], w["since"]) for w in waiters(again)] == before
        free(agent, holder)
        for w in started:
            w.finish()
    finally:
        again.close()
    assert started[0].started < started[1].started < started[2].started
    assert all("is back: position" in w.stderr and "queued as new" not in w.stderr for w in started)


def test_a_waiter_whose_agent_is_gone_says_so_and_still_gets_its_card(
    agent: Agent, resident: Resident, started: list[Waiter]
) -> None:
    holder = hold(agent, "1")
    started.append(Waiter(agent, resident, "--gpu", "1"))
    started[0].says("waiting in the queue of the agent at")  # its first look is over: it waits for its turn
    resident.kill()
    shutil.rmtree(resident.dir)  # no agent comes back
    free(agent, holder)
    w = started[0].finish()
    assert RTX in w.expect
    lines = [line for line in w.stderr.splitlines() if "went away" in line]
    assert lines == [
        f"hostagent: the agent at unix://{resident.socket} went away: waiting without its queue (back "
        "in it if the agent returns within 30 s)"
    ]


def test_without_an_agent_queue_says_so(agent: Agent, tmp_path: Any) -> None:
    res = agent("queue", GPUPIN_AGENT_SOCKET=str(tmp_path / "none.sock"))
    assert res.returncode == 69 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "no resident agent answers at unix://" in res.stderr, res.stderr
    # --wait without an agent polls as it always did.
    holder = hold(agent, "1")
    run = agent.popen(
        "run", "--rm", "--gpu", "1", "--wait", "60", TEST_IMAGE, "true", GPUPIN_AGENT_SOCKET=str(tmp_path / "none.sock")
    )
    assert run.stderr is not None
    said = run.stderr.readline()
    assert said.startswith("hostagent: waiting: "), said  # waiting, with no queue, when the card frees
    free(agent, holder)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 0 and "queue" not in said + err, said + err
