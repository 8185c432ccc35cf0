"""The agent's live view: NVML re-read every `interval`, the ledger at each container event (and every `resync`
seconds), through the code `hostagent ls` uses, with idle holders filled in. Readers take `snapshot()`; waiters
block in `wait_change()`. What cannot be read is unknown, never stale (docs/design.md, "The resident agent").
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time

from gpupin.core import nvml, readings
from gpupin.core.errors import GpupinError
from gpupin.hostagent.ledger import lock
from gpupin.hostagent.ls import listing
from gpupin.hostagent.ls.model import DockerState
from gpupin.hostagent.serve import idle, samples, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.core.identity import BusId
    from gpupin.core.nvml import Card
    from gpupin.hostagent.authz.grant import Grants
    from gpupin.hostagent.engine.events import EventStream
    from gpupin.hostagent.ledger.read import LedgerReading
    from gpupin.hostagent.ls.model import Listing
    from gpupin.hostagent.record.writer import RecordWriter
    from gpupin.hostagent.serve.bookings import Bookings
    from gpupin.hostagent.serve.hooks import Hooks
    from gpupin.hostagent.serve.policy_in_force import PolicyInForce
    from gpupin.hostagent.serve.queue import Queue


RECONNECT_MAX = 5.0  # seconds between two attempts to reach the daemon's event stream, at most


# What the ledger lock's containers do on every run (taken and let go by a rename, a spare made or removed): never
# started, they hold nothing, and the ledger read passes them by. Their events would only cost a read of the ledger
# while the caller starts its container.
_LOCK_ACTIONS = frozenset({"create", "rename", "destroy"})


def _lock_only(event: Any) -> bool:
    """Whether a container event is the ledger lock's own (a lock label, and an action that starts nothing)."""
    if not isinstance(event, dict) or event.get("Action") not in _LOCK_ACTIONS:
        return False
    attributes = (event.get("Actor") or {}).get("Attributes") or {}
    return isinstance(attributes, dict) and lock.LOCK_LABEL in attributes


class Snapshot:
    """The view at one refresh: the listing (None while NVML cannot be read), the error that withdrew it, a
    version that grows with every change, and when it was read (seconds since the epoch)."""

    __slots__ = ("_event", "_json", "error", "listing", "read_at", "version")

    def __init__(self, version: int, listing: Listing | None, error: str | None, read_at: float) -> None:
        self.version = version
        self.listing = listing
        self.error = error
        self.read_at = read_at
        self._json: JSONObject | None = None
        self._event: bytes | None = None

    def as_json(self) -> JSONObject | None:
        """The listing as /api/ls serves it, made once per snapshot (every reader of a version shares it)."""
        if self._json is None and self.listing is not None:
            self._json = self.listing.to_json()
        return self._json

    def event(self) -> bytes:
        """The snapshot as one /api/events event, encoded once (every stream of a version sends the same bytes)."""
        if self._event is None:
            import json

            data = json.dumps(self.as_json() if self.listing is not None else {"error": self.error})
            self._event = f"event: ls\nid: {self.version}\ndata: {data}\n\n".encode()
        return self._event


