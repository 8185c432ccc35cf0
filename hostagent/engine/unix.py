"""The Engine API over the local unix socket, in the standard library: the one client hostagent uses for a daemon on
this host (tcp, TLS and ssh go through the docker SDK), to follow a run, book and read events. Method names are
docker.APIClient's where the SDK has the call, so that the ledger's code reads either client. One connection per
call (`Connection: close`); attach hijacks it, multiplexed without a TTY (8-byte frame headers).
"""

from __future__ import annotations

import contextlib
import json
import socket

from gpupin.hostagent import http1
from gpupin.hostagent.engine.address import PODMAN_HEADER
from gpupin.hostagent.engine.failures import EngineError

_PODMAN = PODMAN_HEADER.lower()  # http1.Answer's header names are lower-case

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    from gpupin.core import JSONObject
    from gpupin.hostagent.engine.answer import DaemonAnswer

STDOUT, STDERR = 1, 2
DEFAULT_SOCKET = "/var/run/docker.sock"


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


class ExitWait:
    """`POST /containers/ID/wait` registered on the daemon (its answer's head read), its body still to come; `then`:
    a second wait whose end is waited for too, its answer not used."""

    def __init__(self, answer: http1.Answer, then: http1.Answer | None = None) -> None:
        self._answer = answer
        self._then = then

    def result(self) -> DaemonAnswer:
        """`{"StatusCode": N, "Error": ...}`, once the condition is met (no read timeout: it may take days)."""
        data = self._answer.json()
        if self._then is not None:
            with contextlib.suppress(Exception):  # the exit code is known; the removal is podman's own
                self._then.json()
        return data if isinstance(data, dict) else {}


