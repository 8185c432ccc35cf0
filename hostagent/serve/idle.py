"""Idle holders, and the cards given back (docs/serve.md, "Idle holders"). IdleTracker: how long each held card
has had no compute process and 0% utilization, by the agent's samples (one NVML reading cannot tell idle from a
pause, so `ls` alone leaves it null). IdleWatch: the policy's `[idle]` rule acted on: a container idle on every
card it holds is warned, then stopped as `docker stop` stops it, decided on two views in a row.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

from gpupin.hostagent.ls.model import IdleWarning

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.ls.model import CardShown, HolderShown, Listing
    from gpupin.hostagent.serve.interfaces import Agent

EXEMPT_LABEL = "gpupin.idle"  # `exempt` asks for it; the policy decides


class IdleTracker:
    """Per card UUID: (the holders' ids, when their idle stretch began, on the agent's monotonic clock)."""

    def __init__(self, idle_after: float) -> None:
        self.idle_after = idle_after
        self._since: dict[str, tuple[frozenset[str], float]] = {}

    def annotate(self, listing: Listing, now: float) -> None:
        """Fill each card's `idle_seconds` and `idle` in `listing` (a gather() object) from this sample."""
        seen = set()
        docker_known = bool(listing.docker.available)
        for card in listing.gpus:
            uuid = card.uuid
            holders = frozenset(h.id for h in card.holders if h.holds)
            util = card.utilization_gpu
            procs = card.compute_processes  # None: NVML could not list them
            if not docker_known or not uuid or not holders or util is None or util > 0 or procs != 0 or card.error:
                # Not held (nothing to reclaim), unknown or in use: no stretch, and an unknown reading is no claim.
                known = docker_known and uuid and not card.error and (not holders or None not in (util, procs))
                card.idle_seconds = 0.0 if known and holders else None
                card.idle = False if known else None
                continue
            seen.add(uuid)
            held, since = self._since.get(uuid, (holders, now))
            if held != holders:
                since = now
            self._since[uuid] = (holders, since)
            card.idle_seconds = int(now - since)  # whole seconds: the view changes once a second, not per sample
            card.idle = now - since >= self.idle_after
        for gone in set(self._since) - seen:
            del self._since[gone]


@dataclass
class _Idle:
    """One idle container, as warned."""

    name: str
    image: str | None
    uuids: tuple[str, ...]
    since: float  # when its idle stretch began (seconds since the epoch)
    warned_at: float
    stop_at: float | None  # None: warned only
    due_seen: bool = False  # a view already found its stop due: the next one confirms it
    stopping: bool = False
    uid: int | None = None  # its owner: the uid the agent created it for (None: not the agent's)


def watch(agent: Agent, idle_after: float, say: Callable[[str], None]) -> IdleWatch:
    """The agent's IdleWatch, wired to the agent's current policy (the policy in force: a reload counts at the next
    refresh) and to the record's seams."""

    def policy() -> Any:
        return agent.in_force.policy

    def rule() -> Any:
        return policy().idle

    def may_exempt(uid: int, gids: frozenset[int]) -> bool:
        return bool(policy().may_exempt(uid, gids))

    return IdleWatch(idle_after, rule, may_exempt, agent.hooks.emit, agent.end_reason, say)


