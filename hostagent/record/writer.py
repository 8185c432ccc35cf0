"""The agent's side of the record: it turns the agent's views into intervals (gpupin.hostagent.record.store). The
refresh thread hands each view to `observe()` and goes on; the writer's own thread opens, closes and checkpoints
rows, so a slow or full disk delays the record alone. Times are the daemon's, an unknown ledger neither opens nor
closes, and open intervals are taken up after a restart (docs/serve.md, "The record").
"""

from __future__ import annotations

import contextlib
import threading
import time

from gpupin import hostagent
from gpupin.core.errors import GpupinError
from gpupin.hostagent.ls.model import RecordState
from gpupin.hostagent.record.store import Figures, IntervalRow, Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.core.nvml import Card
    from gpupin.hostagent.engine.answer import DaemonAnswer
    from gpupin.hostagent.ls.model import CardShown, HolderShown, Listing

FORGET_S = 3600.0  # a container's start and die times are kept this long for an interval that may need them
CHECKPOINT_S = 10.0  # the open intervals' figures and `seen` are written this often
REASONS = ("exit", "stop", "expiry", "idle", "lost")
NOT_STARTED = "0001-01-01T00:00:00Z"


def say(text: str) -> None:
    """One line of the agent's log, as the record's (the agent's own lines say `serve:`)."""
    hostagent.say(f"record: {text}")


def user_name(uid: int | None) -> str:
    if uid is None:
        return "unknown"
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _time(text: Any) -> float | None:
    """The daemon's RFC 3339 time, or None for Go's zero time and anything unreadable."""
    from gpupin.hostagent.engine.reads import created_time

    if not isinstance(text, str) or not text or text.startswith("0001-"):
        return None
    try:
        return created_time(text)
    except (ValueError, IndexError):
        return None


class Interval:
    """One open interval in memory: its row (`rid`; None while not written), its figures and what is unwritten."""

    __slots__ = (
        "card_index",
        "card_uuid",
        "container_id",
        "container_name",
        "dirty",
        "energy_j",
        "image",
        "load_n",
        "load_sum",
        "peak_memory_mib",
        "provisional",
        "rid",
        "seen",
        "start",
        "uid",
        "user",
    )

    def __init__(
        self, row: IntervalRow, figures: Figures | None = None, rid: int | None = None, provisional: bool = False
    ) -> None:
        figures = figures or Figures(row.start, row.seen)
        self.rid = rid
        self.container_id = row.container_id
        self.container_name = row.container_name
        self.image = row.image
        self.card_uuid = row.card_uuid
        self.card_index = row.card_index
        self.uid = row.uid
        self.user = row.user or user_name(row.uid)
        self.start = figures.start
        self.seen = figures.seen or self.start
        self.peak_memory_mib = figures.peak_memory_mib
        self.load_sum = figures.load_sum or 0.0
        self.load_n = figures.load_n or 0
        self.energy_j = figures.energy_j
        self.provisional = provisional  # opened while only created: starts at `start`
        self.dirty = False

    def row(self) -> IntervalRow:
        return IntervalRow(
            self.container_id,
            self.container_name,
            self.image,
            self.card_uuid,
            self.card_index,
            self.uid,
            self.user,
            self.start,
            self.seen,
        )

    def figures(self) -> Figures:
        return Figures(self.start, self.seen, self.peak_memory_mib, self.load_sum, self.load_n, self.energy_j)

    def payload(self) -> JSONObject:
        """The card, container and user of the notifications' payloads (docs/serve.md, "Notifications")."""
        return {
            "card": {"uuid": self.card_uuid, "index": self.card_index},
            "container": {"id": self.container_id, "name": self.container_name, "image": self.image},
            "user": {"uid": self.uid, "name": self.user},
        }