class Events:
    """A streamed `GET /events`: decoded JSON objects until the daemon ends it or `close` cuts it (from any thread)."""

    def __init__(self, answer: http1.Answer) -> None:
        self._answer = answer

    def __iter__(self) -> Iterator[Any]:
        reader = self._answer.reader
        chunked = self._answer.headers.get("transfer-encoding", "").lower() == "chunked"
        pending = b""
        while True:
            if chunked:
                size = int(reader.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    return
                pending += reader.read(size)
                reader.readline()
            else:
                line = reader.readline()
                if not line:
                    return
                pending += line
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    yield json.loads(line)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._answer.sock.shutdown(socket.SHUT_RDWR)
        self._answer.close()


def _filters(filters: Mapping[str, Any] | None) -> str | None:
    """The SDK's convert_filters: each value a list of strings (a bool as true/false)."""
    if not filters:
        return None
    out = {}
    for key, value in filters.items():
        values = value if isinstance(value, list) else [value]
        out[key] = [str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    return json.dumps(out)


class UnixClient:
    """Calls to the daemon on `path` in API `version` (None: unversioned paths, the daemon's own version)."""

    def __init__(self, version: str | None, path: str = DEFAULT_SOCKET, timeout: float | None = 60.0) -> None:
        self.path = path
        self.api_version = version
        self.timeout = timeout
        self.podman: str | None = None  # the podman version, once an answer said the daemon is podman
        self.gpupin_server_version: str | None = None  # the daemon's own API version, when it was pinged

    # The names the rest of hostagent reads on either client (gpupin.hostagent.engine.podman, .daemon).
    @property
    def gpupin_podman(self) -> str | None:
        return self.podman

    @gpupin_podman.setter
    def gpupin_podman(self, value: str | None) -> None:
        self.podman = value

    @property
    def version(self) -> str:
        return self.api_version or ""

    def _dial(self, timeout: float | None) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        return sock

    def open(
        self,
        method: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = -1.0,
        headers: Mapping[str, str] | None = None,
        versioned: bool = True,
    ) -> http1.Answer:
        """One request; its answer with the body still to read. A refusal is EngineError, a broken way OSError."""
        prefix = f"/v{self.api_version}" if versioned and self.api_version else ""
        sock = self._dial(self.timeout if timeout == -1.0 else timeout)
        answer = http1.exchange(sock, method, http1.target(prefix + path, params), body, headers=headers)
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
        versioned: bool = True,
    ) -> Any:
        """The JSON answer (None when it has no body)."""
        return self.open(method, path, params, body, timeout, versioned=versioned).json()

    def read(
        self, path: str, params: Mapping[str, Any] | None = None, versioned: bool = True, timeout: float | None = None
    ) -> tuple[int, str | None, bytes]:
        """A GET whatever its status: its status, its Date header and its body (engine.reads.fetch reads them)."""
        prefix = f"/v{self.api_version}" if versioned and self.api_version else ""
        sock = self._dial(timeout if timeout is not None else self.timeout)
        answer = http1.exchange(sock, "GET", http1.target(prefix + path, params))
        self.podman = answer.headers.get(_PODMAN) or self.podman
        return answer.status, answer.headers.get("date"), answer.body()

    def close(self) -> None:
        """Nothing held between calls."""

    # --- a container's life: what `hostagent run` follows it with ---------------------------------------------------

    def start(self, cid: str) -> None:
        # No read timeout, as docker run has none: the NVIDIA hook runs inside the start, and on a card without
        # persistence mode (or a loaded host) it can take a minute; the lease is renewed meanwhile.
        self.call("POST", f"/containers/{cid}/start", timeout=None)

    def attach(self, cid: str, stdin: bool, tty: bool) -> Stream:
        params = {"stream": 1, "stdout": 1, "stderr": 1, "stdin": 1 if stdin else 0}
        answer = self.open(
            "POST",
            f"/containers/{cid}/attach",
            params,
            timeout=None,
            headers={"Connection": "Upgrade", "Upgrade": "tcp"},
        )
        return Stream(answer, tty)

    def wait(self, cid: str, condition: str) -> ExitWait:
        answer = self.open("POST", f"/containers/{cid}/wait", {"condition": condition}, timeout=None)
        if condition == "removed" and self.podman:
            # Podman's compatible wait for "removed" answers StatusCode 0 whatever the exit (4.3, measured): the exit
            # code comes from a wait for the exit, registered beside it before the start, as that one is.
            exited = self.open("POST", f"/containers/{cid}/wait", {"condition": "next-exit"}, timeout=None)
            return ExitWait(exited, then=answer)
        return ExitWait(answer)

    def kill(self, cid: str, signal: int | None = None) -> None:
        self.call("POST", f"/containers/{cid}/kill", {"signal": signal})

    def stop(self, cid: str, timeout: int | None = None) -> None:
        self.call("POST", f"/containers/{cid}/stop", {"t": timeout}, timeout=None)

    def resize(self, cid: str, height: int, width: int) -> None:
        self.call("POST", f"/containers/{cid}/resize", {"h": height, "w": width})

    def inspect(self, cid: str) -> DaemonAnswer:
        data: DaemonAnswer = self.call("GET", f"/containers/{cid}/json")
        return data

    def remove(self, cid: str, force: bool = False) -> None:
        self.remove_container(cid, force=force, v=True)

    # --- what booking makes and reads (docker.APIClient's names) -------------------------------------------------

    def info(self) -> DaemonAnswer:
        data: DaemonAnswer = self.call("GET", "/info")
        return data

    def containers(self, all: bool = False, filters: Mapping[str, Any] | None = None) -> list[DaemonAnswer]:
        data: list[DaemonAnswer] = self.call(
            "GET", "/containers/json", {"all": 1 if all else 0, "filters": _filters(filters)}
        )
        return data

    def inspect_container(self, cid: str) -> DaemonAnswer:
        return self.inspect(cid)

    def inspect_image(self, image: str) -> DaemonAnswer:
        data: DaemonAnswer = self.call("GET", f"/images/{image}/json")
        return data

    def create_container_from_config(
        self, config: Mapping[str, Any], name: str | None = None, platform: str | None = None
    ) -> DaemonAnswer:
        data: DaemonAnswer = self.call("POST", "/containers/create", {"name": name, "platform": platform}, config)
        return data

    def create_host_config(self, network_mode: str) -> JSONObject:
        return {"NetworkMode": network_mode}

    def create_container(
        self,
        image: str,
        entrypoint: list[str],
        name: str,
        labels: Mapping[str, str],
        host_config: Mapping[str, Any],
    ) -> DaemonAnswer:
        """A container of `image` that runs `entrypoint` (the ledger lock's: never started)."""
        config = {"Image": image, "Entrypoint": entrypoint, "Labels": dict(labels), "HostConfig": dict(host_config)}
        return self.create_container_from_config(config, name=name)

    def rename(self, cid: str, name: str) -> None:
        self.call("POST", f"/containers/{cid}/rename", {"name": name})

    def remove_container(self, cid: str, force: bool = False, v: bool = False) -> None:
        self.call("DELETE", f"/containers/{cid}", {"force": 1 if force else None, "v": 1 if v else None})

    def import_image_from_data(self, data: bytes, repository: str, tag: str) -> None:
        """An image from a tar archive's bytes (`docker import -`)."""
        answer = self.open("POST", "/images/create", {"fromSrc": "-", "repo": repository, "tag": tag}, data)
        answer.body()

    def create_volume(self, name: str, labels: Mapping[str, str]) -> DaemonAnswer:
        data: DaemonAnswer = self.call("POST", "/volumes/create", body={"Name": name, "Labels": dict(labels)})
        return data

    def remove_volume(self, name: str, force: bool = False) -> None:
        self.call("DELETE", f"/volumes/{name}", {"force": 1 if force else None})

    def events(self, decode: bool = True, filters: Mapping[str, Any] | None = None) -> Events:
        return Events(self.open("GET", "/events", {"filters": _filters(filters)}, timeout=None))

    def services(self) -> list[DaemonAnswer]:
        data: list[DaemonAnswer] = self.call("GET", "/services")
        return data

    def remove_service(self, sid: str) -> None:
        self.call("DELETE", f"/services/{sid}")
