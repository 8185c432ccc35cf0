"""Bookings in the agent: the time left of each holder, POST /api/extend, and the end of a booking, by the rules of
gpupin.hostagent.ledger.booking. An extension is kept in `bookings.json` beside the socket, written before the caller
is answered, so it survives a restart; an ended booking's container is stopped as `docker stop` stops it, on a thread
of its own (docs/policy.md, "Bookings").
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import threading
import time

from gpupin.core.errors import GpupinError, UsageError, shown
from gpupin.hostagent.ledger import booking
from gpupin.hostagent.ls import listing
from gpupin.hostagent.serve import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from gpupin.core import JSONObject
    from gpupin.hostagent.ls.model import HolderShown, Listing
    from gpupin.hostagent.serve.interfaces import Agent, Handler, Peer


TICK_S = 0.25  # how often ended bookings are looked for: an end is kept well within 5 s
STOPPING = frozenset({"running", "paused", "restarting"})  # what `docker stop` has something to stop in
ROUTE = "/api/extend"


def _started(at: str | None) -> float | None:
    """A container's State.StartedAt in seconds since the epoch (None: never started, or unreadable)."""
    from gpupin.hostagent.engine.reads import created_time

    try:
        return None if not at else created_time(at)
    except (ValueError, IndexError):
        return None


def payload(view: Listing, cid: str, until: float | None, now: float) -> JSONObject:
    """An event's part about a booked holder (docs/serve.md, "Notifications"): its first card, the container, the
    user the agent booked it for (null uid and name: not the agent's, whatever its label claims), and the
    booking."""
    for card in view.gpus:
        for h in card.holders:
            b = h.booking
            if h.id != cid or b is None:
                continue
            o = h.owner
            user = {"uid": o.uid, "name": o.name} if o is not None and o.verified else {"uid": None, "name": None}
            return {
                "card": {"uuid": card.uuid, "index": card.index, "name": card.name},
                "container": {"id": cid, "name": h.name, "image": h.image},
                "user": user,
                "booking": {
                    "since": b.since,
                    "until": until,
                    "left_s": booking.left_s(until, now),
                },
            }
    return {"container": {"id": cid}}