class RecordWriter:
    """The record's writer in the agent. `inspect(cid)` reads a container (None: it is gone); `emit` is the hooks'."""

    def __init__(
        self,
        store: Store,
        inspect: Callable[[str], DaemonAnswer | None] | None = None,
        emit: Callable[[str, JSONObject], None] | None = None,
    ) -> None:
        self.store = store
        self._inspect = inspect or _engine_inspect()
        self._emit = emit
        self.degraded: str | None = None
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()  # the fields below, shared with the refresh thread and the API's
        self._latest: Listing | None = None
        self._samples: dict[tuple[str, str], list[Any]] = {}  # (cid, uuid) -> [peak MiB, load sum, n, joules]
        self._energy: dict[str, int] = {}  # uuid -> the card's counter at the last view (mJ)
        self._reasons: dict[str, str] = {}  # cid -> how it ended, as noted
        self._started: dict[str, float] = {}  # cid -> its `start` event's time
        self._died: dict[str, float] = {}  # cid -> its `die` event's time
        self._owners: dict[str, int] = {}  # cid -> the caller's uid at accept (also in the store)
        self._unwritten: list[tuple[str, int]] = []  # owners noted, not written yet
        self.open: dict[tuple[str, str], Interval] = {}
        self._closed: list[tuple[Interval, float, str]] = []  # closes not written yet
        self._health: dict[str, tuple[bool | None, bool]] = {}  # uuid -> (healthy, lost) at the last view
        self._thread: threading.Thread | None = None
        self._checkpoint_at = 0.0

    # --- the seams (any thread) ---

    def end_reason(self, container_id: str, reason: str) -> None:
        """How the container's intervals end, noted by whoever stops it. A `stop` (the daemon's event) does not
        replace a reason already noted (an expiry is also a stop)."""
        if reason not in REASONS:
            raise ValueError(f"reason must be one of {', '.join(REASONS)}, not {reason!r}")
        with self._lock:
            if reason != "stop" or container_id not in self._reasons:
                self._reasons[container_id] = reason

    def note_owner(self, container_id: str, uid: int) -> None:
        """The caller the agent created `container_id` for (its uid at accept)."""
        with self._lock:
            self._owners[container_id] = uid
            self._unwritten.append((container_id, uid))  # written by the writer's thread: the booking waits on no disk
        self._wake.set()

    def event(self, ev: DaemonAnswer) -> None:
        """A container event of the daemon's stream: its start and die times, and stops."""
        action = str(ev.get("Action") or ev.get("status") or "")
        cid = str(ev.get("id") or (ev.get("Actor") or {}).get("ID") or "")
        if not cid:
            return
        nano = ev.get("timeNano")
        when = nano / 1e9 if isinstance(nano, int) else float(ev.get("time") or time.time())
        with self._lock:
            if action == "start":
                self._started[cid] = when
            elif action == "die":
                self._died[cid] = when
        if action in ("stop", "kill"):
            self.end_reason(cid, "stop")
        self._wake.set()

    def status(self) -> RecordState:
        """What the view says of the record (a change makes a new view: nothing that moves with each interval)."""
        return RecordState(self.store.path, self.degraded)

    # --- the refresh thread ---

    def observe(self, view: Listing | None, cards: list[Card] | None) -> None:
        """One view of the agent (and the cards it was read from, for their energy counters)."""
        if view is None:
            return
        energy = {c.uuid: c.energy for c in cards or () if c.uuid and c.energy is not None}
        with self._lock:
            for card in view.gpus:
                uuid = card.uuid
                if not uuid:
                    continue
                holders = [h.id for h in card.holders if h.holds]
                joules = None
                now_e, was_e = energy.get(uuid), self._energy.get(uuid)
                if now_e is not None and was_e is not None and now_e >= was_e and holders:
                    joules = (now_e - was_e) / 1000.0 / len(holders)  # shared among the card's holders now
                for cid in holders:
                    s = self._samples.setdefault((cid, uuid), [None, 0.0, 0, None])
                    mem, load = card.memory_used_mib, card.utilization_gpu
                    if mem is not None:
                        s[0] = mem if s[0] is None else max(s[0], mem)
                    if load is not None:
                        s[1] += load
                        s[2] += 1
                    if joules is not None:
                        s[3] = (s[3] or 0.0) + joules
            self._energy = energy
            self._latest = view
        self._wake.set()

    # --- the writer's thread ---

    def start(self) -> None:
        """Take up the intervals an earlier agent left open, then run."""
        try:
            rows = self.store.open_rows()
        except Exception as err:
            self._degrade(err)
            rows = []
        for r in rows:
            iv = Interval(r.row, r.figures, r.rid)
            self.open[(iv.container_id, iv.card_uuid)] = iv
        if rows:
            say(f"{len(rows)} interval(s) left open by an earlier agent taken up")
        self._thread = threading.Thread(target=self._run, name="record", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self.stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        with contextlib.suppress(Exception):
            self._checkpoint(force=True)

    def _run(self) -> None:
        while not self.stopping.is_set():
            self._wake.wait(CHECKPOINT_S)
            self._wake.clear()
            if self.stopping.is_set():
                break
            try:
                self.step()
            except GpupinError:  # the daemon stopped answering mid-way: nothing changed, the next view tries again
                self.stopping.wait(1.0)
            except Exception as err:  # a bug must not end the record: the next view tries again
                say(f"internal error: {type(err).__name__}: {err}")
                self.stopping.wait(1.0)

    def step(self, now: float | None = None) -> None:
        """Compare the last view with the open intervals; write what is due."""
        now = time.time() if now is None else now
        self._write_owners()
        with self._lock:
            view, self._latest = self._latest, None
        if view is not None:
            self._health_events(view)
            if view.docker.available:
                self._diff(view, now)
                with self._lock:  # samples of holders seen while the daemon was unread, gone since: no interval
                    for key in [k for k in self._samples if k not in self.open]:
                        del self._samples[key]
        self._checkpoint(now=now)

    def _diff(self, view: Listing, now: float) -> None:
        holding: dict[tuple[str, str], tuple[HolderShown, CardShown]] = {}
        lost: set[str] = set()
        for card in view.gpus:
            uuid = card.uuid
            if not uuid:
                continue
            if card.error:
                lost.add(uuid)
            for h in card.holders:
                if h.holds:
                    holding[(h.id, uuid)] = (h, card)
        inspected: dict[str, DaemonAnswer | None] = {}

        def inspect(cid: str) -> DaemonAnswer | None:
            if cid not in inspected:
                inspected[cid] = self._inspect(cid)
            return inspected[cid]

        for key, iv in list(self.open.items()):
            self._take_samples(key, iv)
            self._late_owner(iv)
            if key in holding:
                iv.seen = now
                with self._lock:
                    started = self._started.get(iv.container_id)
                if iv.provisional and started is not None:
                    iv.start, iv.provisional, iv.dirty = started, False, True
                continue
            self._close(iv, inspect(iv.container_id), now, lost=iv.card_uuid in lost)
        for key, (h, card) in holding.items():
            if key not in self.open:
                self._open(key, h, card, inspect(key[0]), now)

    def _take_samples(self, key: tuple[str, str], iv: Interval) -> None:
        with self._lock:
            s = self._samples.pop(key, None)
        if s is None:
            return
        peak, load_sum, n, joules = s
        if peak is not None:
            iv.peak_memory_mib = peak if iv.peak_memory_mib is None else max(iv.peak_memory_mib, peak)
        iv.load_sum += load_sum
        iv.load_n += n
        if joules is not None:
            iv.energy_j = (iv.energy_j or 0.0) + joules
        iv.dirty = True

    def _open(
        self, key: tuple[str, str], h: HolderShown, card: CardShown, data: DaemonAnswer | None, now: float
    ) -> None:
        cid, uuid = key
        state = (data or {}).get("State") or {}
        started = _time(state.get("StartedAt")) if state.get("Running") or state.get("Paused") else None
        with self._lock:
            uid = self._owners.get(cid)
            started = started or self._started.get(cid)
        if uid is None:
            uid = self._owner_uid(cid)
        image = h.image or ((data or {}).get("Config") or {}).get("Image")
        start = started if started is not None else now
        row = IntervalRow(cid, h.name, image, uuid, card.index, uid, user_name(uid), start, now)
        iv = Interval(row, provisional=started is None)
        self.open[key] = iv
        self._take_samples(key, iv)
        self._write_open(iv)

    def _late_owner(self, iv: Interval) -> None:
        """The owner noted after `iv` opened: the agent notes it once the daemon's create has returned, and a view
        taken in between opens the interval with none."""
        if iv.uid is not None:
            return
        with self._lock:
            uid = self._owners.get(iv.container_id)
        if uid is None:
            return
        iv.uid, iv.user = uid, user_name(uid)
        if iv.rid is not None:
            try:
                self.store.owned(iv.rid, uid, iv.user)
            except Exception as err:  # the close writes it again
                self._degrade(err)

    def _owner_uid(self, cid: str) -> int | None:
        """Who booked a container: the uid an earlier agent noted at accept, else unknown. Its labels (a booking's
        uid, a lease's process) are the word of whoever created the container: a claim, charged to no one."""
        try:
            return self.store.owner(cid)
        except Exception:
            return None

    def _close(self, iv: Interval, data: DaemonAnswer | None, now: float, lost: bool) -> None:
        del self.open[(iv.container_id, iv.card_uuid)]
        state = (data or {}).get("State") or {}
        with self._lock:
            reason = self._reasons.get(iv.container_id)
            died = self._died.get(iv.container_id)
            started = self._started.get(iv.container_id)
        if iv.provisional and started is not None:
            iv.start = started
        end = None
        if not state.get("Running"):
            end = _time(state.get("FinishedAt"))
        if end is None or end < iv.start:
            end = died if died is not None and died >= iv.start else (iv.seen if data is None else now)
        reason = reason or ("lost" if lost else "exit")
        self._closed.append((iv, max(end, iv.start), reason))
        self._write_closed()
        if not any(k[0] == iv.container_id for k in self.open):
            with self._lock:  # what was noted for the container served its last interval
                for kept in (self._reasons, self._started, self._died, self._owners):
                    kept.pop(iv.container_id, None)

    def _write_open(self, iv: Interval) -> None:
        try:
            iv.rid = self.store.open_interval(iv.row())
            iv.dirty = False
            self._recovered()
        except Exception as err:
            self._degrade(err)

    def _write_owners(self) -> None:
        with self._lock:
            owners, self._unwritten = self._unwritten, []
        for i, (cid, uid) in enumerate(owners):
            try:
                self.store.note_owner(cid, uid)
            except Exception as err:  # kept in memory: the next checkpoint writes them
                with self._lock:
                    self._unwritten[:0] = owners[i:]
                self._degrade(err)
                return

    def _write_closed(self) -> None:
        while self._closed:
            iv, end, reason = self._closed[0]
            try:
                if iv.rid is None:
                    iv.rid = self.store.open_interval(iv.row())
                self.store.close_interval(iv.rid, iv.row(), iv.figures(), end, reason)
            except Exception as err:
                self._degrade(err)
                return
            self._closed.pop(0)
            self._recovered()

    def _checkpoint(self, now: float | None = None, force: bool = False) -> None:
        now = time.time() if now is None else now
        if not force and now - self._checkpoint_at < CHECKPOINT_S and self.degraded is None:
            return
        self._checkpoint_at = now
        with self._lock:  # containers that never held a card: their events are not kept past FORGET_S
            for times in (self._started, self._died):
                for cid in [c for c, t in times.items() if t < now - FORGET_S]:
                    del times[cid]
            if len(self._reasons) > 10000:
                self._reasons.clear()
        self._write_owners()
        self._write_closed()
        for iv in list(self.open.values()):
            if iv.rid is None:
                self._write_open(iv)
        rows = [(iv.rid, iv.figures()) for iv in self.open.values() if iv.rid is not None]
        if not rows:
            return
        try:
            self.store.update(rows)
            self._recovered()
        except Exception as err:
            self._degrade(err)

    def _degrade(self, err: BaseException) -> None:
        text = f"{type(err).__name__}: {err}" if not str(err).startswith("database") else str(err)
        if self.degraded is None:
            say(f"degraded ({text}): kept in memory, written when {self.store.path} can be written again")
        self.degraded = text

    def _recovered(self) -> None:
        if (
            self.degraded is not None
            and not self._closed
            and not self._unwritten
            and all(iv.rid is not None for iv in self.open.values())
        ):
            say("written again")
            self.degraded = None

    # --- card health, for the notifications ---

    def _health_events(self, view: Listing) -> None:
        if self._emit is None:
            return
        for card in view.gpus:
            uuid = card.uuid
            if not uuid:
                continue
            health = card.health
            healthy = health.healthy if health is not None else None
            is_lost = bool(card.error) and "lost" in str(card.error).lower()
            was = self._health.get(uuid)
            self._health[uuid] = (healthy, is_lost)
            if was is None:
                continue
            event = "card.lost" if is_lost and not was[1] else "card.unhealthy" if healthy is False and was[0] else None
            if event is None:
                continue
            held = [iv for (cid, u), iv in self.open.items() if u == uuid]
            base = {"card": {"uuid": uuid, "index": card.index, "name": card.name}}
            reasons = {"reasons": list(health.reasons) if health is not None else []}
            for payload in [iv.payload() for iv in held] or [{"container": None, "user": None}]:
                self._emit(event, {**payload, **base, **reasons})


def _engine_inspect() -> Callable[[str], DaemonAnswer | None]:
    """Read a container through the ledger's client (None when the daemon says it does not exist)."""
    client: list[Any] = []

    def inspect(cid: str) -> DaemonAnswer | None:
        from gpupin.hostagent import engine
        from gpupin.hostagent.engine.failures import EngineNotFound
        from gpupin.hostagent.engine.reads import fetch

        if not client:
            client.append(engine.reader(timeout=10.0))
        try:
            data: DaemonAnswer = fetch(client[0], f"/containers/{cid}/json", versioned=False)[0]
        except EngineNotFound:
            return None
        return data

    return inspect
