"""Following a created container through the docker SDK, for a daemon reached over tcp, TLS or ssh: the same calls as
the unix socket's client (gpupin.hostagent.engine.unix: start, attach, wait, kill, stop, resize, inspect, remove),
so that gpupin.hostagent.run.start follows a container the same way whichever transport reaches it."""

from __future__ import annotations

import contextlib
import socket

from gpupin.hostagent.engine.unix import STDERR, STDOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

    from gpupin.hostagent.engine.answer import DaemonAnswer


class SdkStream:
    """The attach socket the SDK hijacked: the container's output, and its input."""

    def __init__(self, sock: Any, tty: bool) -> None:
        self._sock = sock
        self.tty = tty

    def _raw(self) -> socket.socket:
        raw: socket.socket = getattr(self._sock, "_sock", self._sock)  # the SDK hands a SocketIO over plain http
        return raw

    def frames(self) -> Iterator[tuple[int, bytes]]:
        from docker.utils.socket import frames_iter

        for stream, data in frames_iter(self._sock, self.tty):
            if data:
                yield (STDERR if stream == STDERR else STDOUT), data

    def send(self, data: bytes) -> None:
        from docker.utils.socket import write

        write(self._sock, data)

    def close_input(self) -> None:
        self._raw().shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


class SdkExitWait:
    """A wait registered on the daemon (its answer's head read), its body still to come."""

    def __init__(self, api: Any, answer: Any) -> None:
        self._api = api
        self._answer = answer

    def result(self) -> DaemonAnswer:
        self._api._raise_for_status(self._answer)
        data = self._answer.json()
        return data if isinstance(data, dict) else {}


class SdkFollower:
    """A container's life through docker.APIClient `api`."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.version = str(api.api_version)

    @property
    def podman(self) -> str | None:
        return getattr(self.api, "gpupin_podman", None)

    def start(self, cid: str) -> None:
        self.api.start(cid)

    def attach(self, cid: str, stdin: bool, tty: bool) -> SdkStream:
        params = {"stdin": 1 if stdin else 0, "stdout": 1, "stderr": 1, "stream": 1}
        return SdkStream(self.api.attach_socket(cid, params=params), tty)

    def wait(self, cid: str, condition: str) -> SdkExitWait:
        # stream=True: the answer comes back once its head is read, the wait registered before the start.
        url = self.api._url("/containers/{0}/wait", cid)
        answer = self.api._post(url, params={"condition": condition}, timeout=None, stream=True)
        return SdkExitWait(self.api, answer)

    def kill(self, cid: str, signal: int | None = None) -> None:
        self.api.kill(cid, signal=signal)

    def stop(self, cid: str, timeout: int | None = None) -> None:
        self.api.stop(cid, timeout=timeout)

    def resize(self, cid: str, height: int, width: int) -> None:
        self.api.resize(cid, height=height, width=width)

    def inspect(self, cid: str) -> DaemonAnswer:
        data: DaemonAnswer = self.api.inspect_container(cid)
        return data

    def remove(self, cid: str, force: bool = False) -> None:
        self.api.remove_container(cid, force=force, v=True)
