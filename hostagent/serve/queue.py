"""The agent's fair queue for `hostagent run --wait`: it grants turns, the waiting stays in the client. POST
/api/queue (unix socket) joins and streams JSON lines (queued, position, turn, lost) while the caller stays; the
caller writes `again` after a refused attempt. The caller's user is the kernel's word, a place is bounded and not
a hold, and tickets survive a restart in `queue.json`. The rule is gpupin.hostagent.serve.fair; the protocol and
bounds: docs/serve.md, "The queue".
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import stat
import threading
import time
from typing import NamedTuple

from gpupin.core.errors import EX_TEMPFAIL, AgentUnavailableError, GpupinError, UsageError, shorten, shown
from gpupin.hostagent import agentlink
from gpupin.hostagent.serve import fair, rights, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.ls.model import BookingShown, HolderShown, Listing
    from gpupin.hostagent.policy import admit
    from gpupin.hostagent.serve.interfaces import Agent, Handler, Peer


TURN_S = 5.0  # a turn unanswered this long lapses (the waiter keeps its place, passed over until it asks again)
COOL_S = 0.5  # after `again`, the next turn no sooner than this (the lock may still be held: do not spin)
TICK = 0.25  # seconds between two looks at lapses and cooling when the view does not change
REJOIN_S = 60.0  # how long after its start the agent honours the tickets of the queue it found
MAX_WAITERS = 8  # places one uid (other than root) may hold at once: more --wait runs than that are one user's loop
MAX_LAPSES = 3  # turns not used (cards still usable) before the place is lost: a slow client is forgiven twice
LAPSE_CHECK_S = 1.0  # after `again`, how long until its cards are looked at (the view follows the create that won)
# A turn's cards once its waiter left (it booked them, most often): offered to no one until the view shows them
# taken, or this long. The view follows a create by the daemon's event; a turn granted from a view that has not yet
# would send its waiter to a card just taken, to be refused and wait again.
TAKEN_S = 5.0
STATE_FILE = "queue.json"


class JoinRequest(NamedTuple):
    """POST /api/queue's body, read once: the cards asked for, what the run is, and an earlier agent's ticket."""

    ask: fair.QueueRequest
    name: str | None
    image: str | None
    command: list[str]
    ticket: str | None

    @classmethod
    def parse(cls, body: JSONObject) -> JoinRequest:
        """The body, checked as `run` checks its options (a refusal is exit 64)."""
        command = body.get("command")
        ticket = body.get("ticket")
        return cls(
            _ask(body),
            _text(body.get("name")),
            _text(body.get("image")),
            [str(c) for c in command] if isinstance(command, list) else [],
            ticket if isinstance(ticket, str) else None,
        )


# The stream's lines (docs/serve.md, "The queue"); None in an outbox ends the stream.
class Standing(NamedTuple):
    """`queued`: a waiter's place as it joins (Queue.standing)."""

    ticket: str
    since: float
    position: int
    of: int
    turn: bool
    clear: bool

    def to_json(self) -> JSONObject:
        return {"queued": self._asdict()}


class Turn(NamedTuple):
    cards: list[str]

    def to_json(self) -> JSONObject:
        return {"turn": {"cards": self.cards}}


class Position(NamedTuple):
    position: int
    of: int

    def to_json(self) -> JSONObject:
        return {"position": self.position, "of": self.of}


class Held(NamedTuple):
    """The waiter is over a quota of the policy: it keeps its place, but gets no turn until the quota frees."""

    why: str

    def to_json(self) -> JSONObject:
        return {"held": self.why}


class Lost(NamedTuple):
    why: str

    def to_json(self) -> JSONObject:
        return {"lost": self.why}


class Direct(NamedTuple):
    """The caller talks to another daemon: run without the queue (gpupin.hostagent.agentlink.other_daemon)."""

    why: str

    def to_json(self) -> JSONObject:
        return {"direct": self.why}


if TYPE_CHECKING:
    from typing import TypeAlias

    Message: TypeAlias = Standing | Turn | Position | Held | Lost | Direct


