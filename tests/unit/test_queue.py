"""The fair queue's rule (gpupin.hostagent.serve.fair) over views written by hand: first come, first served; an
earlier --count N holds later requests of any size back; named requests for other cards go ahead; a turn that is
out keeps its cards; a lapsed turn is passed over; a count past the host's cards holds no one back; a turn is unused
while its cards stay usable; --share and --count's limits as `run` reads them. The
`hostagent queue` table. And the agent's side without a daemon (no card is ever usable then: unknown is not free):
bad requests refused with 64, the kernel's user listed, a waiter gone as soon as its connection closes."""

from __future__ import annotations

import json
import os
import pwd
import time
from typing import Any

import pytest

from gpupin.core.errors import GpupinError, GpuSpecError
from gpupin.hostagent.agentlink import Link
from gpupin.hostagent.engine import address
from gpupin.hostagent.ls.model import Listing
from gpupin.hostagent.queue.args import table
from gpupin.hostagent.run.queueing import QueueClient, _Stream
from gpupin.hostagent.run.request import RunRequest
from gpupin.hostagent.serve import fair
from tests.support.host import hostagent, simhost_env
from tests.support.resident import Resident
from tests.support.wait import wait_for

UUIDS = [f"GPU-{n}{n}{n}{n}0000-0000-0000-0000-00000000000{n}" for n in range(4)]


def card(
    n: int, state: str = "free", util: int | None = 0, used: int = 0, healthy: bool | None = True, holders: int = 0
) -> dict[str, Any]:
    return {
        "index": n,
        "uuid": UUIDS[n],
        "bus_id": f"00000000:{0x1B + n:02X}:00.0",
        "name": "A800",
        "error": None,
        "mig_mode": False,
        "mig_devices": [],
        "state": state,
        "holders": [{"holds": True, "shared": state == "shared"}] * holders,
        "health": {"healthy": healthy},
        "utilization_gpu": util,
        "memory_used_mib": used,
        "memory_total_mib": 1000,
        "memory_free_mib": 1000 - used,
    }


def view(*states: str) -> Listing:
    return cards(*(card(n, s, holders=s in ("held", "shared")) for n, s in enumerate(states)))


def cards(*listed: dict[str, Any]) -> Listing:
    """A listing of these cards (each as `ls --json` shows one)."""
    return Listing.from_json({"gpus": listed})


class W:
    def __init__(
        self,
        *gpus: str,
        count: int | None = None,
        share: bool = False,
        offered: list[str] | None = None,
        lapsed: bool = False,
        cooling: bool = False,
        **limits: float,
    ) -> None:
        self.ask = fair.QueueRequest(gpus, count, share, limits.get("max_load"), limits.get("max_memory"))
        self.offered = offered
        self.lapsed = lapsed
        self.cooling = cooling


def test_first_come_first_served_for_one_card() -> None:
    assert fair.grantable([W("1"), W("1"), W("1")], view("held", "free")) == {0: [UUIDS[1]]}
    # The first one's turn is out: it keeps the card, and no one else is offered it.
    assert fair.grantable([W("1", offered=[UUIDS[1]]), W("1")], view("held", "free")) == {}


def test_a_card_a_turn_just_booked_is_offered_to_no_one_while_the_view_shows_it_free() -> None:
    # The daemon's event has not reached the view yet: card 1 looks free, but the waiter that left took it.
    assert fair.grantable([W(count=1)], view("held", "free", "free"), taken=[UUIDS[1]]) == {0: [UUIDS[2]]}
    assert fair.grantable([W("1")], view("held", "free"), taken=[UUIDS[1]]) == {}


def test_a_count_at_the_head_holds_later_counts_back_until_enough_are_free() -> None:
    queue = [W(count=2), W(count=1), W(count=1)]
    assert fair.grantable(queue, view("free", "held", "held", "held")) == {}
    assert fair.grantable(queue, view("free", "free", "held", "held")) == {0: [UUIDS[0], UUIDS[1]]}
    # Three free: the pair takes two, the next count 1 the third, and the last waits.
    assert fair.grantable(queue, view("free", "free", "free", "held")) == {0: [UUIDS[0], UUIDS[1]], 1: [UUIDS[2]]}


def test_a_count_at_the_head_holds_named_requests_back_too() -> None:
    assert fair.grantable([W(count=2), W("0")], view("free", "held")) == {}


