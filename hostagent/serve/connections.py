"""The agent's connections, bounded (docs/serve.md, "Limits"): any local user can open them, so none of them may
cost the agent a thread, a file it cannot spare, or its other callers' turn. One thread accepts and reads each
request's head within a deadline; a worker is made only for a complete request. Each listener has budgets of its
own (what HTTP clients do never takes the unix socket's room): connections per caller and in all, which evict the
oldest connection still waiting for its head, or answer 503; and long-lived answers (streams), per caller and in
all, counted apart. A refusal is a whole answer the client reads: the agent half-closes and reads what the client
still sends for a moment, so that it never closes under a request being sent. Out of files, accept backs off.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import json
import re
import resource
import selectors
import socket
import threading
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socketserver
    from collections.abc import Callable, Hashable
    from typing import Any

    from _typeshed import WriteableBuffer


HEAD_S = 5.0  # the request line and its headers, from accept (a client sends them at once)
MAX_HEAD = 64 << 10  # a head beyond this is no client of ours (431)
TOTAL = 512  # connections at once on one listener, every caller together (--max-connections)
PER_USER = 64  # connections at once on one listener from one caller (gpupin.hostagent.serve.api.caller_key)
STREAMS = 128  # long-lived answers at once on one listener: /api/events, places in the queue (--max-streams)
STREAMS_PER_USER = 16  # of them from one caller (a browser tab is one; the queue takes at most 8 places a uid)
DRAINING = 64  # refused connections one listener reads out at once (their clients read the refusal)
DRAIN_S = 1.0  # how long a refused connection is read out before it is closed anyway
FILES_KEPT = 64  # files the agent keeps for itself (NVML, the Docker clients, the ledger, its log) below the limit
WORKER_IDLE_S = 30.0  # a worker without a request for this long ends
BACK_OFF_S = 0.5  # how long a listener is left alone after accept failed for want of files
ACCEPTS_PER_WAKE = 64  # accepts in a row on one listener before the others, and the heads, get their turn
BUSY_HINT = "close some, or try again in a moment; the agent's limits: hostagent serve --help"
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_NO_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Limits:
    """The caps of each listener and the deadlines (docs/serve.md, "Limits"). `for_listeners(n)` lowers them to
    what the open-file limit allows `n` listeners, each its share."""

    __slots__ = ("draining", "head_s", "per_user", "streams", "streams_per_user", "total")

    def __init__(
        self,
        total: int = TOTAL,
        per_user: int = PER_USER,
        head_s: float = HEAD_S,
        streams: int = STREAMS,
        streams_per_user: int = STREAMS_PER_USER,
    ) -> None:
        self.total = max(1, total)
        self.per_user = max(1, min(per_user, self.total))
        self.streams = max(1, streams)
        self.streams_per_user = max(1, min(streams_per_user, self.streams))
        self.draining = DRAINING
        self.head_s = head_s

    def for_listeners(self, n: int) -> Limits:
        """Each of `n` listeners' caps, their files together within the open-file limit less FILES_KEPT: where they
        do not fit, each listener's share is cut, its streams to a quarter of it and its draining to an eighth."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        each = Limits(self.total, self.per_user, self.head_s, self.streams, self.streams_per_user)
        if soft == resource.RLIM_INFINITY:
            return each
        share = max(3, (soft - FILES_KEPT) // max(1, n))
        if each.total + each.streams + each.draining > share:
            each.streams = max(1, min(each.streams, share // 4))
            each.draining = max(1, min(each.draining, share // 8))
            each.total = max(1, min(each.total, share - each.streams - each.draining))
            each.per_user = min(each.per_user, each.total)
            each.streams_per_user = min(each.streams_per_user, each.streams)
        return each


class Budget:
    """One listener's counts against its Limits: connections and streams, in all and per caller (its key)."""

    __slots__ = ("draining", "limits", "open", "streams", "streams_total", "total")

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.open: collections.Counter[Hashable] = collections.Counter()
        self.total = 0
        self.streams: collections.Counter[Hashable] = collections.Counter()
        self.streams_total = 0
        self.draining = 0


class AcceptedConnection(socket.socket):
    """An accepted connection, with what the listener read of it (its head, perhaps more) and who is on the other
    end (`caller`: the unix socket's Peer, taken at accept; the remote address on TCP)."""

    head: bytes = b""
    reading: bytearray  # the head while the listener reads it
    caller: Any = None
    key: Hashable = None
    budget: Budget  # its listener's
    gate: Acceptor  # that accepted it: a long-lived answer asks it for a stream's place (`stream`)
    streaming = False  # counted as a stream, not a connection
    unread = False  # its request was answered before all of it was read: read it out before closing

    def reader(self) -> io.BufferedReader:
        """The request as a file: the head read by the listener first, then the socket."""
        return io.BufferedReader(_Prefixed(self))


class _Prefixed(io.RawIOBase):
    def __init__(self, sock: AcceptedConnection) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        head = self._sock.head
        if head:
            n = min(len(view), len(head))
            view[:n] = head[:n]
            self._sock.head = head[n:]
            return n
        return self._sock.recv_into(view)


class Writer(io.BufferedIOBase):
    """The answer's file: each write sent whole (a raw socket file may send part of it)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._sock.sendall(data)
        return len(data)


def say(text: str) -> None:
    from gpupin.hostagent.serve import say  # not at import: `hostagent --help` reads this module's defaults

    say(text)


def refusal(status: int, reason: str, error: str, hint: str) -> bytes:
    """A whole answer of one JSON line, the agent's refusal object (gpupin.hostagent.agentlink.error_from)."""
    body = (json.dumps({"error": error, "hint": hint, "exit": 69}) + "\n").encode()
    return (
        f"HTTP/1.0 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


_DRAIN = object()  # the selector's mark of a connection being read out


class Acceptor:
    """Every listener's accept, the heads, the budgets and the workers. Each server's `get_request()` accepts (the
    socket, and who the caller is: the unix server's Peer, taken there once, or the remote address and its uid);
    `key_of(caller)` is the key of its caps; `serve(server, sock)` handles one request on a connection whose head is
    in. They are the servers' own (gpupin.hostagent.serve.api). Each listener has its own Budget, within `limits`
    (Limits.for_listeners)."""

    def __init__(
        self,
        servers: list[socketserver.TCPServer],
        limits: Limits,
        key_of: Callable[[Any], Hashable],
        serve: Callable[[socketserver.TCPServer, AcceptedConnection], None],
    ) -> None:
        self.limits = limits.for_listeners(len(servers))
        self._servers = servers
        self._key_of = key_of
        self._serve = serve
        self._budgets = {server: Budget(self.limits) for server in servers}
        self._selector = selectors.DefaultSelector()
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._resting: dict[socketserver.TCPServer, float] = {}  # listeners backing off, until (monotonic)
        self._out_of_files = False
        for server in servers:
            server.socket.setblocking(False)
            self._selector.register(server.socket, selectors.EVENT_READ, server)
        # Connections waiting for their head: socket -> (server, deadline), oldest first.
        self._heads: collections.OrderedDict[AcceptedConnection, tuple[socketserver.TCPServer, float]] = (
            collections.OrderedDict()
        )
        # Refused or answered connections read out until their client closes: socket -> deadline, oldest first.
        self._draining: collections.OrderedDict[AcceptedConnection, float] = collections.OrderedDict()
        self._mutex = threading.Condition()  # the counts (workers end connections) and the workers' jobs
        self._jobs: collections.deque[tuple[socketserver.TCPServer, AcceptedConnection]] = collections.deque()
        self._handed: collections.deque[AcceptedConnection] = collections.deque()  # workers' ends to read out
        self._waiting = 0  # workers waiting for a job
        self._thread: threading.Thread | None = None

    # --- what the tests and /api/agent read ---

    def counts(self) -> dict[str, int]:
        with self._mutex:
            budgets = self._budgets.values()
            return {
                "open": sum(b.total for b in budgets),
                "streams": sum(b.streams_total for b in budgets),
                "waiting_for_head": len(self._heads),
                "draining": len(self._draining),
            }

    # --- start and stop ---

    def start(self) -> None:
        from gpupin.hostagent import start_thread

        self._thread = start_thread(self._loop, "listen")

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        if self._thread is not None:
            self._thread.join(2.0)
        with self._mutex:
            self._mutex.notify_all()
        for sock in [*self._heads, *self._draining, *self._handed]:
            sock.close()
        self._heads.clear()
        self._draining.clear()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # --- the listener's thread ---

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._turn()
            except Exception as err:  # a bug must not end the agent's listening: said, and the next turn goes on
                say(f"internal error while accepting: {type(err).__name__}: {err}")
                self._stopping.wait(BACK_OFF_S)

    def _turn(self) -> None:
        due = list(self._resting.values())
        if self._heads:
            due.append(next(iter(self._heads.values()))[1])  # the oldest head's deadline comes first
        if self._draining:
            due.append(next(iter(self._draining.values())))
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
                self._take_handed()
            elif key.data is _DRAIN:
                if key.fileobj in self._draining:  # not closed earlier in this turn (a listener's cap of them)
                    self._read_out(key.fileobj)  # type: ignore[arg-type]
            elif isinstance(key.fileobj, AcceptedConnection):
                if key.fileobj in self._heads:  # not turned away earlier in this turn (for a newer one)
                    self._read_head(key.fileobj)
            else:
                self._accept(key.data)
        self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        for server, until in list(self._resting.items()):
            if until <= now:
                del self._resting[server]
                self._selector.register(server.socket, selectors.EVENT_READ, server)
        while self._heads:
            sock, (_, deadline) = next(iter(self._heads.items()))
            if deadline > now:
                break
            self._drop(sock)  # the head did not come in time: no answer, the client had its chance
        while self._draining:
            sock, deadline = next(iter(self._draining.items()))
            if deadline > now:
                break
            self._drained(sock)

    def _accept(self, server: socketserver.TCPServer) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                raw, caller = server.get_request()
            except BlockingIOError:
                break
            except OSError as err:
                if err.errno in _NO_FILES:
                    self._back_off(server, err)
                break  # ECONNABORTED, a caller gone before it was named: the next wake-up tries again
            if self._out_of_files:
                self._out_of_files = False
                say("accepting connections again")
            sock = AcceptedConnection(raw.family, raw.type, raw.proto, fileno=raw.detach())
            sock.reading = bytearray()
            sock.key, sock.caller = self._key_of(caller), caller
            sock.budget, sock.gate = self._budgets[server], self
            if not self._admit(sock):
                continue
            sock.setblocking(False)
            self._heads[sock] = (server, time.monotonic() + self.limits.head_s)
            self._selector.register(sock, selectors.EVENT_READ, server)

    def _back_off(self, server: socketserver.TCPServer, err: OSError) -> None:
        if not self._out_of_files:
            self._out_of_files = True
            say(f"cannot accept connections ({err.strerror}): trying again every {BACK_OFF_S:g}s")
        self._selector.unregister(server.socket)
        self._resting[server] = time.monotonic() + BACK_OFF_S

    def _admit(self, sock: AcceptedConnection) -> bool:
        """Count `sock` in its listener's budget, making room by turning away the oldest connection of the same
        caller (at its cap) or of anyone on that listener (at its total) that still waits for its head; or refuse
        it where there is none."""
        key, budget, limits = sock.key, sock.budget, self.limits
        while True:
            with self._mutex:
                mine = budget.open[key] >= limits.per_user
                full = budget.total >= limits.total
                if not mine and not full:
                    budget.open[key] += 1
                    budget.total += 1
                    return True
            victim = next((s for s in self._heads if s.budget is budget and (s.key == key or not mine)), None)
            if victim is None:
                what = f"{limits.per_user} from {_shown(key)}" if mine else f"{limits.total} in all"
                self._turn_away(sock, busy(f"the agent serves at most {what} connections at once here"))
                return False
            del self._heads[victim]
            self._selector.unregister(victim)
            self._release(victim)
            self._turn_away(victim, busy("the agent took this connection's place for another (it sent nothing)"))

    def _drop(self, sock: AcceptedConnection) -> None:
        del self._heads[sock]
        self._selector.unregister(sock)
        sock.close()
        self._release(sock)

    def _release(self, sock: AcceptedConnection) -> None:
        budget = sock.budget
        with self._mutex:
            if sock.streaming:
                sock.streaming = False
                budget.streams_total -= 1
                budget.streams[sock.key] -= 1
                if budget.streams[sock.key] <= 0:
                    del budget.streams[sock.key]
                return
            budget.total -= 1
            budget.open[sock.key] -= 1
            if budget.open[sock.key] <= 0:
                del budget.open[sock.key]

    def stream(self, sock: AcceptedConnection) -> str | None:
        """Move a connection whose answer will last (an event stream, a place in the queue) from its listener's
        connections to its streams: None when it has its place, else why not (its caller answers 503)."""
        budget, limits, key = sock.budget, self.limits, sock.key
        with self._mutex:
            if sock.streaming:
                return None
            if budget.streams[key] >= limits.streams_per_user:
                return f"the agent serves at most {limits.streams_per_user} streams at once from {_shown(key)} here"
            if budget.streams_total >= limits.streams:
                return f"the agent serves at most {limits.streams} streams at once here"
            budget.total -= 1
            budget.open[key] -= 1
            if budget.open[key] <= 0:
                del budget.open[key]
            budget.streams[key] += 1
            budget.streams_total += 1
            sock.streaming = True
            return None

    # --- refusals, read out ---

    def _turn_away(self, sock: AcceptedConnection, answer: bytes) -> None:
        """Answer without waiting (whatever the socket takes now: a refusal fits), half-close, and read out what
        the client still sends until it closes (or DRAIN_S): closed under a request being sent, a client would get
        EPIPE or a reset in place of the answer. At its listener's cap of those, the oldest is closed for it."""
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(answer)
        self._read_out_later(sock)

    def _read_out_later(self, sock: AcceptedConnection) -> None:
        try:
            sock.setblocking(False)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone: nothing to read out
            sock.close()
            return
        budget = sock.budget
        if budget.draining >= self.limits.draining:
            oldest = next((s for s in self._draining if s.budget is budget), None)
            if oldest is None:
                sock.close()
                return
            self._drained(oldest)
        budget.draining += 1
        self._draining[sock] = time.monotonic() + DRAIN_S
        self._selector.register(sock, selectors.EVENT_READ, _DRAIN)

    def _read_out(self, sock: AcceptedConnection) -> None:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drained(sock)

    def _drained(self, sock: AcceptedConnection) -> None:
        del self._draining[sock]
        self._selector.unregister(sock)
        sock.budget.draining -= 1
        sock.close()

    def _take_handed(self) -> None:
        with self._mutex:
            handed, self._handed = list(self._handed), collections.deque()
        for sock in handed:
            self._read_out_later(sock)

    def _read_head(self, sock: AcceptedConnection) -> None:
        server, _ = self._heads[sock]
        try:
            data = sock.recv(MAX_HEAD)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        seen = len(sock.reading)
        sock.reading += data
        if not _HEAD_END.search(sock.reading, max(0, seen - 3)):  # from where the last search stopped
            if len(sock.reading) > MAX_HEAD:
                del self._heads[sock]
                self._selector.unregister(sock)
                self._release(sock)
                self._turn_away(
                    sock, refusal(431, "Request Header Fields Too Large", "the request's head is too long", "")
                )
            return
        del self._heads[sock]
        self._selector.unregister(sock)
        sock.head, sock.reading = bytes(sock.reading), bytearray()
        sock.setblocking(True)
        self._hand(server, sock)

    # --- the workers ---

    def _hand(self, server: socketserver.TCPServer, sock: AcceptedConnection) -> None:
        with self._mutex:
            if self._waiting > len(self._jobs):
                self._jobs.append((server, sock))
                self._mutex.notify()
                return
        from gpupin.hostagent import start_thread

        try:
            start_thread(self._work, "request", args=(server, sock))
        except RuntimeError:  # can't start new thread: a task limit (pids.max, RLIMIT_NPROC) reached
            self._release(sock)
            self._turn_away(
                sock, busy("the agent cannot start a thread for this request now (its task limit)", "try again")
            )

    def _work(self, server: socketserver.TCPServer, sock: AcceptedConnection) -> None:
        job: tuple[socketserver.TCPServer, AcceptedConnection] | None = (server, sock)
        while job is not None:
            server, sock = job
            try:
                self._serve(server, sock)
            except OSError:
                pass  # the client left, or did not keep up: its connection ends
            except Exception as err:  # a bug must not end the worker, nor print a traceback per request
                say(f"internal error while serving a request: {type(err).__name__}: {err}")
            finally:
                self._release(sock)
                if sock.unread:  # answered before its body was read: read out by the listener's thread
                    with self._mutex:
                        self._handed.append(sock)
                    self._wake()
                else:
                    sock.close()
            with self._mutex:
                self._waiting += 1
                self._mutex.wait_for(lambda: bool(self._jobs) or self._stopping.is_set(), WORKER_IDLE_S)
                self._waiting -= 1
                job = self._jobs.popleft() if self._jobs else None


def busy(error: str, hint: str = BUSY_HINT) -> bytes:
    """A 503, whole: the CLI takes it as the agent being busy (`run` books by itself, docs/serve.md "Limits")."""
    return refusal(503, "Service Unavailable", error, hint)


def _shown(key: Hashable) -> str:
    return f"uid {key}" if isinstance(key, int) else str(key)
