"""The CLI's side of the resident agent (`hostagent serve`): whether one answers on its unix socket
(GPUPIN_AGENT_SOCKET; none when GPUPIN_AGENT=0, or when this user may not open it), and JSON requests to it, with
no docker SDK and no NVML: the point of asking the agent is not to pay for them. An error the agent answers
(`{"error", "hint", "exit"}`) is raised here with its exit code, so a refusal reads the same whichever process
found it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys

from gpupin.core.errors import AgentUnavailableError, GpupinError
from gpupin.hostagent.agentdir import DEFAULT_SOCKET as DEFAULT_SOCKET
from gpupin.hostagent.agentdir import SOCKET_ENV as SOCKET_ENV
from gpupin.hostagent.agentdir import socket_path as socket_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    import http.client
    from collections.abc import Iterator
    from typing import Any

USE_ENV = "GPUPIN_AGENT"
# An agent that does not accept, or does not begin its answer, within this is treated as absent: the command takes
# its own path (run, --wait) or says so and exits 69 (queue). A live agent answers in milliseconds; one that is
# flooded or wedged must not hold every hostagent command with it (docs/serve.md, "Limits").
ANSWER_S = 3.0
CONNECT_S = ANSWER_S
_OFF = ("0", "off", "no", "false")


def wanted() -> bool:
    """Whether commands may go through the agent (GPUPIN_AGENT=0 says never)."""
    return os.environ.get(USE_ENV, "").strip().lower() not in _OFF


def daemon_key() -> str:
    """The Docker daemon this process uses, as a request to the agent names it (`"daemon"`; its lock key: one text
    per daemon, whatever spelling of its address)."""
    from gpupin.hostagent import engine

    return engine.endpoint().lock_key()


def other_daemon(said: object) -> str | None:
    """The one rule of every request the agent answers for a caller's daemon (a run, a place in the queue, the
    queue's listing): it serves only callers of the daemon it serves itself. None when `said` (the caller's
    daemon_key()) is the agent's; else why not, in words."""
    from gpupin.hostagent import engine

    if said == engine.endpoint().lock_key():
        return None
    return f"the agent serves the Docker daemon at {engine.docker_host()}"


class Direct(GpupinError):
    """The agent answered that this request is not its to serve (`other_daemon`): the caller goes on without it."""


def _unix_connection() -> type[http.client.HTTPConnection]:
    """http.client over a unix socket (the Host header is a formality there), made when first asked for: http.client
    costs ~15 ms to import, which `hostagent run` through the agent does not pay (gpupin.hostagent.http1)."""
    global _UNIX_CONNECTION
    if _UNIX_CONNECTION is None:
        import http.client
        import socket

        class UnixHTTPConnection(http.client.HTTPConnection):
            def __init__(self, path: str, timeout: float | None) -> None:
                super().__init__("localhost", timeout=timeout)
                self.path = path

            def connect(self) -> None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                try:
                    sock.connect(self.path)
                except OSError:
                    sock.close()
                    raise
                self.sock = sock

        _UNIX_CONNECTION = UnixHTTPConnection
    return _UNIX_CONNECTION


_UNIX_CONNECTION: type[http.client.HTTPConnection] | None = None


def __getattr__(name: str) -> Any:
    if name == "UnixHTTPConnection":  # gpupin.hostagent.ls.hosts's name for it
        return _unix_connection()
    raise AttributeError(name)


def parsed(raw: bytes) -> Any:
    """An answer's JSON, or None when it has none (an empty body, or not JSON)."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def refusal(res: http.client.HTTPResponse, where: str) -> GpupinError:
    """The error an answer of status >= 400 stands for, its body read."""
    return error_from(res.status, parsed(res.read()), where)


def error_from(status: int, obj: Any, where: str) -> GpupinError:
    """The agent's error object as the GpupinError it stands for (its exit code kept)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("error"), str):
        return AgentUnavailableError(
            f"the agent at {where} answered {status} without its error object",
            "see the agent's log (journalctl -u gpupin-hostagent)",
        )
    err = GpupinError(obj["error"], obj.get("hint") if isinstance(obj.get("hint"), str) else None)
    code = obj.get("exit")
    err.exit_code = code if isinstance(code, int) and 0 < code < 256 else AgentUnavailableError.exit_code
    return err


class Link:
    """One agent's socket. Each call is one connection: the agent's server is threaded, and a held connection
    would be one more thread there for nothing."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __str__(self) -> str:
        return f"unix://{self.path}"

    def _send(
        self, method: str, route: str, body: Any, timeout: float | None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = _unix_connection()(self.path, timeout)  # type: ignore[arg-type]
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        try:
            # Closed under the request: an answer it sent first (a refusal) is still there to read.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                conn.request(method, route, body=data, headers=headers)
            return conn, conn.getresponse()
        except OSError as err:
            conn.close()
            raise AgentUnavailableError(
                f"the agent at {self} stopped answering ({err.strerror or err})",
                f"see the agent's log (journalctl -u gpupin-hostagent), or set {USE_ENV}=0 to go without it",
            ) from None

    def call(self, method: str, route: str, body: Any = None, timeout: float | None = ANSWER_S) -> Any:
        """One request; its JSON answer, or the agent's refusal raised as its GpupinError."""
        conn, res = self._send(method, route, body, timeout)
        try:
            obj = parsed(res.read())
        finally:
            conn.close()
        if res.status >= 400:
            raise error_from(res.status, obj, str(self))
        return obj

    def lines(self, method: str, route: str, body: Any = None, timeout: float | None = None) -> Iterator[Any]:
        """A streamed answer of one JSON object per line (a long wait that says where it stands), until the agent
        ends it; closing the generator closes the connection, which the agent takes as the caller leaving. Its head
        comes within ANSWER_S; the lines, each within `timeout` (None: however long the wait)."""
        conn, res = self._send(method, route, body, ANSWER_S)
        try:
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            if res.status >= 400:
                raise refusal(res, str(self))
            for line in res:
                if line.strip():
                    yield json.loads(line)
        except (OSError, sys.modules["http.client"].HTTPException) as err:
            raise AgentUnavailableError(
                f"the agent at {self} dropped the connection ({err})",
                "see the agent's log (journalctl -u gpupin-hostagent)",
            ) from None
        finally:
            conn.close()


def find() -> Link | None:
    """The agent, when one accepts on its socket and this user may use it; else None (take the direct path)."""
    if not wanted():
        return None
    path = socket_path()
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(CONNECT_S)
    try:
        probe.connect(path)
    except OSError:  # no socket, nothing listening (a dead agent's leftover), or not this user's group
        return None
    finally:
        probe.close()
    return Link(path)