def test_named_requests_for_other_cards_go_ahead() -> None:
    assert fair.grantable([W("0"), W("1"), W("0", "1")], view("held", "free")) == {1: [UUIDS[1]]}
    assert fair.grantable([W("0"), W(count=1)], view("held", "free")) == {1: [UUIDS[1]]}


def test_a_lapsed_turn_is_passed_over_and_cooling_keeps_the_place() -> None:
    assert fair.grantable([W("1", lapsed=True), W("1")], view("held", "free")) == {1: [UUIDS[1]]}
    assert fair.grantable([W("1", cooling=True), W("1")], view("held", "free")) == {}


def test_share_takes_a_shared_card_and_limits_take_a_card_only_processes_use() -> None:
    assert fair.grantable([W("0")], view("shared")) == {}
    assert fair.grantable([W("0", share=True)], view("shared")) == {0: [UUIDS[0]]}
    assert fair.grantable([W("0", share=True)], cards(card(0, "busy"))) == {0: [UUIDS[0]]}  # processes only
    assert fair.grantable([W("0", share=True)], view("held")) == {}
    assert fair.grantable([W("0", share=True)], view("unknown")) == {}
    busy = cards(card(0, "busy", util=10, used=100), card(1, "busy", util=90, used=100))
    assert fair.grantable([W(count=1)], busy) == {}
    assert fair.grantable([W(count=1, max_load=50)], busy) == {0: [UUIDS[0]]}
    assert fair.grantable([W(count=1, max_memory=5)], busy) == {}


def test_an_unhealthy_card_is_never_counted() -> None:
    sick = cards(card(0, healthy=False), card(1, healthy=None), card(2))
    assert fair.grantable([W(count=1)], sick) == {0: [UUIDS[2]]}
    assert fair.grantable([W(count=2)], sick) == {}


def test_a_count_past_the_host_s_healthy_cards_holds_no_one_back() -> None:
    v = view("held", "free")
    assert fair.healthy(v) == 2
    assert fair.grantable([W(count=3), W("1"), W(count=1)], v) == {1: [UUIDS[1]]}


def test_a_turn_is_unused_while_its_cards_stay_usable() -> None:
    assert fair.still_usable(fair.QueueRequest(["1"]), [UUIDS[1]], view("held", "free"))
    assert not fair.still_usable(fair.QueueRequest(["1"]), [UUIDS[1]], view("held", "held"))  # someone took it
    assert not fair.still_usable(fair.QueueRequest(["1"]), [UUIDS[1]], view("held", "unknown"))
    assert fair.still_usable(fair.QueueRequest(["0"], share=True), [UUIDS[0]], view("shared"))
    assert not fair.still_usable(fair.QueueRequest(["1"]), [], view("held", "free"))


def test_a_newcomer_is_clear_when_no_earlier_waiter_could_take_its_cards() -> None:
    v = view("held", "held", "held")
    assert fair.clear([W("0"), W("1")], 1, v)
    assert not fair.clear([W("0"), W("1", "0")], 1, v)
    assert not fair.clear([W(count=2), W("2")], 1, v)  # a count could take any card
    assert not fair.clear([W("2"), W(count=1)], 1, v)
    assert fair.clear([W("2", lapsed=True), W(count=1)], 1, v)


def test_specs_resolve_as_run_resolves_them() -> None:
    v = view("free", "free")
    assert [t.uuid for t in fair.resolve(fair.QueueRequest(["1b:00.0", "GPU-1111"]), v)] == UUIDS[:2]
    with pytest.raises(GpuSpecError):
        fair.resolve(fair.QueueRequest(["7"]), v)


def test_the_table() -> None:
    data = {
        "waiters": [
            {
                "position": 1,
                "name": "train\n1",
                "user": "alice",
                "request": "--count 2",
                "image": "img",
                "since": 100.0,
                "turn": True,
            },
            {
                "position": 2,
                "name": None,
                "user": "bob",
                "request": "--gpu 0 --share",
                "image": "x" * 50,
                "since": 170.0,
                "turn": False,
            },
        ]
    }
    head, first, second = table(data, 4000.0).splitlines()
    assert head.split() == ["#", "NAME", "USER", "REQUEST", "IMAGE", "WAITING", "TURN"]
    # Another user's value through the one rule (gpupin.core.errors.shown): escaped, quoted, cut with its length.
    assert first.split()[:6] == ["1", "'train\\n1'", "alice", "--count", "2", "img"] and first.endswith("yes")
    assert "1h05m (since" in first and "1h03m (since" in second  # 3900 s, 3830 s
    assert second.split()[:5] == ["2", "-", "bob", "--gpu", "0"] and "'" + "x" * 39 + "... (50 characters)" in second
    assert table({"waiters": []}, 0) == "no request is waiting\n"