class Bookings:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._lock = threading.Lock()
        self._until: dict[str, int] = {}  # container id -> until, as extended
        self._state: str | None = None
        self._stopping: dict[str, float] = {}  # container id -> when its stop was sent (monotonic)
        self._told: set[tuple[str, int]] = set()  # (container id, until) whose booking.ending went out
        self._cut: set[str] = set()  # container ids whose own booking label the policy changed (said once)
        self._judged: dict[str, int | None] = {}  # container id -> the end given a booking the agent did not make
        self._judged_file: str | None = None
        self.lateness: list[float] = []  # seconds between each end and its stop's signal (the log says each)

    # --- the state file ---

    def keep_in(self, directory: str) -> None:
        """Keep extensions in `directory` (the socket's), and take those an earlier agent left there; not in a
        directory others may write (nothing there is trusted): then in memory only."""
        st = os.stat(directory)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid != os.geteuid():
            say(f"extensions of bookings are kept in memory only: {directory} is not the agent's own directory")
            return
        self._state = os.path.join(directory, booking.STATE_FILE)
        self._judged_file = os.path.join(directory, booking.JUDGED_FILE)
        with self._lock:
            self._until.update(booking.read_extensions(directory))
            self._judged = booking.read_judged(directory)

    def _save(self) -> None:
        """Write the extensions (under the lock); a failure is the caller's refusal: an extension that a restart
        would lose is not granted."""
        if self._state is None:
            return
        from gpupin.core.files import write_atomic

        write_atomic(self._state, (json.dumps(self._until, sort_keys=True) + "\n").encode())

    def until(self, cid: str, label: int | None) -> int | None:
        with self._lock:
            return booking.ends(cid, label, self._until)

    def extensions(self) -> dict[str, int]:
        with self._lock:
            return dict(self._until)

    # --- the view ---

    def annotate(self, view: Listing, now: float) -> None:
        """Each holder's `booking` with its extension and the whole seconds left (gpupin.hostagent.ledger.booking);
        and forget the extensions of containers that no longer exist (read from the daemon: only when it answers)."""
        self._label_ends(view)
        with self._lock:
            listing.extend(view, self._until, now)
            seen = {h.id for card in view.gpus for h in card.holders}
            gone = set(self._until) - seen
            if view.docker.available and gone:
                for cid in gone:
                    del self._until[cid]
                with contextlib.suppress(GpupinError):
                    self._save()

    def _label_ends(self, view: Listing) -> None:
        """The bookings the agent did not make, by the policy in force for everyone (booking.label_length): a compose
        service's own (gpupin.booking.for, no owner), and a `gpupin.booking` label on a container the agent did not
        create (a claim: written by hand, or by a run without the agent), from the container's own start. Past the
        maximum it is cut to it, no end is the default, else the maximum (said once per container)."""
        policy = self.agent.in_force.policy
        labelled = set()
        judged: dict[str, int | None] = {}
        for card in view.gpus:
            for h in card.holders:
                b = h.booking
                if b is None:
                    continue
                claim = b.uid is not None
                if claim and h.owner is not None and h.owner.verified:
                    continue  # the agent's own: its label was written by the agent, for the uid it took at accept
                start = _started(h.started) if claim else b.since
                if start is None:
                    continue  # never started: it holds nothing, and its booking has not begun
                labelled.add(h.id)
                label_end = b.until
                asked = None if b.until is None else b.until - start
                length = booking.label_length(policy, asked)
                b.until = None if length is None else math.ceil(start + max(1, round(length)))
                judged[h.id] = b.until
                if (claim or b.until != label_end) and h.id not in self._cut:
                    self._cut.add(h.id)
                    given = "no end" if length is None else booking.format_duration(length)
                    said = "no duration" if asked is None else booking.format_duration(asked)
                    whose = f"claims uid {b.uid} (unverified: the agent did not create it) and " if claim else ""
                    say(f"booking: {shown(h.name)} ({h.id[:12]}) {whose}asks {said} by its label: booked {given}")
        if view.docker.available:
            self._cut &= labelled  # bounded by the containers there are
            if judged != self._judged:
                self._judged = judged
                self._save_judged()

    def _save_judged(self) -> None:
        """The ends judged, for `ls` without the agent (written when they change; a failure costs only that)."""
        if self._judged_file is None:
            return
        from gpupin.core.files import write_atomic

        with contextlib.suppress(GpupinError, OSError):
            write_atomic(self._judged_file, (json.dumps(self._judged, sort_keys=True) + "\n").encode())
            os.chmod(self._judged_file, 0o644)  # every user's `ls` reads it, whatever the agent's umask

    # --- extend ---

    def extend(self, target: str, seconds: float, peer: Peer) -> JSONObject:
        """POST /api/extend's work: `target` a container id, a unique id prefix or a name."""
        if (
            not isinstance(target, str)
            or not target
            or not isinstance(seconds, (int, float))
            or isinstance(seconds, bool)
        ):
            raise UsageError("POST /api/extend: {container, seconds} expected", "hostagent extend CONTAINER DURATION")
        if not 0 < seconds <= booking.LONGEST_S:
            raise UsageError(f"POST /api/extend: {seconds!r} seconds is not a duration", "e.g. 30m, 2h, 1d")
        h = self._find(target)
        b = h.booking
        name = shown(h.name)
        if b is None:
            raise UsageError(
                f"{name} has no booking (it was not made by hostagent run)", "only hostagent's bookings are extended"
            )
        caller = booking.Caller(peer.uid, {peer.gid, *peer.groups})
        policy = self.agent.in_force.policy
        owner = self.agent.owners.get(h.id)  # the uid the agent created it for: a label's uid is a claim
        with self._lock:
            until = booking.ends(h.id, b.until, self._until)
            new = booking.extended(name, owner, b.since, until, seconds, caller, policy, claimed=b.uid)
            was = self._until.get(h.id)
            self._until[h.id] = new
            try:
                self._save()
            except GpupinError as err:
                if was is None:
                    del self._until[h.id]
                else:
                    self._until[h.id] = was
                raise GpupinError(f"the extension could not be kept ({err.message})", "see the agent's log") from None
        say(f"extend: {h.id[:12]} until {time.strftime('%H:%M:%S', time.localtime(new))} for uid {peer.uid}")
        return {"id": h.id, "name": h.name, "until": new, "left_s": booking.left_s(new, time.time())}

    def _find(self, target: str) -> HolderShown:
        view = self.agent.snapshot().listing
        if view is None:
            raise GpupinError("the agent cannot read its view now", "try again in a moment")
        holders = {h.id: h for card in view.gpus for h in card.holders}
        found = [h for h in holders.values() if h.name == target or h.id == target]
        if not found and len(target) >= 4:
            found = [h for h in holders.values() if h.id.startswith(target)]
        if len(found) != 1:
            raise UsageError(
                f"{shown(target)} names {'no' if not found else 'more than one'} container that holds a card",
                "give its name or id, as hostagent ls shows it",
            )
        return found[0]

    def route(self, handler: Handler, body: JSONObject, peer: Peer) -> None:
        handler.answer(self.extend(body.get("container"), body.get("seconds"), peer))  # type: ignore[arg-type]

    # --- the end ---

    def due(self, now: float) -> list[tuple[str, str, float]]:
        """The holders whose booking has ended and that are not being stopped: (id, name, end)."""
        view = self.agent.snapshot().listing
        if view is None:
            return []
        out = {}
        with self._lock:
            for card in view.gpus:
                for h in card.holders:
                    b = h.booking
                    if b is None or h.state not in STOPPING or h.id in self._stopping:
                        continue
                    until = booking.ends(h.id, b.until, self._until)
                    if until is not None and until <= now:
                        out[h.id] = (h.id, h.name, float(until))
        return list(out.values())

    def _ending(self, now: float) -> None:
        """booking.ending, once per end, the policy's notify.before_end ahead of it."""
        notify = self.agent.in_force.policy.notify
        view = self.agent.snapshot().listing
        if notify is None or view is None:
            return
        ids = {h.id for card in view.gpus for h in card.holders}
        self._told = {t for t in self._told if t[0] in ids}  # bounded by the holders there are
        for card in view.gpus:
            for h in card.holders:
                b = h.booking
                if b is None or h.state not in STOPPING:
                    continue
                until = self.until(h.id, None if b.until is None else int(b.until))
                if until is None or (h.id, until) in self._told or not 0 < until - now <= notify.before_end:
                    continue
                self._told.add((h.id, until))
                self.agent.hooks.emit("booking.ending", payload(view, h.id, until, now))

    def _watch(self) -> None:
        while not self.agent.stopping.wait(TICK_S):
            try:
                now = time.time()
                self._ending(now)
                for cid, name, until in self.due(now):
                    with self._lock:
                        self._stopping[cid] = time.monotonic()
                    threading.Thread(
                        target=self._stop, args=(cid, name, until), name="booking-end", daemon=True
                    ).start()
                with self._lock:  # a stop that did not take is tried again after a while
                    for cid, at in list(self._stopping.items()):
                        if time.monotonic() - at > 120:
                            del self._stopping[cid]
            except Exception as err:  # a bug must not end the ends
                say(f"internal error while ending bookings: {type(err).__name__}: {err}")

    def _stop(self, cid: str, name: str, until: float) -> None:
        from gpupin.hostagent import engine

        self.agent.end_reason(cid, "expiry")
        view = self.agent.snapshot().listing
        told = payload(view, cid, until, time.time()) if view is not None else {"container": {"id": cid}}
        try:
            api = engine.connect()
            try:
                data = api.inspect_container(cid)
                grace = (data.get("Config") or {}).get("StopTimeout")
                late = time.time() - until
                self.lateness.append(late)
                say(f"booking ended: stopping {shown(name)} ({cid[:12]}), {late:.2f}s after its end")
                # No `t`: the daemon takes the container's own StopTimeout (and StopSignal), as `docker stop` does;
                # the client waits that long and more.
                api.timeout = max(60, (grace or 10) + 30)
                api.stop(cid, timeout=None if grace is None else grace)
            finally:
                api.close()
            self.agent.hooks.emit("booking.ended", {**told, "late_s": round(late, 3)})
        except Exception as err:
            say(f"booking ended: could not stop {shown(name)} ({cid[:12]}): {getattr(err, 'message', err)}")
        self.agent.container_changed()

    def start(self) -> None:
        threading.Thread(target=self._watch, name="bookings", daemon=True).start()
