"""The Engine API calls that follow a container from its creation to its exit (start, attach, wait, kill, stop,
resize, inspect, remove), without the docker SDK: `hostagent run` follows every container with them, and through
the resident agent (which creates it) the client never imports the SDK (60 to 90 ms with requests).

Transports, as DOCKER_HOST names them: unix://, tcp:// (http), TLS (tcp:// with DOCKER_TLS_VERIFY, or https://:
the SDK's TLS settings, the daemon's CA), and ssh:// through `ssh HOST docker system dial-stdio`, as the docker CLI
does. One connection per call; the attach stream is the connection itself, hijacked (`Upgrade: tcp`), and without
a TTY it is multiplexed: frames of an 8-byte header (stream, 0, 0, 0, big-endian size) and their bytes.
"""

from __future__ import annotations

import contextlib
import json
import socket

from gpupin.hostagent import http1
from gpupin.hostagent.engine.address import PODMAN_HEADER, endpoint
from gpupin.hostagent.engine.failures import EngineError

_PODMAN = PODMAN_HEADER.lower()  # http1.Answer's header names are lower-case

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket
    from collections.abc import Iterator, Mapping
    from typing import Any

    from gpupin.hostagent.engine.address import Endpoint

STDOUT, STDERR = 1, 2


def _dial(ep: Endpoint, timeout: float | None) -> socket.socket:
    url = ep.url
    scheme, _, rest = url.partition("://")
    if scheme == "unix":
        path = ep.unix_path or "/var/run/docker.sock"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return sock
    if scheme == "ssh":
        return _ssh(rest)
    hostport = rest.split("/", 1)[0]
    host, _, port = hostport.rpartition(":") if ":" in hostport.lstrip("[").split("]")[-1] else (hostport, "", "")
    tls = ep.tls or scheme == "https"
    sock = socket.create_connection((host.strip("[]"), int(port or (2376 if tls else 2375))), timeout)
    if not tls:
        return sock
    import ssl

    verify = getattr(ep.tls, "verify", True)
    ca = getattr(ep.tls, "ca_cert", None)
    ctx = ssl.create_default_context(cafile=ca if verify else None)
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    cert = getattr(ep.tls, "cert", None)
    if cert:
        ctx.load_cert_chain(*cert) if isinstance(cert, tuple) else ctx.load_cert_chain(cert)
    return ctx.wrap_socket(sock, server_hostname=host.strip("[]"))


def _ssh(rest: str) -> socket.socket:
    """A socket whose other end is `docker system dial-stdio` on the far host, as the docker CLI reaches ssh://."""
    import subprocess

    where = rest.split("/", 1)[0]
    user_host, _, port = where.rpartition(":") if ":" in where else (where, "", "")
    mine, theirs = socket.socketpair()
    subprocess.Popen(
        ["ssh", *(["-p", port] if port else []), "--", user_host, "docker", "system", "dial-stdio"],
        stdin=theirs.fileno(),
        stdout=theirs.fileno(),
        start_new_session=True,
    )
    theirs.close()
    return mine


class Stream:
    """A hijacked attach connection: the container's output, and its input (`send`, then `close_input`)."""

    def __init__(self, answer: http1.Answer, tty: bool) -> None:
        self._answer = answer
        self.tty = tty

    def frames(self) -> Iterator[tuple[int, bytes]]:
        """(STDOUT or STDERR, bytes) until the container's output ends; with a TTY, everything is STDOUT."""
        reader = self._answer.reader
        if self.tty:
            while data := reader.read1(1 << 16):
                yield STDOUT, data
            return
        while len(head := reader.read(8)) == 8:
            size = int.from_bytes(head[4:8], "big")
            data = reader.read(size) if size else b""
            if data:
                yield (STDERR if head[0] == STDERR else STDOUT), data

    def send(self, data: bytes) -> None:
        self._answer.sock.sendall(data)

    def close_input(self) -> None:
        self._answer.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._answer.close()


