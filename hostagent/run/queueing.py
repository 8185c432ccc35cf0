"""`hostagent run --wait`'s side of the agent's fair queue: `QueueClient`, opened once per run, `join`s before the
first attempt and waits for the `next` turn after each refusal (75); without an agent, or once it goes away, it
polls every POLL_S as --wait always did, and joins again with its ticket when an agent returns (docs/run.md,
"--wait with the agent: a fair queue").
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import random
import socket
import threading
import time

from gpupin.core.errors import EX_USAGE, GpupinError, shown
from gpupin.hostagent import agentlink, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.run.request import RunRequest

POLL_S = 0.5  # without the agent: how often a --wait request looks at the ledger again (with jitter)
RECONNECT_S = 30.0  # how long a waiter tries to rejoin an agent that went away (it polls meanwhile)
_LOST = object()  # the stream ended


def queue_request(req: RunRequest) -> JSONObject:
    """What joining sends: the daemon it is for (the agent queues only for its own), the request as the user wrote
    it (the agent resolves it), and what to show."""
    return {
        "daemon": agentlink.daemon_key(),
        "gpus": req.gpus,
        "count": req.count,
        "share": req.share,
        "max_load": req.max_load,
        "max_memory": req.max_memory,
        "name": req.name,
        "image": req.image,
        "command": req.command,
    }


class _Stream:
    """One joined connection: the agent's JSON lines, read by a thread into a queue so that a wait can end at its
    deadline; `send` writes on the same connection. Not agentlink.Link.lines: this needs the socket itself, to write
    `again` on it and to shut it down from the waiting thread while the reader is blocked in it (a socket timeout
    would leave http.client's reader unusable)."""

    def __init__(self, link: agentlink.Link, body: JSONObject) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.sock.settimeout(agentlink.CONNECT_S)
            self.sock.connect(link.path)
            data = json.dumps(body).encode()
            self.sock.sendall(
                b"POST /api/queue HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
            )
            self.sock.settimeout(agentlink.ANSWER_S)  # an agent that does not queue it at once: wait without
            res = http.client.HTTPResponse(self.sock, method="POST")
            res.begin()
            if res.status >= 400:
                raise agentlink.refusal(res, str(link))
            first = json.loads(res.readline() or b"null")
            if isinstance(first, dict) and "direct" in first:  # another daemon's agent: not this run's queue
                raise agentlink.Direct(str(first["direct"]))
            if not isinstance(first, dict) or "queued" not in first:
                raise ValueError(f"the agent answered {first!r}, not its place in the queue")
        except BaseException:
            self.sock.close()
            raise
        self.sock.settimeout(None)
        self.queued: JSONObject = first["queued"]
        self.news: queue.Queue[Any] = queue.Queue()
        threading.Thread(target=self._read, args=(res,), name="queue-news", daemon=True).start()

    def _read(self, res: http.client.HTTPResponse) -> None:
        try:
            for line in res:
                if line.strip():
                    self.news.put(json.loads(line))
        except (OSError, ValueError, http.client.HTTPException):
            pass
        self.news.put(_LOST)

    def get(self, deadline: float) -> Any:
        """The next message, None at the deadline (monotonic), _LOST when the connection ended."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                return self.news.get(timeout=min(left, 60.0))
            except queue.Empty:
                continue

    def send(self, text: str) -> bool:
        try:
            self.sock.sendall(text.encode() + b"\n")
            return True
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the reader; the agent reads EOF and drops the waiter
        self.sock.close()


class QueueClient:
    """This run's place in the agent's queue (or, without one, the old poll). Use as a context manager around the
    --wait loop: `join(deadline)` before the first attempt, `next(deadline)` after each refused one."""

    def __init__(self, ask: JSONObject) -> None:
        self.ask = ask
        self.link: agentlink.Link | None = None
        self._stream: _Stream | None = None
        self._joined = False  # whether joining was tried (once per run: no agent then, no queue for this run)
        self._turn = False  # whether a turn (or a ledger read the queue allowed) is out: the next wait says `again`
        self._ticket: str | None = None
        self._place = ""  # "position P of N", as the agent last said
        self._said = False  # whether the place was said (once)
        self._lost_at: float | None = None  # when the agent went away, while this run still tries to rejoin it

    @classmethod
    def of(cls, req: RunRequest) -> QueueClient:
        return cls(queue_request(req))

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Leave the queue (at once: the agent reads the connection's end)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def join(self, deadline: float) -> None:
        """Before the first attempt: with the agent up, join its queue and return when trying now takes no card an
        earlier waiter waits for (at once when no one waits for these cards; a newcomer never overtakes the queue).
        Without an agent, return at once."""
        if self._joined:
            return
        self._joined = True
        self.link = agentlink.find()
        if self.link is None or not self._join(first=True):
            return
        assert self._stream is not None
        queued = self._stream.queued
        if queued.get("turn"):  # its turn came with its place: take that message, then try
            self._wait(deadline)
        elif not queued.get("clear"):  # an earlier waiter could take some of these cards: its turn first
            self._say_place()
            self._wait(deadline)
        # Else no earlier waiter could take any of its cards: looking now overtakes no one, and says who holds them.

    def next(self, deadline: float) -> None:
        """After a refused attempt: block until this waiter's next turn, or until `deadline` (time.monotonic();
        math.inf: none). Without an agent: sleep POLL_S (with jitter), as --wait always did."""
        if not self._joined:
            self.join(deadline)
        if self._stream is not None:
            self._say_place()
            if self._turn and not self._stream.send("again"):
                self._drop()
        self._wait(deadline)

    def _wait(self, deadline: float) -> None:
        """Until a turn, the deadline, or (no agent, or it went away) one poll's sleep."""
        self._turn = False
        while True:
            if self._stream is None and self._lost_at is not None:
                self._rejoin()
            if self._stream is None:
                break
            message = self._stream.get(deadline)
            if message is None:
                return
            if message is _LOST:
                self._drop()
            elif "turn" in message:
                self._turn = True
                return
            elif "lost" in message:  # its turns went unused: out of the queue (gpupin.hostagent.serve.queue)
                self._stream.close()
                self._stream = None
                why = shown(message["lost"])
                say(f"the agent at {self.link} took this request out of its queue ({why}): waiting without it")
            elif "position" in message:
                self._place = f"position {message['position']} of {message['of']}"
            elif "held" in message:  # over a quota: its place is kept, and no turn comes until the quota frees
                say(
                    f"waiting in the queue of the agent at {self.link}: {self._place}, over your quota: "
                    f"{shown(message['held'], 400)}; no turn comes until it frees"
                )
        time.sleep(min(POLL_S * (0.5 + random.random()), max(deadline - time.monotonic(), 0.01)))

    def _say_place(self) -> None:
        if not self._said:
            self._said = True
            say(f"waiting in the queue of the agent at {self.link}: {self._place}")

    def _join(self, first: bool) -> bool:
        assert self.link is not None
        try:
            self._stream = _Stream(self.link, {**self.ask, "ticket": self._ticket})
        except agentlink.Direct:  # an agent of another daemon: this run waits without a queue, as without one
            return False
        except (GpupinError, OSError, ValueError, http.client.HTTPException) as err:
            from gpupin.hostagent.policy.admit import NEVER

            if isinstance(err, GpupinError) and err.exit_code == EX_USAGE and NEVER in err.message:
                raise  # more cards than the quota ever allows: no wait meets it, with or without the queue (64)
            if first:
                why = err.message if isinstance(err, GpupinError) else f"{type(err).__name__}: {err}"
                say(f"the agent at {self.link} did not queue this request ({why}): waiting without its queue")
            return False
        queued = self._stream.queued
        kept = self._ticket is not None and queued.get("ticket") == self._ticket
        self._ticket = str(queued.get("ticket"))
        self._place = f"position {queued.get('position')} of {queued.get('of')}"
        if not first:
            say(
                f"the agent at {self.link} is back: {self._place} in its queue"
                + ("" if kept else " (it did not know this request: queued as new)")
            )
        return True

    def _drop(self) -> None:
        """The connection ended (the agent stopped, restarted or died): say so, and poll meanwhile; each wait tries
        to join again (with the ticket: a restarted agent gives the place back) for RECONNECT_S."""
        assert self._stream is not None
        self._stream.close()
        self._stream = None
        self._lost_at = time.monotonic()
        say(
            f"the agent at {self.link} went away: waiting without its queue (back in it if the agent returns "
            f"within {RECONNECT_S:g} s)"
        )

    def _rejoin(self) -> None:
        assert self._lost_at is not None
        found = agentlink.find()
        if found is not None:
            self.link = found
            if self._join(first=False):
                self._lost_at = None
                return
        if time.monotonic() - self._lost_at >= RECONNECT_S:
            self._lost_at = None  # gone for good: polling, as without an agent
