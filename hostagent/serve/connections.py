"""The agent's connections, bounded (docs/serve.md, "Limits"): any local user can open them, so none of them may
cost the agent a thread, a file it cannot spare, or its other callers' turn. One thread accepts and reads each
request's head within a deadline; a worker is made only for a complete request; caps per caller and in all evict
the oldest connection still waiting for its head, or answer 503; out of files, accept backs off.
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
TOTAL = 512  # connections at once, every caller together (--max-connections)
PER_USER = 64  # connections at once from one uid (unix socket) or one address (TCP) (--max-per-user)
FILES_KEPT = 64  # files the agent keeps for itself (NVML, the Docker clients, the ledger, its log) below the limit
WORKER_IDLE_S = 30.0  # a worker without a request for this long ends
BACK_OFF_S = 0.5  # how long a listener is left alone after accept failed for want of files
ACCEPTS_PER_WAKE = 64  # accepts in a row on one listener before the others, and the heads, get their turn
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_NO_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Limits:
    """The caps and the deadlines (docs/serve.md, "Limits"); `total` is lowered to what the open-file limit
    allows."""

    __slots__ = ("head_s", "per_user", "total")

    def __init__(self, total: int = TOTAL, per_user: int = PER_USER, head_s: float = HEAD_S) -> None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            total = max(1, min(total, soft - FILES_KEPT))
        self.total = total
        self.per_user = max(1, min(per_user, total))
        self.head_s = head_s


class AcceptedConnection(socket.socket):
    """An accepted connection, with what the listener read of it (its head, perhaps more) and who is on the other
    end (`caller`: the unix socket's Peer, taken at accept; the remote address on TCP)."""

    head: bytes = b""
    reading: bytearray  # the head while the listener reads it
    caller: Any = None
    key: Hashable = None

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


def _turn_away(sock: socket.socket, answer: bytes) -> None:
    """Answer without waiting (whatever the socket takes now) and close."""
    with contextlib.suppress(OSError):
        sock.setblocking(False)
        sock.send(answer)
    sock.close()


class Acceptor:
    """Every listener's accept, the heads, the caps and the workers. Each server's `get_request()` accepts (the
    socket, and who the caller is: the unix server's Peer, taken there once, or the remote address); `key_of(caller)`
    is the key of its cap; `serve(server, sock)` handles one request on a connection whose head is in. They are the
    servers' own (gpupin.hostagent.serve.api)."""

    def __init__(
        self,
        servers: list[socketserver.TCPServer],
        limits: Limits,
        key_of: Callable[[Any], Hashable],
        serve: Callable[[socketserver.TCPServer, AcceptedConnection], None],
    ) -> None:
        self.limits = limits
        self._servers = servers
        self._key_of = key_of
        self._serve = serve
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
        self._mutex = threading.Condition()  # the counts (workers end connections) and the workers' jobs
        self._open: collections.Counter[Hashable] = collections.Counter()
        self._total = 0
        self._jobs: collections.deque[tuple[socketserver.TCPServer, AcceptedConnection]] = collections.deque()
        self._waiting = 0  # workers waiting for a job
        self._thread: threading.Thread | None = None

    # --- what the tests and /api/agent read ---

    def counts(self) -> dict[str, int]:
        with self._mutex:
            return {"open": self._total, "waiting_for_head": len(self._heads)}

    # --- start and stop ---

    def start(self) -> None:
        from gpupin.hostagent import start_thread

        self._thread = start_thread(self._loop, "listen")

    def stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(2.0)
        with self._mutex:
            self._mutex.notify_all()
        for sock in list(self._heads):
            sock.close()
        self._heads.clear()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

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
        timeout = max(0.0, min(due) - time.monotonic()) if due else None
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            elif isinstance(key.fileobj, AcceptedConnection):
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
        """Count `sock` in, making room by closing the oldest connection of the same caller (at its cap) or of
        anyone (at the total) that still waits for its head; or refuse it where there is none to close."""
        key = sock.key
        while True:
            with self._mutex:
                mine = self._open[key] >= self.limits.per_user
                full = self._total >= self.limits.total
                if not mine and not full:
                    self._open[key] += 1
                    self._total += 1
                    return True
            victim = next((s for s in self._heads if s.key == key or not mine), None)
            if victim is None:
                what = f"{self.limits.per_user} from {_shown(key)}" if mine else f"{self.limits.total} in all"
                _turn_away(
                    sock,
                    refusal(
                        503,
                        "Service Unavailable",
                        f"the agent serves at most {what} connections at once",
                        "close some (or try again in a moment); the agent's limits: hostagent serve --help",
                    ),
                )
                return False
            self._drop(victim)

    def _drop(self, sock: AcceptedConnection) -> None:
        del self._heads[sock]
        self._selector.unregister(sock)
        sock.close()
        self._release(sock)

    def _release(self, sock: AcceptedConnection) -> None:
        with self._mutex:
            self._total -= 1
            self._open[sock.key] -= 1
            if self._open[sock.key] <= 0:
                del self._open[sock.key]

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
                _turn_away(sock, refusal(431, "Request Header Fields Too Large", "the request's head is too long", ""))
                self._release(sock)
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
            _turn_away(
                sock,
                refusal(
                    503,
                    "Service Unavailable",
                    "the agent cannot start a thread for this request now (its task limit)",
                    "try again in a moment",
                ),
            )
            self._release(sock)

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
                sock.close()
                self._release(sock)
            with self._mutex:
                self._waiting += 1
                self._mutex.wait_for(lambda: bool(self._jobs) or self._stopping.is_set(), WORKER_IDLE_S)
                self._waiting -= 1
                job = self._jobs.popleft() if self._jobs else None


def _shown(key: Hashable) -> str:
    return f"uid {key}" if isinstance(key, int) else str(key)