class Waiter:
    """`POST /containers/ID/wait` registered on the daemon (its answer's head read), its body still to come; `then`:
    a second wait whose end is waited for too, its answer not used."""

    def __init__(self, answer: http1.Answer, then: http1.Answer | None = None) -> None:
        self._answer = answer
        self._then = then

    def result(self) -> dict[str, Any]:
        """`{"StatusCode": N, "Error": ...}`, once the condition is met (no read timeout: it may take days)."""
        data = self._answer.json()
        if self._then is not None:
            with contextlib.suppress(Exception):  # the exit code is known; the removal is podman's own
                self._then.json()
        return data if isinstance(data, dict) else {}


class Engine:
    """Calls to one daemon in one API version (the one the container was created with)."""

    def __init__(self, version: str, ep: Endpoint | None = None, timeout: float | None = 60.0) -> None:
        self.ep = ep or endpoint()
        self.version = version
        self.timeout = timeout
        self.podman: str | None = None  # the podman version, once an answer said the daemon is podman

    def _open(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = -1.0,
        headers: Mapping[str, str] | None = None,
    ) -> http1.Answer:
        sock = _dial(self.ep, self.timeout if timeout == -1.0 else timeout)
        answer = http1.exchange(sock, method, http1.target(f"/v{self.version}{path}", params), body, headers=headers)
        self.podman = answer.headers.get(_PODMAN) or self.podman
        if answer.status >= 400:
            raw = answer.body()
            try:
                message = str(json.loads(raw).get("message") or "")
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace").strip()
            raise EngineError(answer.status, message or f"{method} {path} answered {answer.status}")
        return answer

    def call(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = -1.0,
    ) -> Any:
        """The JSON answer (None when it has no body); a refusal is EngineError, a broken way there OSError."""
        return self._open(method, path, params, body, timeout).json()

    def create(self, config: Mapping[str, Any], name: str | None = None, platform: str | None = None) -> str:
        return str(self.call("POST", "/containers/create", {"name": name, "platform": platform}, config)["Id"])

    def start(self, cid: str) -> None:
        # No read timeout, as docker run has none: the NVIDIA hook runs inside the start, and on a card without
        # persistence mode (or a loaded host) it can take a minute; the lease is renewed meanwhile.
        self.call("POST", f"/containers/{cid}/start", timeout=None)

    def attach(self, cid: str, stdin: bool, tty: bool) -> Stream:
        params = {"stream": 1, "stdout": 1, "stderr": 1, "stdin": 1 if stdin else 0}
        answer = self._open(
            "POST",
            f"/containers/{cid}/attach",
            params,
            timeout=None,
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        )
        return Stream(answer, tty)

    def wait(self, cid: str, condition: str) -> Waiter:
        answer = self._open("POST", f"/containers/{cid}/wait", {"condition": condition}, timeout=None)
        if condition == "removed" and self.podman:
            # Podman's compatible wait for "removed" answers StatusCode 0 whatever the exit (4.3, measured): the exit
            # code comes from a wait for the exit, registered beside it before the start, as that one is.
            exited = self._open("POST", f"/containers/{cid}/wait", {"condition": "next-exit"}, timeout=None)
            return Waiter(exited, then=answer)
        return Waiter(answer)

    def kill(self, cid: str, signal: int | None = None) -> None:
        self.call("POST", f"/containers/{cid}/kill", {"signal": signal})

    def stop(self, cid: str, timeout: int | None = None) -> None:
        self.call("POST", f"/containers/{cid}/stop", {"t": timeout}, timeout=None)

    def resize(self, cid: str, height: int, width: int) -> None:
        self.call("POST", f"/containers/{cid}/resize", {"h": height, "w": width})

    def inspect(self, cid: str) -> dict[str, Any]:
        data: dict[str, Any] = self.call("GET", f"/containers/{cid}/json")
        return data

    def remove(self, cid: str, force: bool = False) -> None:
        self.call("DELETE", f"/containers/{cid}", {"force": 1 if force else None, "v": 1})
