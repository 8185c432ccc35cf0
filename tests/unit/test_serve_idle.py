"""The agent's idle rule and its sample history without a daemon: who is warned, when a stop is due, that a compute
process or another card in use saves a holder, that the exempt label counts only where the policy allows it, and
that the last hour of samples stays bounded. The engine's calls are the test's (the real ones: tests/docker/
test_serve_idle.py)."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from gpupin.hostagent.ls.model import IdleWarning, Listing
from gpupin.hostagent.serve.idle import IdleWatch
from gpupin.hostagent.serve.samples import POINTS, STEP, Samples

pytestmark = pytest.mark.timeout(60)

T0 = 1_800_000_000.0  # the wall clock at the first sample


def view(cards: Sequence[tuple[int | None, int | None, list[str]]], owners: dict[str, int] | None = None) -> Listing:
    """A listing: per card (utilization, compute processes, holding container ids); `owners`: the uids the agent
    created containers for (the others' owner is unverified)."""
    owners = owners or {}
    return Listing.from_json(
        {
            "docker": {"available": True},
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "name": "card",
                    "utilization_gpu": util,
                    "compute_processes": procs,
                    "memory_used_mib": 100 * i,
                    "error": None,
                    "holders": [
                        {"id": h, "name": f"name-{h}", "image": "img", "holds": True, "owner": _owner(owners.get(h))}
                        for h in holders
                    ],
                }
                for i, (util, procs, holders) in enumerate(cards)
            ],
        }
    )


def _owner(uid: int | None) -> dict[str, Any]:
    return {"uid": uid, "name": None if uid is None else f"user{uid}", "verified": uid is not None}


class Host:
    """An IdleWatch with the test's engine: labels per container, stops and notifications recorded."""

    def __init__(
        self,
        action: str = "stop",
        labels: dict[str, dict[str, str]] | None = None,
        owners: dict[str, int] | None = None,
    ) -> None:
        self.rule: Any = SimpleNamespace(after=60.0, action=action, grace=30.0)
        self.labels = labels or {}
        self.owners = owners or {}
        self.stopped: list[str] = []
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.reasons: list[tuple[str, str]] = []
        self.exempting = {1000}  # uids the policy lets exempt
        self.watch = IdleWatch(
            1800.0,
            lambda: self.rule,
            lambda uid, gids: uid in self.exempting,
            lambda event, payload: self.events.append((event, payload)),
            lambda cid, reason: self.reasons.append((cid, reason)),
            lambda line: None,
            labels=lambda cid: self.labels.get(cid, {}),
            stop=self.stopped.append,
        )
        self.watch._thread = lambda target, *args: target(*args)  # type: ignore[method-assign]

    def at(self, t: float, cards: Sequence[tuple[int | None, int | None, list[str]]]) -> Listing:
        v = view(cards, self.owners)
        self.watch.observe(v, t, T0 + t)
        return v


def test_an_idle_holder_is_warned_then_stopped_after_grace() -> None:
    h = Host()
    h.at(0, [(0, 0, ["a"])])
    v = h.at(59, [(0, 0, ["a"])])
    assert v.gpus[0].idle is False and v.gpus[0].idle_warning is None and not h.events
    v = h.at(60, [(0, 0, ["a"])])
    assert v.gpus[0].idle_warning == IdleWarning("name-a", T0, T0 + 90)
    assert [e for e, _ in h.events] == ["idle.warning"]
    payload = h.events[0][1]
    assert payload["container"] == {"id": "a", "name": "name-a", "image": "img"} and payload["card"]["uuid"] == "GPU-0"
    h.at(89.5, [(0, 0, ["a"])])
    assert h.stopped == []
    h.at(90, [(0, 0, ["a"])])  # due: confirmed by the next view
    assert h.stopped == []
    h.at(90.5, [(0, 0, ["a"])])
    assert h.stopped == ["a"] and h.reasons == [("a", "idle")]
    assert [e for e, _ in h.events] == ["idle.warning", "idle.stopped"]
    h.at(91, [(0, 0, ["a"])])  # the stop is under way: once
    assert h.stopped == ["a"]


def test_warn_only_never_stops() -> None:
    h = Host(action="warn")
    for t in range(0, 600, 10):
        v = h.at(t, [(0, 0, ["a"])])
    warning = v.gpus[0].idle_warning
    assert warning is not None and warning.stop_at is None and h.stopped == []
    assert [e for e, _ in h.events] == ["idle.warning"]


def test_a_compute_process_is_never_stopped_and_withdraws_the_warning() -> None:
    h = Host()
    h.at(0, [(0, 0, ["a"])])
    h.at(60, [(0, 0, ["a"])])
    assert [e for e, _ in h.events] == ["idle.warning"]
    for t in range(61, 400):  # a process at 0% load (waiting on its input): in use
        v = h.at(t, [(0, 1, ["a"])])
        assert v.gpus[0].idle is False and v.gpus[0].idle_warning is None
    assert h.stopped == []
    # Due, and then a process appears before the confirming view: saved.
    h.at(400, [(0, 0, ["a"])])
    h.at(460, [(0, 0, ["a"])])
    h.at(490, [(0, 0, ["a"])])
    h.at(490.5, [(0, 1, ["a"])])
    h.at(491, [(0, 0, ["a"])])  # due again: this view finds it, the next confirms
    assert h.stopped == []
    h.at(495, [(None, None, ["a"])])  # unread: unknown, never idle
    assert h.stopped == []


