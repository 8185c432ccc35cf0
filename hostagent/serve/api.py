"""The agent's HTTP API on two listeners: a unix socket for the CLI (root and the socket's group) and TCP,
loopback unless `--http-public`, answering only to its own Host names. GET routes are the same on both; POST
routes act for the caller, so they are served on the unix socket alone, where the kernel names the caller. A
refusal is `{"error", "hint", "exit"}`. The routes: docs/serve.md, "API" and "Who can reach it".
"""

from __future__ import annotations

import contextlib
import json
import os
import socketserver
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

from gpupin.core import __version__
from gpupin.core.errors import EX_SOFTWARE, EX_USAGE, GpupinError
from gpupin.hostagent import agentlink
from gpupin.hostagent.serve.connections import BUSY_HINT, AcceptedConnection, Acceptor, Limits, Writer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.record import Scope
    from gpupin.hostagent.serve.agent import Agent
    from gpupin.hostagent.serve.metrics import Exposition

    PostRoute = Callable[["Handler", JSONObject, "Peer"], None]

KEEPALIVE = 15.0  # seconds between two comment lines on an idle event stream (proxies drop silent connections)
MAX_BODY = 1 << 20  # a request is a command line and its environment: a megabyte is far beyond any
BODY_S = 10.0  # the whole body, once the head is in (docs/serve.md, "Limits")
IO_S = 30.0  # any one read or write after the head: a client that takes nothing for this long is gone
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "127.0.0.1", "::1"})


class Peer:
    """Who is on the other end of a unix-socket connection, as the kernel said when the connection was accepted
    (SO_PEERCRED, SO_PEERGROUPS), never as the caller claims nor as /proc says later: a pid may be reused by then
    (docs/serve.md, "Who can reach it"). `start` and `pidns` (the process's start time and pid namespace, read at
    accept) tie the pid to the process that connected, for the lease it signs."""

    __slots__ = ("gid", "groups", "pid", "pidns", "start", "uid")

    def __init__(
        self, pid: int, uid: int, gid: int, groups: Iterable[int] = (), start: str = "", pidns: str = ""
    ) -> None:
        self.pid = pid
        self.uid = uid
        self.gid = gid
        self.groups = frozenset(groups)
        self.start = start
        self.pidns = pidns

    @classmethod
    def at_accept(cls, sock: Any) -> Peer:
        """The peer of a connection just accepted (called once, from the server's accept: UnixServer)."""
        import socket
        import struct

        from gpupin.hostagent.ledger.lease import pid_namespace, start_time

        pid, uid, gid = struct.unpack(
            "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        return cls(pid, uid, gid, _peer_groups(sock), start_time(pid) or "", pid_namespace(pid))

    def user(self) -> str:
        import pwd

        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return str(self.uid)


SO_PEERGROUPS = 59  # Linux 4.13; not in Python's socket module


def _peer_groups(sock: Any) -> list[int]:
    """The peer's supplementary groups as they were when it connected. Python's getsockopt takes a buffer of at
    most 1024 bytes (256 groups); for a caller in more (up to NGROUPS_MAX, 65536), the kernel says how much room
    they need (ERANGE, the size in optlen, which Python does not pass back), and libc's getsockopt reads them."""
    import errno
    import socket
    import struct

    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 1024)
    except OSError as err:
        if err.errno != errno.ERANGE:
            return []  # no SO_PEERGROUPS: the caller is judged by its uid and gid alone (fewer rights, never more)
        raw = _many_peer_groups(sock.fileno())
    return list(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))


def _many_peer_groups(fd: int) -> bytes:
    """SO_PEERGROUPS through libc, for a peer in more groups than Python's buffer holds (b"" when it fails)."""
    import ctypes
    import socket

    libc = ctypes.CDLL(None, use_errno=True)
    size = ctypes.c_uint32(0)
    libc.getsockopt(fd, socket.SOL_SOCKET, SO_PEERGROUPS, None, ctypes.byref(size))  # ERANGE: the room needed
    buf = ctypes.create_string_buffer(max(size.value, 4))
    if libc.getsockopt(fd, socket.SOL_SOCKET, SO_PEERGROUPS, buf, ctypes.byref(size)) != 0:
        return b""
    return buf.raw[: size.value]


def _dashboard() -> bytes:
    from importlib.resources import files

    return (files("gpupin.hostagent.serve") / "dashboard.html").read_bytes()