class IdleWatch:
    """Warns and stops idle holders by the rule `rule()` gives (None: flagged only). `may_exempt(uid, gids)` is
    the policy's; `emit` and `end_reason` are the record's seams. The engine calls run on threads of their own: a
    daemon that hangs never delays the refresh."""

    def __init__(
        self,
        idle_after: float,
        rule: Callable[[], Any],
        may_exempt: Callable[[int, frozenset[int]], bool],
        emit: Callable[[str, JSONObject], None],
        end_reason: Callable[[str, str], None],
        say: Callable[[str], None],
        labels: Callable[[str], dict[str, str]] | None = None,
        stop: Callable[[str], None] | None = None,
    ) -> None:
        """`labels(cid)` and `stop(cid)`: the engine's inspect and stop calls (by default, the daemon's)."""
        self.default_after = idle_after
        self.tracker = IdleTracker(idle_after)
        self._rule = rule
        self._may_exempt = may_exempt
        self._emit = emit
        self._end_reason = end_reason
        self._say = say
        self._labels = labels or _labels
        self._stop_call = stop or _engine_stop
        self._lock = threading.RLock()
        self._idle: dict[str, _Idle] = {}  # by container id
        # By container id, once its labels are read: whether it asks to be exempt. The policy's word on its owner is
        # asked at each view, so that a reloaded policy counts at once.
        self._asks: dict[str, bool] = {}
        self._asking: set[str] = set()  # container ids whose labels are being read
        self._unread: set[str] = set()  # container ids whose labels could not be read (said in the log)

    @property
    def idle_after(self) -> float:
        return self.tracker.idle_after

    def observe(self, view: Listing, now_mono: float, now: float) -> None:
        """Annotate `view` (idle fields, `idle_warning` per card), and warn, stop, or withdraw as the rule says."""
        rule = self._rule()
        self.tracker.idle_after = rule.after if rule is not None else self.default_after
        self.tracker.annotate(view, now_mono)
        for card in view.gpus:
            card.idle_warning = None
        if rule is None:
            with self._lock:
                self._idle.clear()
            return
        cards: dict[str, list[CardShown]] = {}
        holder: dict[str, HolderShown] = {}
        for card in view.gpus:
            for h in card.holders:
                if h.holds:
                    cards.setdefault(h.id, []).append(card)
                    holder[h.id] = h
        due: list[str] = []
        with self._lock:
            for cid in list(self._idle):
                if cid not in cards:  # gone (stopped, removed): nothing to withdraw
                    del self._idle[cid]
            for cid, held in cards.items():
                # Idle only when every card it holds is: its work on another card is work.
                if not all(c.idle for c in held):
                    self._idle.pop(cid, None)
                    continue
                if cid not in self._asks:
                    self._ask(cid)  # its labels first: an exempt container is never warned
                asks = self._asks.get(cid)
                if asks is None:
                    continue
                uid = proven(holder[cid])  # a label's uid is a claim: it exempts nothing
                if asks and uid is not None and self._may_exempt(uid, _groups(uid)):
                    self._idle.pop(cid, None)
                    continue
                entry = self._idle.get(cid)
                if entry is None:
                    idle_for = min(float(c.idle_seconds or 0) for c in held)
                    h = holder[cid]
                    entry = self._idle[cid] = _Idle(
                        str(h.name),
                        h.image,
                        tuple(str(c.uuid) for c in held),
                        round(now - idle_for),
                        now,
                        now + rule.grace if rule.action == "stop" else None,
                        uid=uid,
                    )
                    self._emit("idle.warning", self._payload(cid, entry, held[0], rule))
                    self._say(f"idle: warned {entry.name} ({cid[:12]}), idle since {_clock(entry.since)}")
                # A reloaded rule counts for a warning already given: its grace runs from the warning.
                entry.stop_at = entry.warned_at + rule.grace if rule.action == "stop" else None
                for c in held:
                    c.idle_warning = IdleWarning(entry.name, entry.since, entry.stop_at)
                if entry.stop_at is not None and now >= entry.stop_at and not entry.stopping:
                    if entry.due_seen:  # two views in a row: a process started in between would have saved it
                        entry.stopping = True
                        due.append(cid)
                    entry.due_seen = True
            for cid in set(self._asks) - set(cards):
                del self._asks[cid]
            self._unread &= set(cards)
        for cid in due:
            self._thread(self._stop, cid, self._idle[cid], cards[cid][0], rule)

    def _ask(self, cid: str) -> None:
        if cid not in self._asking:
            self._asking.add(cid)
            self._thread(self._read_labels, cid)

    def _thread(self, target: Callable[..., None], *args: Any) -> None:
        threading.Thread(target=target, args=args, name=f"idle-{args[0][:12]}", daemon=True).start()

    def _read_labels(self, cid: str) -> None:
        try:
            labels = self._labels(cid)
        except Exception as err:  # unread: asked again at the next refresh (said once, not at each)
            with self._lock:
                if cid not in self._unread:
                    self._unread.add(cid)
                    self._say(f"idle: cannot read {cid[:12]}'s labels: {type(err).__name__}: {err}")
                self._asking.discard(cid)
            return
        with self._lock:
            self._asks[cid] = labels.get(EXEMPT_LABEL) == "exempt"
            self._asking.discard(cid)

    def _stop(self, cid: str, entry: _Idle, card: CardShown, rule: Any) -> None:
        started = time.time()
        try:
            self._end_reason(cid, "idle")  # before the stop: the interval that closes reads it
            self._stop_call(cid)
        except Exception as err:
            self._say(f"idle: could not stop {entry.name} ({cid[:12]}): {type(err).__name__}: {err}")
            with self._lock:
                entry.stopping = False
                entry.due_seen = False
            return
        self._say(
            f"idle: stopped {entry.name} ({cid[:12]}) on {','.join(entry.uuids)}, idle since {_clock(entry.since)} "
            f"({time.time() - started:.1f}s to stop)"
        )
        self._emit("idle.stopped", self._payload(cid, entry, card, rule))

    def _payload(self, cid: str, entry: _Idle, card: CardShown, rule: Any) -> JSONObject:
        return {
            "card": {"uuid": card.uuid, "index": card.index, "name": card.name},
            "cards": list(entry.uuids),
            "container": {"id": cid, "name": entry.name, "image": entry.image},
            "user": {"uid": entry.uid, "name": _user_name(entry.uid)},
            "idle_since": entry.since,
            "stop_at": entry.stop_at,
            "action": rule.action,
        }


def proven(h: HolderShown) -> int | None:
    """The uid the agent created the holder for (the view's owner: gpupin.hostagent.serve.owners), else None."""
    return h.owner.uid if h.owner is not None and h.owner.verified else None


def _labels(cid: str) -> dict[str, str]:
    from gpupin.hostagent import engine

    return dict((engine.reader(10.0).inspect_container(cid).get("Config") or {}).get("Labels") or {})


def _engine_stop(cid: str) -> None:
    """`docker stop`'s call: no `t`, so the engine sends the container's StopSignal and waits its StopTimeout."""
    from gpupin.hostagent import engine

    engine.connect(timeout=None).stop(cid)


def _user_name(uid: int | None) -> str | None:
    import pwd

    if uid is None:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def _groups(uid: int) -> frozenset[int]:
    """The user's groups by the system's database (its primary group and supplementary ones)."""
    import pwd

    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    with contextlib.suppress(OSError):
        return frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
    return frozenset({pw.pw_gid})


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))