class QueuedRun:
    """One `hostagent run --wait` in the queue: who (from the socket), what it asks, since when, its turn."""

    def __init__(self, request: JoinRequest, peer: Peer, since: float, ticket: str) -> None:
        self.ask = request.ask
        self.uid, self.pid, self.user = peer.uid, peer.pid, peer.user()
        self.gids = frozenset({peer.gid, *peer.groups})  # for the policy's quotas
        self.name = request.name
        self.image = request.image
        self.command = request.command
        self.since = since
        self.ticket = ticket
        self.offered: list[str] | None = None  # the cards of the turn that is out
        self.turn_at = 0.0  # monotonic: when that turn went out, or when it last asked again
        self.lapsed = False
        self.lapses = 0  # turns not used while their cards stayed usable (MAX_LAPSES lose the place)
        self.again_on: tuple[list[str], float] | None = None  # the cards of a turn answered `again`, and when
        self.asked_again = False
        self.notified = False  # queue.turn went to the hooks (gpupin.hostagent.serve.hooks)
        self.position = 0
        self.held = False  # over a quota, and told so (told again after it was within its quotas)
        self._outbox: list[Message | None] = []
        self.wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    @property
    def cooling(self) -> bool:
        return self.asked_again and time.monotonic() - self.turn_at < COOL_S

    def post(self, message: Message | None) -> None:
        """A line for the stream (None: the stream ends)."""
        self._outbox.append(message)
        with contextlib.suppress(BlockingIOError, OSError):  # a full pipe already wakes it
            os.write(self._wake_w, b".")

    def take(self) -> list[Message | None]:
        out, self._outbox = self._outbox, []
        return out

    def close(self) -> None:
        for fd in (self.wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def to_json(self) -> JSONObject:
        """A waiter as GET /api/queue shows it."""
        return {
            "position": self.position,
            "name": self.name,
            "user": self.user,
            "uid": self.uid,
            "pid": self.pid,
            "request": self.ask.shown(),
            "gpus": self.ask.gpus,
            "count": self.ask.count,
            "share": self.ask.share,
            "image": self.image,
            "command": self.command,
            "since": self.since,
            "turn": self.offered is not None,
            "turn_cards": self.offered,
        }


def _audit(w: QueuedRun, what: str) -> None:
    """The agent's log line for a change of a waiter's place, in the form of the run's (gpupin.hostagent.serve.runs):
    what happened, then who, as the kernel named them at accept. The request and the user name go through the one
    rule for a user's text."""
    say(f"queue: {what}: {shown(w.ask.shown())} for uid {w.uid} ({shown(w.user)}) pid {w.pid}")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _ask(body: JSONObject) -> fair.QueueRequest:
    """The request in the body, checked as `run` checks its options (a refusal is exit 64)."""
    gpus, count = body.get("gpus") or [], body.get("count")
    limits = [body.get("max_load"), body.get("max_memory")]
    if (
        not isinstance(gpus, list)
        or not all(isinstance(g, str) and g for g in gpus)
        or not (count is None or (isinstance(count, int) and not isinstance(count, bool) and count >= 1))
        or bool(gpus) == (count is not None)
        or not all(v is None or (isinstance(v, (int, float)) and 0 <= v <= 100) for v in limits)
    ):
        raise UsageError(
            f"POST /api/queue: the request needs gpus (a list of specs) or count (>= 1), not both, "
            f"and limits in percent (got gpus={shorten(gpus)}, count={shorten(count)}, "
            f"limits={shorten(limits)})"
        )
    return fair.QueueRequest(gpus, count, bool(body.get("share")), *limits)


class Queue:
    """The waiters in arrival order, the thread that grants their turns, and the tickets of an earlier agent."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._lock = threading.RLock()
        self._waiters: list[QueuedRun] = []
        self._returning: dict[str, tuple[int, float]] = {}  # ticket -> (uid, arrival) from the file, until REJOIN_S
        self._taken: dict[str, float] = {}  # card -> when a waiter left holding a turn on it (TAKEN_S)
        self._state: str | None = None

    def start(self) -> None:
        """The thread that grants the turns (the agent starts it with its own)."""
        threading.Thread(target=self._run, name="queue", daemon=True).start()

    # --- the waiters ---

    def join(self, body: JSONObject, peer: Peer) -> QueuedRun:
        refused = rights.refusal(peer)
        if refused is not None:  # a place holds others back: only for those who could book themselves
            raise UsageError(f"POST /api/queue: {refused}", "wait without the agent's queue (run --wait polls)")
        request = JoinRequest.parse(body)
        ask = request.ask
        view = self.agent.snapshot().listing
        if ask.gpus and view is not None:
            fair.resolve(ask, view)  # a spec that names no card: refused now (64), not waited for forever
        if ask.count is not None and view is not None and ask.count > fair.healthy(view):
            raise UsageError(
                f"POST /api/queue: --count {ask.count}, but this host has {fair.healthy(view)} healthy whole card(s)",
                "ask for at most that many",
            )
        from gpupin.hostagent.ledger.booking import Caller
        from gpupin.hostagent.policy import admit

        never = admit.never(
            self.agent.in_force.policy,
            Caller(peer.uid, {peer.gid, *peer.groups}),
            ask.count or len(ask.gpus) or 1,
        )
        if never is not None:  # a quota no wait can meet: refused now, not waited for forever
            raise never
        ticket = request.ticket
        with self._lock:
            if self.agent.stopping.is_set():  # (under the lock: a waiter that got in gets the stop's end of stream)
                raise AgentUnavailableError("the agent is stopping", "join the next one (a restart keeps the order)")
            quota = self.agent.in_force.policy.quota(peer.uid, frozenset({peer.gid, *peer.groups})).waiters
            places = MAX_WAITERS if quota is None else min(quota, MAX_WAITERS)
            if peer.uid != 0 and sum(w.uid == peer.uid for w in self._waiters) >= places:
                full = GpupinError(
                    f"POST /api/queue: uid {peer.uid} already waits in {places} places of the queue"
                    + (" (quota waiters)" if places == quota else ""),
                    "let one of them finish first",
                )
                full.exit_code = EX_TEMPFAIL
                raise full
            back = self._returning.get(ticket) if ticket is not None else None
            since, kept = time.time(), secrets.token_hex(16)
            if (
                back is not None
                and ticket is not None
                and back[0] == peer.uid
                and since - self.agent.started <= REJOIN_S
            ):
                since, kept = back[1], ticket
                del self._returning[kept]  # once
            w = QueuedRun(request, peer, since, kept)
            self._waiters.append(w)
            self._waiters.sort(key=lambda x: x.since)  # stable: equal times keep the order they came in
        try:
            self._changed()
        except BaseException:
            self.leave(w)
            raise
        with self._lock:
            _audit(w, f"joined at {w.position} of {len(self._waiters)}")
        return w

    def leave(self, w: QueuedRun) -> None:
        with self._lock:
            for card in w.offered or ():
                self._taken[card] = time.monotonic()
            if w in self._waiters:
                why = " (the agent stops)" if self.agent.stopping.is_set() else ""
                _audit(w, f"left{why} from {self._waiters.index(w) + 1} of {len(self._waiters)}")
                self._waiters.remove(w)
        w.close()
        self._changed()

    def _changed(self) -> None:
        """Someone joined or left: the turns again, and the file (not while the agent stops: its waiters leave
        then only to join the next agent, which reads the file)."""
        with self._lock:
            self._grant()
            if not self.agent.stopping.is_set():
                self._save()

    def again(self, w: QueuedRun) -> None:
        """The turn's attempt was refused: keep the place, and wait for the next turn (its cards are looked at
        LAPSE_CHECK_S later: still usable, the turn was not used)."""
        with self._lock:
            if w.offered is not None and w.again_on is None:  # (one look at a time: the first again's)
                w.again_on = (w.offered, time.monotonic())
            w.offered, w.lapsed, w.asked_again, w.turn_at = None, False, True, time.monotonic()
            self._grant()

    def standing(self, w: QueuedRun) -> Standing:
        """A waiter's place as it joins: its ticket, arrival, position; whether its turn came with it, and if not,
        whether it is clear: no earlier waiter could take any card it could take, so that looking now (and
        saying who holds its cards) overtakes no one, whenever they free. Otherwise it waits for its turn."""
        with self._lock:
            view = self.agent.snapshot().listing
            mine = self._waiters.index(w) if w in self._waiters else 0
            return Standing(
                w.ticket,
                w.since,
                w.position,
                len(self._waiters),
                w.offered is not None,
                view is not None and fair.clear(self._waiters, mine, view),
            )

    def waiters(self) -> list[QueuedRun]:
        """The waiters now, in order."""
        with self._lock:
            return list(self._waiters)

    def listing(self) -> JSONObject:
        """GET /api/queue's answer."""
        with self._lock:
            return {"agent_started": self.agent.started, "waiters": [w.to_json() for w in self._waiters]}

    # --- the turns ---

    def _within_quota(self, view: Listing) -> list[QueuedRun]:
        """The waiters the policy's quotas let take a card now, in order: one over its quota keeps its place but is
        given no turn, and holds no card back from those after it (gpupin.hostagent.policy.admit). Each one over its
        quota is told why, once (its position alone would not say that it waits for its own quota)."""
        from gpupin.hostagent.ledger.booking import Caller
        from gpupin.hostagent.policy import admit

        policy = self.agent.in_force.policy
        if not policy.enforced:
            return list(self._waiters)
        held = view_holdings(view)
        within = []
        for w in self._waiters:
            why = admit.over(
                policy, Caller(w.uid, w.gids), w.ask.count or len(w.ask.gpus) or 1, held, self.agent.finished
            )
            if why is None:
                within.append(w)
            elif not w.held:
                w.post(Held(why))
            w.held = why is not None
        return within

    def _grant(self) -> None:
        """Lapse the turns unanswered too long, hand out the turns the rule gives, and tell each waiter whose
        place changed. Called under the lock."""
        now = time.monotonic()
        view = self.agent.snapshot().listing
        for w in list(self._waiters):
            unused: list[str] = []  # the cards of a turn not used
            if w.offered is not None and now - w.turn_at > TURN_S:
                unused = w.offered if view is not None and fair.still_usable(w.ask, w.offered, view) else []
                w.offered, w.lapsed = None, True
            if w.again_on is not None and now - w.again_on[1] >= LAPSE_CHECK_S:
                cards = w.again_on[0]
                unused = cards if view is not None and fair.still_usable(w.ask, cards, view) else []
                w.again_on = None
            if unused:
                w.lapses += 1
                _audit(w, f"turn on {','.join(unused)} unused, lapse {w.lapses} of {MAX_LAPSES}")
            if w.lapses >= MAX_LAPSES:
                _audit(w, f"lost its place at {self._waiters.index(w) + 1} of {len(self._waiters)}")
                self._waiters.remove(w)  # the stream ends after the line: the caller joins again as new, if at all
                w.post(Lost(f"{MAX_LAPSES} turns went unused while their cards were free: the place is lost"))
                w.post(None)
        within = self._within_quota(view) if view is not None else []
        taken = self._still_taken(view, now)
        for n, cards in (fair.grantable(within, view, taken) if view is not None else {}).items():
            w = within[n]
            w.offered, w.turn_at, w.asked_again = cards, now, False
            w.post(Turn(cards))
            if not w.notified:  # its first turn only: the tries after an `again` are the same news
                w.notified = True
                self.agent.hooks.emit(
                    "queue.turn",
                    {
                        "cards": cards,
                        "container": {"id": None, "name": w.name, "image": w.image},
                        "user": {"uid": w.uid, "name": w.user},
                        "waited_s": round(time.time() - w.since, 3),
                    },
                )
        for n, w in enumerate(self._waiters, 1):
            if w.position not in (0, n):
                w.post(Position(n, len(self._waiters)))
            w.position = n

    def _still_taken(self, view: Listing | None, now: float) -> set[str]:
        """The cards left with a turn that the view still shows free, for TAKEN_S at most. Under the lock."""
        free = {g.uuid for g in view.gpus if g.use.state in ("free", "shared")} if view is not None else set()
        for card, at in list(self._taken.items()):
            if now - at > TAKEN_S or (view is not None and card not in free):
                del self._taken[card]
        return set(self._taken)

    def _run(self) -> None:
        version = -1
        failed = None
        while not self.agent.stopping.is_set():
            version = self.agent.wait_change(version, TICK).version
            try:
                with self._lock:
                    self._grant()
                    if self._returning and time.time() - self.agent.started > REJOIN_S:
                        self._returning.clear()
                failed = None
            except Exception as err:  # a bug must not end the granting: said once, tried again at the next tick
                if repr(err) != failed:
                    say(f"internal error while granting turns: {type(err).__name__}: {err}")
                failed = repr(err)
        with self._lock:  # the agent stops: end every stream, so that the waiters reconnect to the next agent
            for w in self._waiters:
                w.post(None)

    # --- the file that outlives the agent ---

    def keep_in(self, directory: str) -> None:
        """Keep the tickets in `directory` (the socket's), and take those an earlier agent left there. Not in a
        directory that others may write (nothing there is trusted): the queue then lives in memory only."""
        st = os.stat(directory)
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid != os.geteuid():
            say(f"the queue is kept in memory only: {directory} is not the agent's own directory")
            return
        self._state = os.path.join(directory, STATE_FILE)
        try:
            fd = os.open(self._state, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return
        with os.fdopen(fd) as f:
            try:
                kept = json.load(f)["waiters"]
                found = {str(k["ticket"]): (int(k["uid"]), float(k["since"])) for k in kept}
            except (ValueError, KeyError, TypeError) as err:
                say(f"{self._state} unreadable ({err}): the earlier queue's waiters join again as new")
                return
        with self._lock:
            self._returning = found
        if found:
            say(f"{len(found)} waiter(s) of the earlier agent may rejoin in their order for {REJOIN_S:g}s")

    def _save(self) -> None:
        if self._state is None:
            return
        data = {
            "waiters": [{"ticket": w.ticket, "uid": w.uid, "since": w.since} for w in self._waiters]
            + [{"ticket": t, "uid": u, "since": s} for t, (u, s) in self._returning.items()]
        }
        tmp = f"{self._state}.{os.getpid()}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self._state)
        except OSError as err:
            say(f"could not keep the queue in {self._state} ({err.strerror or err}): a restart will not keep its order")

    # --- the routes ---

    def serve(self, handler: Handler, body: JSONObject, peer: Peer) -> None:
        """POST /api/queue: join, stream this waiter's news, leave when the caller closes (or the agent stops). A
        caller of another daemon is answered `{"direct": WHY}`, as a run is (gpupin.hostagent.agentlink.other_daemon):
        this queue is for the cards of this agent's daemon."""
        why = agentlink.other_daemon(body.get("daemon"))
        if why is not None:
            self._stream(handler)
            self._write(handler, Direct(why))
            return
        if handler.stream_refused():  # a place in the queue is a stream: counted apart (docs/serve.md, "Limits")
            return
        w = self.join(body, peer)
        try:
            self._stream(handler)
            self._write(handler, self.standing(w))
            conn = handler.connection
            events = select.poll()
            events.register(conn, select.POLLIN)
            events.register(w.wake_r, select.POLLIN)
            while True:
                ready = {fd for fd, _ in events.poll()}
                if w.wake_r in ready:
                    os.read(w.wake_r, 4096)
                    for message in w.take():
                        if message is None:  # the agent stops
                            return
                        self._write(handler, message)
                if conn.fileno() in ready:
                    data = conn.recv(4096)
                    if not data:
                        return  # the caller left: Ctrl-C, success, or it gave up
                    if b"again" in data:
                        self.again(w)
        finally:
            self.leave(w)

    @staticmethod
    def _stream(handler: Handler) -> None:
        """The answer's head: 200, a stream of JSON lines."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/x-ndjson")
        handler.send_header("Cache-Control", "no-store")
        handler.end_headers()

    @staticmethod
    def _write(handler: Handler, message: Message) -> None:
        handler.wfile.write((json.dumps(message.to_json()) + "\n").encode())
        handler.wfile.flush()


def view_holdings(view: Listing) -> list[admit.Holding]:
    """The holds in the agent's view, as the quotas count them (gpupin.hostagent.policy.admit): each for the uid
    the agent created it for or admitted it by a grant (the view's proven owner); a label's uid is a claim, counted
    for no one."""
    from gpupin.hostagent.policy import admit

    seen: dict[str, tuple[HolderShown, BookingShown | None, int]] = {}
    cards: dict[str, int] = {}
    for card in view.gpus:
        for h in card.holders:
            owner = h.owner
            if h.holds and owner is not None and owner.verified and owner.uid is not None:
                seen[h.id] = (h, h.booking, owner.uid)
                cards[h.id] = cards.get(h.id, 0) + 1
    return [
        admit.Holding(
            uid,
            cards[i],
            b.until if b is not None else None,
            h.name,
            admit.since(b.since if b is not None else None, h.started),
        )
        for i, (h, b, uid) in seen.items()
    ]