class Agent:
    """The live view and the three threads that keep it: `refresh` (NVML every `interval`), `ledger` (who holds
    which card, when marked dirty) and `docker-events` (the daemon's stream, which marks it dirty); `start()` reads
    once, then runs them."""

    def __init__(
        self,
        interval: float = 0.5,
        idle_after: float = 1800.0,
        resync: float = 30.0,
        policy: str | None = None,
        record: RecordWriter | None = None,
        hooks: Hooks | None = None,
        in_force: PolicyInForce | None = None,
    ) -> None:
        """`policy`: the policy file (its default: /etc/gpupin/policy.toml), or `in_force`: the policy already read
        (serve reads it before anything is made); `record`: the record's writer (None: `--record none`); `hooks`:
        the notifications (a Hooks of its own when not given)."""
        from gpupin.hostagent.authz.grant import Grants
        from gpupin.hostagent.policy import policy_path
        from gpupin.hostagent.serve.bookings import Bookings
        from gpupin.hostagent.serve.hooks import Hooks
        from gpupin.hostagent.serve.owners import Owners
        from gpupin.hostagent.serve.policy_in_force import PolicyInForce
        from gpupin.hostagent.serve.queue import Queue

        self.interval = interval
        self.resync = resync
        self.hooks = hooks if hooks is not None else Hooks()
        self.record = record  # the record's writer (gpupin.hostagent.record.writer), when one is kept
        # The policy in force (docs/policy.md); the hooks take each one's notify rule.
        self.in_force: PolicyInForce = in_force or PolicyInForce(policy or policy_path())
        self.in_force.attach(lambda p: self.hooks.apply(p.notify))
        # Who the agent created each container for: all that quotas, exemptions and `extend` believe.
        self.owners: Owners = Owners(self._recorded_owner if record is not None else None)
        self.idle = idle.watch(self, idle_after, say)
        self.samples = samples.Samples()
        self.bookings: Bookings = Bookings(self)  # the ends of bookings, their extensions and expiry
        self.queue: Queue = Queue(self)  # the fair queue of `run --wait`
        self.grants: Grants = Grants()  # what the authorization plugin admits its creates by (enforce mode `on`)
        # The plugin's last judgements that said something (denials; under `warn`, what it let through): /api/agent.
        self.judged: collections.deque[JSONObject] = collections.deque(maxlen=50)
        self.standby_locks = (
            lock.StandbyLocks()
        )  # the ledger lock its runs take by a rename (gpupin.hostagent.ledger.lock)
        # XIDs come as NVML events, only to a registration that exists when they happen: the agent holds one.
        self.xids = readings.XidLog()
        self.started = time.time()
        self.stopping = threading.Event()
        self._wake = threading.Event()  # the ledger was read: refresh now, not at the next tick
        self._lock = threading.Lock()  # the cards last read, and the ledger's reading for them
        self._retry = threading.Event()  # the daemon answers again: reconnect its event stream now
        self.following = False  # whether the daemon's event stream is open
        self._dirty = threading.Event()  # the ledger must be read again
        self._changed = threading.Condition()
        self._snapshot = Snapshot(0, None, "not read yet", 0.0)
        self._docker: DockerState | None = None
        self._reading: LedgerReading | None = None
        self._cards: list[Card] | None = None
        self._cards_key: tuple[str | None, ...] | None = None  # the UUIDs of the cards the ledger was read for
        self._identity: dict[int, tuple[str, BusId | None, str | None, int | None]] = {}  # by index (_identify)
        self._counted = 0
        self._ledger_at = 0.0
        self._stream: EventStream | None = None
        self._threads: list[threading.Thread] = []

    # --- the record, for the parts that note or read it (nothing without one) ---

    def end_reason(self, container_id: str, reason: str) -> None:
        """How `container_id`'s intervals end ("expiry", "idle", ...), noted before it stops; read when they close.
        The record must never stop an end: its trouble is its writer's to say."""
        if self.record is not None:
            with contextlib.suppress(Exception):
                self.record.end_reason(container_id, reason)

    def note_owner(self, container_id: str, uid: int) -> None:
        """The caller the agent created `container_id` for: its uid at accept owns the container (its quotas, its
        exemptions, its extensions) and the container's intervals."""
        self.owners.note(container_id, uid)
        if self.record is not None:
            self.record.note_owner(container_id, uid)

    def _recorded_owner(self, container_id: str) -> int | None:
        """The owner an earlier agent noted in the record (None: none, or the record cannot be read)."""
        try:
            return self.record.store.owner(container_id) if self.record is not None else None
        except Exception:  # sqlite3.Error, a closed store: the record's trouble is said by its writer
            return None

    def finished(self, uid: int, since: float) -> list[tuple[float, float]]:
        """`uid`'s closed intervals that ended after `since` (the GPU-hour quotas' past); none without a record, or
        while it cannot be read (a degraded record must not refuse runs)."""
        if self.record is None:
            return []
        try:
            return self.record.store.finished(uid, since)
        except Exception:  # sqlite3.Error, a closed store: the record's trouble is said by its writer
            return []

    # --- readers ---

    def snapshot(self) -> Snapshot:
        with self._changed:
            return self._snapshot

    def wait_change(self, version: int, timeout: float) -> Snapshot:
        """The first snapshot newer than `version`, or the current one after `timeout` seconds or at stop."""
        with self._changed:
            self._changed.wait_for(lambda: self._snapshot.version != version or self.stopping.is_set(), timeout)
            return self._snapshot

    # --- the refresh ---

    def refresh(self) -> None:
        """Read NVML and publish the view, with the ledger's last reading (the `ledger` thread keeps it current);
        cards that differ from those the ledger was read for are read with it here, before anything is shown."""
        try:
            cards = listing.read_cards(self.xids)
        except GpupinError as err:
            self._withdraw("NVML unavailable", err.message)
            return
        self._identify(cards)
        with self._lock:
            self._cards = cards
            docker, reading, read_for = self._docker, self._reading, self._cards_key
        if docker is None or read_for != tuple(c.uuid for c in cards):
            docker, reading = self.read_ledger()  # holders read for other cards would show these free: not known
        try:
            view = listing.assemble(cards, docker, reading)
        except Exception as err:  # an NVML reading that failed otherwise than "not supported": unknown, not stale
            self._withdraw("NVML unavailable", f"{type(err).__name__}: {err}")
            return
        self.owners.annotate(view)  # before the parts that read whose a holder is
        self.idle.observe(view, time.monotonic(), time.time())
        self.samples.add(view, time.time())
        self.bookings.annotate(view, time.time())
        record = self.record
        if record is not None:
            view.record = record.status()  # `degraded` says what could not be written (a full disk)
            record.observe(view, cards)  # a few dict updates here; the writer's thread writes
        self._publish(view, None)

    def ledger_now(self) -> tuple[list[Card] | None, LedgerReading | None, Listing | None]:
        """The cards of the last refresh, the ledger's last reading and the last view, as they are (no read: the
        authorization plugin's judge must not wait on the daemon whose request it judges)."""
        with self._lock:
            cards, reading = self._cards, self._reading
        return cards, reading, self.snapshot().listing

    def read_ledger(self) -> tuple[DockerState, LedgerReading | None]:
        """Read who holds which of the last refresh's cards (the listing's `docker` object and the reading), and
        keep it for the views to come."""
        with self._lock:
            cards = self._cards
        if cards is None:
            raise RuntimeError("the ledger is read for the cards of a refresh: none yet")
        self._dirty.clear()  # an event from now on asks for another read
        was = self._docker.available if self._docker else None
        docker, reading = listing.read_ledger(cards, warn=False)
        with self._lock:
            self._docker, self._reading, self._cards_key = docker, reading, tuple(c.uuid for c in cards)
            self._ledger_at = time.monotonic()
        if docker.available and not self.following:
            self._retry.set()
        if was is not None and was != docker.available:
            say(
                f"Docker at {docker.host} " + ("answers again" if docker.available else f"unavailable ({docker.error})")
            )
        return docker, reading

    def _identify(self, cards: list[Card]) -> None:
        """A card NVML can no longer read (lost, fallen off the bus) keeps the identity it was last read with, so
        that its holders and its series stay its own while its readings are unknown. NVML still counts such a card
        at its index; when the count changes, an index may name another card, and nothing is carried over."""
        if len(cards) != self._counted:
            self._identity.clear()
            self._counted = len(cards)
        for c in cards:
            if c.uuid is not None:
                self._identity[c.index] = (c.uuid, c.bus_id, c.name, c.minor_number)
            elif c.error and c.index in self._identity:
                c.uuid, c.bus_id, c.name, c.minor_number = self._identity[c.index]

    def _withdraw(self, what: str, error: str) -> None:
        """Serve the error instead of a view (said once in the log), and open NVML afresh at the next refresh (a
        reloaded driver needs a new session)."""
        if error != self.snapshot().error:
            say(f"{what}: {error}")
        self._publish(None, error)
        self.xids.release()
        with contextlib.suppress(Exception):
            nvml.shutdown()

    def _publish(self, view: Listing | None, error: str | None) -> None:
        with self._changed:
            old = self._snapshot
            if error is None and old.error is not None and old.version > 0:
                say("NVML answers again")
            changed = view != old.listing or error != old.error
            self._snapshot = Snapshot(old.version + changed, view, error, time.time())
            if changed:
                self._changed.notify_all()

    def container_changed(self) -> None:
        self._dirty.set()

    # --- threads ---

    def _tick(self) -> None:
        while not self.stopping.is_set():
            try:
                self.refresh()
            except Exception as err:  # a bug must not stop the agent: the view is withdrawn, the next tick retries
                self._withdraw("internal error while refreshing", f"{type(err).__name__}: {err}")
            self._wake.wait(self.interval)
            self._wake.clear()

    def _ledger(self) -> None:
        """Read the ledger at each container event, every `resync` seconds in case one was lost, and every `interval`
        while the daemon does not answer; then refresh at once. Its own thread: a daemon that hangs delays who holds
        which card (each read gives up after 10 s), never the cards' own readings."""
        while not self.stopping.is_set():
            with self._lock:
                down = self._docker is None or not self._docker.available
                due = self._ledger_at + (self.interval if down else self.resync) - time.monotonic()
            self._dirty.wait(max(0.0, due))
            if self.stopping.is_set():
                break
            with self._lock:
                known = self._cards is not None
            if not known:  # NVML has given no cards yet (it does not answer): no ledger to read for them, so wait
                self.stopping.wait(self.interval)
                continue
            try:
                self.read_ledger()
            except Exception as err:  # a bug must not stop the agent: the next event or resync reads again
                say(f"internal error while reading the ledger: {type(err).__name__}: {err}")
                self.stopping.wait(self.interval)
            self._wake.set()

    def _follow(self) -> None:
        from gpupin.hostagent.engine import EventStream

        delay = 0.5
        while not self.stopping.is_set():
            self._retry.clear()
            try:
                stream = EventStream()
            except GpupinError:
                self._retry.wait(delay)  # or at once when a ledger read reaches the daemon again
                delay = min(delay * 2, RECONNECT_MAX)
                continue
            self._stream = stream
            self.following = True
            if self.stopping.is_set():  # stop() ran before the stream was kept: close it here
                stream.close()
                break
            delay = 0.5
            self.container_changed()  # what happened while no stream was open
            try:
                for event in stream:
                    if _lock_only(event):
                        continue
                    if self.record is not None:
                        self.record.event(event)  # start and die times, stops: the record's intervals
                    self.container_changed()
            except GpupinError:
                pass
            self.following = False
            self.container_changed()  # the daemon ended the stream: it restarts, or is gone (the view says so)
            stream.close()

    def start(self) -> None:
        """Read once, then run the threads: the view's three, the fair queue's and the bookings' ends."""
        self.refresh()
        for target, name in ((self._tick, "refresh"), (self._ledger, "ledger"), (self._follow, "docker-events")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self.queue.start()
        self.bookings.start()

    def stop(self, timeout: float = 2.0) -> None:
        self.stopping.set()
        self._wake.set()
        self._dirty.set()
        self._retry.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        with self._changed:
            self._changed.notify_all()
        # One deadline for all: a thread blocked on a daemon that does not answer is a daemon thread, left to the
        # process's exit, and SIGTERM's few seconds must not be spent once per thread.
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.standby_locks.close()
        self.xids.release()