def test_joining_without_a_daemon() -> None:
    agent = Resident(simhost_env(DOCKER_HOST="unix:///nonexistent/docker.sock"), "--interval", "0.2")
    link = Link(agent.socket)
    mine = {"daemon": "unix:/nonexistent/docker.sock"}  # the agent's daemon: it queues for its callers only
    try:
        for body in (
            {"gpus": ["0"], "count": 1},
            {},
            {"count": 0},
            {"gpus": "0"},
            {"count": 1, "max_load": 101},
            {"gpus": ["7"]},
        ):
            with pytest.raises(GpupinError) as bad:
                _Stream(link, {**mine, **body})
            assert bad.value.exit_code == 64, (body, bad.value.message)
        first = _Stream(link, {**mine, "gpus": ["1"], "name": "a", "image": "img", "user": "someone-else"})
        second = _Stream(link, {**mine, "count": 2, "share": True, "max_memory": 50})
        assert (first.queued["position"], second.queued["position"], second.queued["of"]) == (1, 2, 2)
        # Unknown holders (no daemon) are never free: no turn; the first is clear (no one ahead), the count is not
        # (the first could take card 1, which it could take).
        assert (first.queued["turn"], first.queued["clear"], second.queued["clear"]) == (False, True, False)
        listed = json.loads(agent.get("/api/queue")[1])["waiters"]
        me = pwd.getpwuid(os.getuid()).pw_name
        assert [(w["name"], w["user"], w["pid"], w["request"], w["turn"]) for w in listed] == [
            ("a", me, os.getpid(), "--gpu 1", False),
            (None, me, os.getpid(), "--count 2 --share --max-memory 50", False),
        ]
        first.close()
        wait_for(
            lambda: len(json.loads(agent.get("/api/queue")[1])["waiters"]) == 1,
            1.0,
            "the first to leave",
            interval=0.02,
        )
        assert second.get(float("-inf")) is None  # a wait past its deadline returns at once
        assert second.send("again")
        second.close()
        wait_for(lambda: json.loads(agent.get("/api/queue")[1])["waiters"] == [], 1.0, "the queue empty", interval=0.02)
    finally:
        agent.close()


def test_the_queue_is_the_agents_only_for_callers_of_the_daemon_it_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 23, trap 6: `hostagent queue` and run --wait's queue used an agent that serves another daemon. The
    rule `run` follows (the agent acts only for callers of its daemon) now holds for the queue too: `queue` says
    so (69), and a --wait run waits without that agent's queue."""
    ours, theirs = "unix:///nonexistent/ours.sock", "unix:///nonexistent/theirs.sock"
    agent = Resident(simhost_env(DOCKER_HOST=theirs), "--interval", "0.2")
    try:
        other = hostagent("queue", DOCKER_HOST=ours, GPUPIN_AGENT_SOCKET=agent.socket)
        errors = [ln for ln in other.stderr.splitlines() if "ERROR:" in ln]
        assert other.returncode == 69 and len(errors) == 1 and other.stdout == "", other
        assert "/nonexistent/theirs.sock" in errors[0] and "/nonexistent/ours.sock" in errors[0], errors[0]
        same = hostagent("queue", DOCKER_HOST=theirs, GPUPIN_AGENT_SOCKET=agent.socket)
        assert (same.returncode, same.stdout) == (0, "no request is waiting\n"), same.stderr

        def waiters() -> list[Any]:
            return list(json.loads(agent.get("/api/queue")[1])["waiters"])

        monkeypatch.setenv("GPUPIN_AGENT_SOCKET", agent.socket)
        for host, queued in ((ours, 0), (theirs, 1)):
            monkeypatch.setenv("DOCKER_HOST", host)
            monkeypatch.setattr(address, "_ENDPOINT", None)
            with QueueClient.of(RunRequest("img", gpus=["1"], wait=1.0)) as turns:
                turns.join(time.monotonic() + 0.5)
                assert len(waiters()) == queued, host
            wait_for(lambda: waiters() == [], 2.0, "the queue empty", interval=0.02)
    finally:
        agent.close()