def test_a_container_busy_on_another_card_is_not_idle() -> None:
    h = Host()
    for t in range(0, 300, 5):
        v = h.at(t, [(0, 0, ["a"]), (40, 1, ["a"])])
    assert v.gpus[0].idle is True and v.gpus[0].idle_warning is None
    assert h.stopped == [] and h.events == []


def test_the_exempt_label_counts_only_for_an_owner_the_policy_allows() -> None:
    """The owner is the uid the agent created the container for: a booking label that names an allowed uid on a
    container the agent did not create (`forged`) exempts nothing."""
    h = Host(
        labels={
            "allowed": {"gpupin.idle": "exempt", "gpupin.booking": "uid=1000 since=1"},
            "refused": {"gpupin.idle": "exempt", "gpupin.booking": "uid=1001 since=1"},
            "unrecorded": {"gpupin.idle": "exempt"},
            "forged": {"gpupin.idle": "exempt", "gpupin.booking": "uid=1000 since=1"},
        },
        owners={"allowed": 1000, "refused": 1001},
    )
    holders = [(0, 0, ["allowed"]), (0, 0, ["refused"]), (0, 0, ["unrecorded"]), (0, 0, ["forged"])]
    for t in range(0, 200):
        h.at(t, holders)
    assert sorted(h.stopped) == ["forged", "refused", "unrecorded"]
    warned = {p["container"]["id"]: p["user"] for e, p in h.events if e == "idle.warning"}
    assert warned == {
        "refused": {"uid": 1001, "name": None},
        "unrecorded": {"uid": None, "name": None},
        "forged": {"uid": None, "name": None},
    }


def test_a_reloaded_policy_counts_at_the_next_view() -> None:
    h = Host(
        action="warn",
        labels={"a": {"gpupin.idle": "exempt", "gpupin.booking": "uid=1000 since=1"}},
        owners={"a": 1000},
    )
    h.exempting = set()
    v = h.at(0, [(0, 0, ["a"])])
    v = h.at(60, [(0, 0, ["a"])])
    assert v.gpus[0].idle_warning is not None
    h.exempting = {1000}  # the new policy lets its owner exempt: the warning is withdrawn
    v = h.at(61, [(0, 0, ["a"])])
    assert v.gpus[0].idle_warning is None and [e for e, _ in h.events] == ["idle.warning"]


def test_no_rule_flags_only() -> None:
    h = Host()
    h.rule = None
    for t in range(0, 4000, 100):
        v = h.at(t, [(0, 0, ["a"])])
    assert v.gpus[0].idle is True and h.events == [] and h.stopped == []


def test_samples_keep_an_hour_in_points_of_ten_seconds() -> None:
    s = Samples()
    for i in range(int(2 * 3600 / 0.5)):  # two hours of refreshes at 0.5 s
        s.add(view([(i % 2 * 50, 0, []), (None, 0, [])]), T0 + i * 0.5)
    now = T0 + 2 * 3600
    got = s.listing(now)
    assert got["step_s"] == STEP and set(got["cards"]) == {"GPU-0", "GPU-1"}
    points = got["cards"]["GPU-0"]
    assert len(points) == POINTS - 1 or len(points) == POINTS
    assert points[-1][1] == 25.0 and points[-1][2] == 0.0  # the mean load, the highest memory
    assert all(b[0] - a[0] == STEP for a, b in zip(points, points[1:]))
    assert now - points[0][0] <= 3600 and got["cards"]["GPU-1"][-1][1] is None  # unread load: null


def test_samples_forget_a_card_gone_for_an_hour_and_stay_bounded() -> None:
    s = Samples()
    tracemalloc.start()
    for i in range(4 * 3600):  # four hours at 1 s, 16 cards
        s.add(view([(50, 0, [])] * 16), T0 + i)
        if i == 10:
            base = tracemalloc.get_traced_memory()[0]
    grown = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert grown < 1 << 20, grown  # 16 cards' hour, far under a megabyte
    new = Listing.from_json({"gpus": [{"uuid": "GPU-new", "utilization_gpu": 1, "memory_used_mib": 1}]})
    s.add(new, T0 + 4 * 3600)
    s.add(new, T0 + 6 * 3600)
    assert list(s.listing(T0 + 6 * 3600)["cards"]) == ["GPU-new"]


def test_samples_are_read_while_written() -> None:
    s = Samples()
    stop = threading.Event()

    def write() -> None:
        i = 0
        while not stop.is_set():
            s.add(view([(1, 0, [])] * 8), T0 + i)
            i += 1

    t = threading.Thread(target=write)
    t.start()
    try:
        for _ in range(200):
            for points in s.listing(T0 + 10**6, 10**7)["cards"].values():
                assert all(len(p) == 3 for p in points)
    finally:
        stop.set()
        t.join()