class Handler(BaseHTTPRequestHandler):
    server_version = f"gpupin-hostagent/{__version__}"
    agent: Agent
    metrics: Exposition
    posts: dict[str, PostRoute]
    http_per_user = False  # serve --http-per-user: per-user usage on HTTP too (docs/serve.md, "Who can reach it")

    @property
    def peer(self) -> Peer:
        """The caller on the unix socket, as accepted (UnixServer.get_request hands it as the client address)."""
        peer: Any = self.client_address  # typed a tuple in socketserver: the unix server's is the Peer
        assert isinstance(peer, Peer)
        return peer

    def setup(self) -> None:
        # The connection comes from gpupin.hostagent.serve.connections with its head already read.
        sock: AcceptedConnection = self.request
        self.connection = sock
        sock.settimeout(IO_S)
        self.rfile = sock.reader()
        self.wfile = Writer(sock)

    def address_string(self) -> str:
        return self.client_address[0] if isinstance(self.client_address, tuple) else "unix"

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if isinstance(self.server, TcpServer) and not self.server.own_host(self.headers.get("Host")):
            # DNS rebinding: a page whose name resolves to this host must not read the agent (docs/serve.md)
            self.close_connection = True
            self._json(
                421,
                {
                    "error": f"this agent does not answer to the name {self.headers.get('Host')!r}",
                    "hint": "use its address, or name it with hostagent serve --http-host NAME",
                },
            )
            return False
        return True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request log would be one line per scrape and per dashboard: not a service log

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, (json.dumps(obj) + "\n").encode(), "application/json")

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        route = {
            "/": self._dashboard,
            "/index.html": self._dashboard,
            "/api/ls": self._ls,
            "/api/events": self._events,
            "/api/agent": self._agent,
            "/api/queue": self._queue,
            "/api/samples": self._samples,
            "/api/usage": self._usage,
            "/metrics": self._metrics,
        }.get(path)
        if route is None:
            self._json(
                404,
                {
                    "error": f"no such path {path}",
                    "paths": [
                        "/",
                        "/api/ls",
                        "/api/events",
                        "/api/queue",
                        "/api/samples",
                        "/api/usage",
                        "/api/agent",
                        "/metrics",
                    ],
                },
            )
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client left
            route()

    do_HEAD = do_GET

    def _refuse(self) -> None:
        self.connection.unread = True  # its body, if any, is read out after the answer (connections)
        self._json(405, {"error": f"{self.command} is not served: the API is GET, and POST on the unix socket"})

    do_PUT = do_DELETE = do_PATCH = _refuse

    def refusal(self, status: int, err: GpupinError) -> None:
        """A refusal as the CLI raises it again (gpupin.hostagent.agentlink.error_from)."""
        self._json(status, {"error": err.message, "hint": err.hint, "exit": err.exit_code})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        self.connection.unread = True  # until its body is read: an answer before it is read out after (connections)
        if not isinstance(self.server, UnixServer):  # acting for someone needs to know who: the socket tells
            self.refusal(
                403,
                GpupinError(
                    f"POST {path} is served on the agent's unix socket only",
                    "run hostagent on the agent's host, as root or in its group",
                ),
            )
            return
        route = self.posts.get(path)
        if route is None:
            self._json(404, {"error": f"no such path {path}", "paths": sorted(self.posts)})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                raise ValueError(f"a body of {length} bytes")
            raw = self._body(length)
            self.connection.unread = False
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError as err:
            bad = GpupinError(f"POST {path}: the request is not one JSON object ({err})")
            bad.exit_code = EX_USAGE
            self.refusal(400, bad)
            return
        peer = self.peer
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client left
            try:
                if self.headers.get("Expect", "").lower() == "102-processing":
                    # The client gives an agent that does not answer a few seconds (gpupin.hostagent.agentlink):
                    # this says the request is in before a route that may wait (the ledger lock).
                    self.wfile.write(b"HTTP/1.1 102 Processing\r\n\r\n")
                route(self, body, peer)
            except GpupinError as err:
                self.refusal(409 if err.exit_code != EX_USAGE else 400, err)
            except Exception as err:  # a bug here must not end the agent, nor leave the caller without a line
                bug = GpupinError(
                    f"the agent failed on POST {path}: {type(err).__name__}: {err}",
                    "this is a bug in hostagent serve: see its log, and report it",
                )
                bug.exit_code = EX_SOFTWARE
                self.refusal(500, bug)

    def _body(self, length: int) -> bytes:
        """The body, whole within BODY_S (a per-read timeout alone would let a byte every few seconds hold on)."""
        deadline = time.monotonic() + BODY_S
        parts: list[bytes] = []
        while length > 0:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ValueError(f"the body did not come within {BODY_S:g}s")
            self.connection.settimeout(left)
            try:
                part = self.rfile.read1(min(length, 1 << 16))
            except TimeoutError:
                raise ValueError(f"the body did not come within {BODY_S:g}s") from None
            if not part:
                raise ValueError("the body ended early")
            parts.append(part)
            length -= len(part)
        self.connection.settimeout(IO_S)
        return b"".join(parts)

    def answer(self, obj: Any) -> None:
        """A POST route's answer (200, JSON)."""
        self._json(200, obj)

    def _dashboard(self) -> None:
        self._send(200, _dashboard(), "text/html; charset=utf-8")

    def _ls(self) -> None:
        snap = self.agent.snapshot()
        if snap.listing is None:
            self._json(503, {"error": snap.error})
        else:
            self._json(200, snap.as_json())

    def _agent(self) -> None:
        snap = self.agent.snapshot()
        view = snap.listing
        self._json(
            200,
            {
                "version": __version__,
                "pid": os.getpid(),
                "started": self.agent.started,
                "interval_s": self.agent.interval,
                "idle_after_s": self.agent.idle.idle_after,
                "read_at": snap.read_at,
                "view_version": snap.version,
                "nvml": {"available": view is not None, "error": snap.error},
                "events_followed": self.agent.following,
                "docker": view.docker.to_json() if view is not None else None,
                "policy": self.agent.in_force.status(),
                "authz": {"mode": self.agent.in_force.policy.enforce.mode, "judged": list(self.agent.judged)},
            },
        )

    def _queue(self) -> None:
        said = urllib.parse.parse_qs(self.path.partition("?")[2]).get("daemon")
        why = agentlink.other_daemon(said[0]) if said else None  # a caller of another daemon: not its queue
        self._json(200, {"direct": why} if why is not None else self.agent.queue.listing())

    def _samples(self) -> None:
        self._json(200, self.agent.samples.listing(time.time()))

    def _scope(self) -> Scope:
        """Whose intervals of the record this caller sees: on the socket, root and the policy's `usage.readers`
        everyone's, any other user their own (the record is root's, 0600); on HTTP, which any local account reaches,
        the host's totals alone unless the owner turned per-user rows on (serve --http-per-user)."""
        from gpupin.hostagent.record import EVERYONE, TOTALS, Scope

        if not isinstance(self.server, UnixServer):
            return EVERYONE if self.http_per_user else TOTALS
        peer = self.peer
        if self.agent.in_force.policy.may_read_usage(peer.uid, frozenset({peer.gid, *peer.groups})):
            return EVERYONE
        return Scope(uid=peer.uid)

    def _usage(self) -> None:
        """The record's usage (gpupin.hostagent.record.report): ?by=user|card|image|day&since=SECONDS, of the
        intervals this caller may see (`_scope`)."""
        from gpupin.hostagent.record import BY
        from gpupin.hostagent.record.report import checked_since

        writer = self.agent.record
        if writer is None:
            self._json(404, {"error": "this agent keeps no record (serve --record none)", "exit": 69})
            return
        query = urllib.parse.parse_qs(self.path.partition("?")[2])
        by = (query.get("by") or ["user"])[0]
        try:
            if by not in BY:
                raise ValueError(f"by must be one of {', '.join(BY)}, not {by[:40]!r}")
            since = checked_since(float(query["since"][0])) if "since" in query else None
        except ValueError as err:
            text = str(err)
            if not text.startswith(("by must", "since must")):  # float()'s own: the text itself, not a number
                text = f"since must be seconds since the epoch, not {query['since'][0][:40]!r}"
            self._json(400, {"error": f"GET /api/usage: {text}", "exit": 64})
            return
        scope = self._scope()
        if by == "user" and not scope.per_user:
            private = GpupinError(
                "usage per user is not served over HTTP by this agent",
                "on the agent's host, `hostagent usage` reads it on the socket (each user their own); the host's "
                "owner may serve it on HTTP with hostagent serve --http-per-user",
            )
            private.exit_code = EX_USAGE
            self.refusal(403, private)
            return
        rows = writer.store.usage(since, by, time.time(), scope.uid)
        rows_json = [r.to_json(by) for r in rows]
        only = None if scope.uid is None else {"uid": scope.uid, "user": self.peer.user()}
        self._json(
            200, {"since": since, "by": by, "rows": rows_json, "only": only, "record": writer.status().to_json()}
        )

    def _metrics(self) -> None:
        self._send(200, self.metrics.text(self._scope()), self.metrics.content_type)

    def stream_refused(self) -> bool:
        """Take a stream's place for this connection (gpupin.hostagent.serve.connections: streams are counted and
        capped apart from requests); where there is none, answer 503 and say True."""
        sock: AcceptedConnection = self.connection
        why = sock.gate.stream(sock) if hasattr(sock, "gate") else None
        if why is None:
            return False
        self._json(503, {"error": why, "hint": BUSY_HINT, "exit": 69})
        return True

    def _events(self) -> None:
        """One `ls` event at once and one at each change, until the client leaves or the agent stops."""
        if self.command != "HEAD" and self.stream_refused():
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command == "HEAD":
            return
        snap = self.agent.snapshot()
        version = -1
        while not self.agent.stopping.is_set():
            if snap.version != version:
                version = snap.version
                self.wfile.write(snap.event())
            else:
                self.wfile.write(b": keep-alive\n\n")
            self.wfile.flush()
            snap = self.agent.wait_change(version, KEEPALIVE)


