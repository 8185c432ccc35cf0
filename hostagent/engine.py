"""The Docker Engine adapter: the docker SDK's low-level client, and its errors turned into hostagent's.

Containers are created, started and followed through the docker SDK. The SDK is imported lazily: with requests
under it, it costs 60 to 90 ms on a 2-core machine, more than `docker ps` takes to list 500 containers. So the
read-only ledger queries of `hostagent ls` (list, inspect) go through `EngineReader`, a few lines of the standard
library's http.client over the daemon's unix socket; other transports (tcp://, ssh://, TLS) fall back to the SDK.
The address is the SDK's: DOCKER_HOST, else the default socket.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from gpupin.hostagent.errors import (
    EX_CANNOT_INVOKE,
    EX_NOT_FOUND,
    DockerRefusedError,
    DockerUnavailableError,
)
from gpupin.hostagent.ledger import LABEL, Holder, foreign_holder, pinned_holder

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from gpupin.entrypoint.nvml import Card

DEFAULT_HOST = "unix:///var/run/docker.sock"


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or DEFAULT_HOST


# Device requests (--gpus) arrived in Engine API 1.40 (Docker 19.03).
MIN_API = "1.40"


def _unavailable(err: BaseException) -> DockerUnavailableError:
    return DockerUnavailableError(
        f"the Docker daemon at {docker_host()} does not answer: {_short(err)}",
        "start dockerd, or point DOCKER_HOST at a running one (`make sandbox-up` prints the sandbox's)",
    )


def connect(timeout: float | None = 60.0, version: str | None = None) -> Any:
    """A docker.APIClient talking to the daemon, or DockerUnavailableError (69) with the address and a hint.

    The API version is negotiated as the docker CLI does it, from `GET /_ping`'s API-Version header: the SDK's
    "auto" asks `GET /version`, which makes the daemon query containerd and runc and costs ~8 ms a call.
    """
    try:
        import docker
        from docker.constants import DEFAULT_DOCKER_API_VERSION
        from docker.errors import DockerException
        from docker.utils import version_lt
    except ImportError:
        raise DockerUnavailableError(
            "the docker SDK is not installed", "install the host side: pip install 'gpupin[host]'") from None
    try:
        api = docker.APIClient(base_url=docker_host(), version=version or MIN_API, timeout=timeout)
        if version is not None:
            return api
        ping = api.get(api.base_url + "/_ping", timeout=timeout)  # APIClient is a requests.Session
    except (DockerException, OSError) as err:
        raise _unavailable(err) from None
    except Exception as err:  # requests' connection errors
        raise _unavailable(err) from None
    server = ping.headers.get("Api-Version") or ""
    if ping.status_code != 200 or not server:
        raise DockerUnavailableError(f"the Docker daemon at {docker_host()} answered /_ping with "
                                     f"{ping.status_code} and no API version")
    if version_lt(server, MIN_API):
        raise DockerUnavailableError(f"the Docker daemon at {docker_host()} speaks API {server}; device requests "
                                     f"(--gpus) need {MIN_API} (Docker 19.03) or newer", "upgrade Docker")
    agreed = DEFAULT_DOCKER_API_VERSION if version_lt(DEFAULT_DOCKER_API_VERSION, server) else server
    return docker.APIClient(base_url=docker_host(), version=agreed, timeout=timeout)


def _short(err: BaseException) -> str:
    text = str(getattr(err, "explanation", None) or err)
    return text.strip().splitlines()[-1] if text.strip() else type(err).__name__


def refused(err: BaseException, doing: str) -> DockerRefusedError:
    """A daemon refusal, coded as `docker run` codes it: 127 command not found, 126 not runnable, else 125."""
    text = _short(err)
    code = 125
    low = text.lower()
    if "executable file not found" in low or ("no such file or directory" in low and "exec" in low):
        code = EX_NOT_FOUND
    elif "permission denied" in low and "exec" in low:
        code = EX_CANNOT_INVOKE
    hint = {EX_NOT_FOUND: "check the command's name (or --entrypoint), or give its full path",
            EX_CANNOT_INVOKE: "the command must be an executable file in the image"}.get(
        code, "fix what the daemon names above; `hostagent run --dry-run` prints the equivalent docker run line")
    return DockerRefusedError(f"{doing}: {text}", hint, code)


def is_api_error(err: BaseException) -> bool:
    try:
        from docker.errors import APIError
    except ImportError:
        return False
    return isinstance(err, APIError)


def is_sdk_error(err: BaseException) -> bool:
    try:
        from docker.errors import DockerException
    except ImportError:
        return False
    return isinstance(err, DockerException)


class EngineNotFound(Exception):
    """A 404 from EngineReader (the SDK raises docker.errors.NotFound)."""


def is_not_found(err: BaseException) -> bool:
    if isinstance(err, EngineNotFound):
        return True
    errors = sys.modules.get("docker.errors")  # never import the SDK just to classify an error
    return errors is not None and isinstance(err, errors.NotFound)


def _quote(text: str, safe: str = "") -> str:
    """Percent-encode for a URL (what urllib.parse.quote does, without its ~2 ms import)."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "-_.~" + safe) else
                   "".join(f"%{b:02X}" for b in c.encode()) for c in text)


