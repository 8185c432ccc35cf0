"""Reads from the daemon, with the daemon's clock. A plain unix socket is read without the SDK: the ledger's reads
(list, inspect) go through `EngineReader`, a few lines of the standard library; every other transport (tcp, TLS,
ssh) goes through the SDK's client."""

from __future__ import annotations

import json
import socket

from gpupin.core.errors import DockerUnavailableError
from gpupin.hostagent.engine.address import PODMAN_HEADER, docker_host, endpoint
from gpupin.hostagent.engine.client import connect
from gpupin.hostagent.engine.failures import LOG_HINT, EngineNotFound, unavailable

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def _quote(text: str, safe: str = "") -> str:
    """Percent-encode for a URL (what urllib.parse.quote does, without its ~2 ms import)."""
    return "".join(
        c if c.isascii() and (c.isalnum() or c in "-_.~" + safe) else "".join(f"%{b:02X}" for b in c.encode())
        for c in text
    )


def _query(path: str, params: Mapping[str, str] | None) -> str:
    return _quote(path, "/") + ("?" + "&".join(f"{_quote(k)}={_quote(v)}" for k, v in params.items()) if params else "")


def _decode(path: str, status: int, body: bytes) -> Any:
    if status == 404:
        raise EngineNotFound(body.decode(errors="replace"))
    if status != 200:
        raise DockerUnavailableError(
            f"GET {path} on {docker_host()} answered {status or 'nonsense'}: "
            f"{body.decode(errors='replace').strip()[:200]}",
            LOG_HINT,
        )
    try:
        return json.loads(body)
    except ValueError:
        raise DockerUnavailableError(
            f"GET {path} on {docker_host()}: the answer was cut off or is not JSON ({len(body)} bytes)",
            "retry; see the daemon's log if it persists",
        ) from None


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(text: str | None) -> float | None:
    """An HTTP Date header (`Mon, 30 Nov 2026 10:45:01 GMT`, what the daemon's Go server sends) in seconds."""
    import datetime

    try:
        _, day, month, year, clock, _zone = (text or "").split()
        h, m, s = (int(x) for x in clock.split(":"))
        when = datetime.datetime(int(year), _MONTHS.index(month) + 1, int(day), h, m, s, tzinfo=datetime.timezone.utc)
    except ValueError:
        return None
    return when.timestamp()


def created_time(text: str) -> float:
    """The Engine's RFC 3339 `Created` (nanoseconds, `Z` or an offset) in seconds since the epoch."""
    import datetime

    date, _, rest = text.partition("T")
    clock = rest[:8]
    frac = ""
    tail = rest[8:]
    if tail.startswith("."):
        digits = len(tail) - len(tail[1:].lstrip("0123456789"))
        frac, tail = tail[1:digits], tail[digits:]
    offset = 0
    if tail not in ("", "Z") and tail[0] in "+-":
        sign = -1 if tail[0] == "+" else 1
        offset = sign * (int(tail[1:3]) * 3600 + int(tail[4:6]) * 60)
    y, mo, d = (int(x) for x in date.split("-"))
    h, m, s = (int(x) for x in clock.split(":"))
    when = datetime.datetime(y, mo, d, h, m, s, tzinfo=datetime.timezone.utc).timestamp()
    return when + offset + (float("0." + frac) if frac else 0.0)


_LIBPOD = PODMAN_HEADER.lower() + ":"


class EngineReader:
    """Read-only Engine API calls over a unix socket, with the method names of docker.APIClient that the ledger
    uses (`containers`, `inspect_container`, `info`). Plain HTTP/1.0 on a socket: the daemon then closes the
    connection after an unchunked body, so no HTTP library (http.client alone costs ~15 ms to import) is needed.
    Unversioned paths: the daemon answers in its own API version."""

    def __init__(self, path: str, timeout: float | None = 60.0) -> None:
        self.path = path
        self.timeout = timeout
        self.gpupin_podman: str | None = None

    def get(
        self, path: str, params: Mapping[str, str] | None = None, timeout: float | None = None
    ) -> tuple[Any, float | None]:
        """The JSON answer and the daemon's clock (its Date header); `timeout` for this call alone."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout if timeout is not None else self.timeout)
                sock.connect(self.path)
                sock.sendall(f"GET {_query(path, params)} HTTP/1.0\r\nHost: docker\r\n\r\n".encode())
                chunks = []
                while chunk := sock.recv(1 << 16):
                    chunks.append(chunk)
        except OSError as err:
            raise unavailable(err) from None
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status_line = lines[0].split()
        status = int(status_line[1]) if len(status_line) > 1 and status_line[1].isdigit() else 0
        date = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln[:5].lower() == "date:"), None)
        # podman says its version on every answer (gpupin.hostagent.engine.podman)
        libpod = next((ln.split(":", 1)[1].strip() for ln in lines[1:] if ln.lower().startswith(_LIBPOD)), None)
        if libpod:
            self.gpupin_podman = libpod
        return _decode(path, status, body), http_date(date)

    def containers(self, all: bool = False, filters: dict[str, str] | None = None) -> list[dict[str, Any]]:
        params = {"all": "1" if all else "0"}
        if filters:
            params["filters"] = json.dumps({k: [v] for k, v in filters.items()})
        result: list[dict[str, Any]] = self.get("/containers/json", params)[0]
        return result

    def inspect_container(self, cid: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/containers/{cid}/json")[0]
        return result

    def info(self) -> dict[str, Any]:
        result: dict[str, Any] = self.get("/info")[0]
        return result


def fetch(
    api: Any, path: str, params: Mapping[str, str] | None = None, versioned: bool = True, timeout: float | None = None
) -> tuple[Any, float | None]:
    """GET an Engine path through either client: (JSON, the daemon's clock); 404 is EngineNotFound, any other
    failure a one-line DockerUnavailableError. `versioned=False` asks in the daemon's own API version (EngineReader
    always does), so that fields newer than the client's version are there too. `timeout`: for this call alone
    (else the client's)."""
    if isinstance(api, EngineReader):
        return api.get(path, params, timeout)
    prefix = f"/v{api.api_version}" if versioned else ""
    try:
        res = api.get(
            f"{api.base_url}{prefix}{_query(path, None)}",
            params=dict(params or {}),
            timeout=timeout if timeout is not None else api.timeout,
        )
        body = res.content
    except Exception as err:
        raise unavailable(err) from None
    if res.headers.get(PODMAN_HEADER):  # podman says its version on every answer
        api.gpupin_podman = res.headers[PODMAN_HEADER]
    return _decode(path, res.status_code, body), http_date(res.headers.get("Date"))


def reader(timeout: float | None = 60.0) -> Any:
    """A client for ledger reads: EngineReader on a unix socket, else the SDK."""
    path = endpoint().unix_path
    return EngineReader(path, timeout) if path is not None else connect(timeout)