# socketserver listens with a backlog of 5: a sixth client connecting at the same moment is refused outright on a
# unix socket (EAGAIN), and a `hostagent run` so refused takes its own, slower path. A burst of runs is the agent's
# job: as many as the kernel allows (net.core.somaxconn caps it).
BACKLOG = 4096


class Remote(tuple):  # type: ignore[type-arg]
    """A TCP caller: its address (host, port, ...), as socketserver gives it, and `uid`, the kernel's owner of its
    socket where it is one of this host's (gpupin.hostagent.serve.tcpuid), else None."""

    uid: int | None = None

    @classmethod
    def of(cls, address: Any, uid: int | None) -> Remote:
        remote = cls(address)
        remote.uid = uid
        return remote


class TcpServer(HTTPServer):
    """The TCP listener: bound here, served by gpupin.hostagent.serve.connections (never serve_forever)."""

    allow_reuse_address = True
    request_queue_size = BACKLOG
    host_names: frozenset[str] = LOOPBACK_NAMES  # the Host names it answers to, besides any IP address

    def server_bind(self) -> None:
        # HTTPServer's own looks its address up (socket.getfqdn), which can hang on a host without DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def get_request(self) -> tuple[Any, Any]:
        # Who the caller is, taken once as the connection is accepted (its caps' key: caller_key).
        from gpupin.hostagent.serve.tcpuid import local_uid

        sock, address = self.socket.accept()
        return sock, Remote.of(address, local_uid(sock.getsockname(), address))

    def own_host(self, header: str | None) -> bool:
        """Whether a request's Host names this listener: none (not a browser), an IP address (a page reached by
        its address is no rebinding), a loopback name, or a name given with --http-host; any port."""
        if header is None:
            return True
        host = header.strip().lower()
        if host.startswith("["):
            host = host[1 : host.find("]")] if "]" in host else host
        elif host.count(":") == 1:
            host = host.rsplit(":", 1)[0]
        if host in self.host_names:
            return True
        import ipaddress

        try:
            ipaddress.ip_address(host)
        except ValueError:
            return False
        return True