class EngineReader:
    """Read-only Engine API calls over a unix socket, with the method names of docker.APIClient that the ledger
    uses (`containers`, `inspect_container`). Plain HTTP/1.0 on a socket: the daemon then closes the connection
    after an unchunked body, so no HTTP library (http.client alone costs ~15 ms to import) is needed.
    Unversioned paths: the daemon answers in its own API version."""

    def __init__(self, path: str, timeout: float | None = 60.0) -> None:
        self.path = path
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = _quote(path, "/") + ("?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in params.items())
                                   if params else "")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.path)
                sock.sendall(f"GET {url} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
                chunks = []
                while chunk := sock.recv(1 << 16):
                    chunks.append(chunk)
        except OSError as err:
            raise _unavailable(err) from None
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        status_line = head.split(b"\r\n", 1)[0].split()
        status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
        if status == 404:
            raise EngineNotFound(body.decode(errors="replace"))
        if status != 200:
            raise DockerUnavailableError(f"GET {path} on {docker_host()} answered {status or 'nonsense'}: "
                                         f"{body.decode(errors='replace').strip()[:200]}")
        return json.loads(body)

    def containers(self, all: bool = False, filters: dict[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"all": "1" if all else "0"}
        if filters:
            params["filters"] = json.dumps({k: [v] for k, v in filters.items()})
        result: list[dict[str, Any]] = self._get("/containers/json", params)
        return result

    def inspect_container(self, cid: str) -> dict[str, Any]:
        result: dict[str, Any] = self._get(f"/containers/{cid}/json")
        return result


def reader(timeout: float | None = 60.0) -> Any:
    """A client for ledger reads: EngineReader on a unix socket, else the SDK."""
    host = docker_host()
    if host.startswith("unix://"):
        return EngineReader(host[len("unix://"):], timeout)
    return connect(timeout)


def read_holders(api: Any, cards: Sequence[Card], include_foreign: bool = True) -> list[Holder]:
    """Every pinned container (any state) and every running container given GPUs by other means."""
    holders: list[Holder] = []
    for summary in api.containers(all=True, filters={"label": LABEL}):
        h = pinned_holder(summary)
        if h is not None:
            holders.append(h)
    if include_foreign:
        pinned_ids = {h.id for h in holders}
        # Device requests are not in the list summary: inspect the running containers that are not ours.
        for summary in api.containers():
            if summary["Id"] in pinned_ids:
                continue
            try:
                f = foreign_holder(api.inspect_container(summary["Id"]), cards)
            except Exception as err:
                if is_not_found(err):
                    continue  # it went away between the list and the inspect
                raise
            if f is not None:
                holders.append(f)
    return holders