class UnixServer(socketserver.UnixStreamServer):
    request_queue_size = BACKLOG

    def get_request(self) -> tuple[Any, Any]:
        # Who the caller is, taken once as the connection is accepted: every request on it acts for that identity.
        sock, _ = self.socket.accept()
        try:
            return sock, Peer.at_accept(sock)
        except BaseException:
            sock.close()
            raise


def caller_key(caller: Any) -> Hashable:
    """The key of a caller's caps on its listener (docs/serve.md, "Limits"): on the unix socket its uid (Peer); on
    TCP from this host, the uid that owns its socket (Remote.uid), whichever loopback address it connects from;
    from elsewhere its address (an IPv6 one by its /64, what one host is given). A local caller whose uid the
    kernel does not say shares one key with every such caller ("loopback"): an address of its choosing never
    buys it room of its own."""
    if isinstance(caller, Peer):
        return caller.uid
    uid = getattr(caller, "uid", None)
    if uid is not None:
        return f"uid {uid}"
    import ipaddress

    try:
        address = ipaddress.ip_address(str(caller[0]).split("%", 1)[0])
    except ValueError:
        return str(caller[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address.is_loopback:
        return "loopback"
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def serve(server: socketserver.TCPServer, sock: AcceptedConnection) -> None:
    """One request on a connection whose head is in (no keep-alive: HTTP/1.0 answers, one request each)."""
    server.RequestHandlerClass(sock, sock.caller, server)


def _posts(agent: Agent) -> dict[str, PostRoute]:
    """The POST routes, each module's own."""
    from gpupin.hostagent.serve import authz, bookings, runs

    return {
        "/api/queue": agent.queue.serve,
        bookings.ROUTE: agent.bookings.route,
        **runs.routes(agent),
        **authz.routes(agent),
    }


def handler(agent: Agent, http_per_user: bool = False) -> type[Handler]:
    from gpupin.hostagent.serve.metrics import Exposition

    return type(
        "AgentHandler",
        (Handler,),
        {"agent": agent, "metrics": Exposition(agent), "posts": _posts(agent), "http_per_user": http_per_user},
    )


def acceptor(servers: list[socketserver.TCPServer], limits: Limits) -> Acceptor:
    """Accept and serve on `servers`, within `limits` (gpupin.hostagent.serve.connections)."""
    return Acceptor(servers, limits, caller_key, serve)
